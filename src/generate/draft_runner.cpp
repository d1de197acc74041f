// DraftRunner: the draft model's side of speculative decoding.
#include "generate/draft_runner.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <string>
#include <utility>

#include "cpu/vec_math.h"
#include "error.h"
#include "model/model.h"

namespace tandem {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

DraftRunner::DraftRunner(const DraftModel& draft, const GenerationParams& params, int base, std::span<const int> held,
                         int cached)
    : draft_(draft),
      sp_(params.speculative),
      sampler_params_(params.sampler),
      proposal_use_(params.speculative.sampling == SpecSampling::Coupled ? NoiseUse::Token : NoiseUse::Proposal),
      chunk_(std::max(1, params.chunk)),
      vocab_(draft.model->config.n_vocab),
      k_cap_(std::max(0, sp_.draft_max)),
      greedy_(params.sampler.temperature <= 0.0f),
      constraint_(params.constraint),
      picks_only_(greedy_ && argmax_is_enough(params.sampler) && !params.whole_rows && !constraint_),
      restrict_(sp_.draft_vocab > 0 && sp_.draft_vocab < vocab_),
      base_(base),
      held_(held),
      sampler_(sampler_params_, std::max(1, vocab_)),
      logits_(static_cast<size_t>(std::max(1, vocab_))),
      scratch_(logits_.size()),
      candidates_(params.whole_rows || constraint_),
      extra_seen_(restrict_ ? static_cast<size_t>(vocab_ - sp_.draft_vocab) : 0),
      ahead_q_(static_cast<size_t>(k_cap_) + 1),
      carried_q_(static_cast<size_t>(k_cap_) + 1) {
    fed_ = std::min(draft_.cache->n_committed(), base_ + std::max(0, cached));
    if (fed_ < base_ && static_cast<int>(held_.size()) < base_)
        throw Error("internal: the draft's cache holds fewer tokens than the target's, and they were not given");
    draft_.cache->truncate(fed_);
    // Restricted to the first draft_vocab ids and the ids of the context (held, prompt and what was generated): code
    // that the answer repeats from the prompt stays draftable. Set here (or an earlier generation's lifted), then
    // widened before each proposal whenever the context brought new ids.
    draft_.backend->restrict_logits(restrict_ ? sp_.draft_vocab : vocab_, {});
}

double DraftRunner::bytes_per_step(const Model& draft, const SpeculativeParams& sp) {
    const int vocab = draft.config.n_vocab;
    double bytes = static_cast<double>(draft.weights.bytes_per_token());
    if (sp.draft_vocab > 0 && sp.draft_vocab < vocab)  // the output rows it will not read
        bytes -=
            static_cast<double>(draft.weights.output.n_bytes()) * (1.0 - static_cast<double>(sp.draft_vocab) / vocab);
    return bytes;
}

bool DraftRunner::drafts_ahead_of(const Backend& target) const {
    return sp_.draft_ahead > 0 || (sp_.draft_ahead < 0 && target.computes_in_background());
}

void DraftRunner::update_vocabulary(const std::vector<int>& history) {
    if (!restrict_) return;
    const int end = base_ + static_cast<int>(history.size());
    bool added = false;
    for (; scanned_ < end; ++scanned_) {
        const int id = scanned_ < base_ && scanned_ >= static_cast<int>(held_.size())
                           ? -1  // not given (the draft's cache already holds it)
                           : token_at(scanned_, history);
        if (id < sp_.draft_vocab || id >= vocab_ || extra_seen_[static_cast<size_t>(id - sp_.draft_vocab)]) continue;
        extra_seen_[static_cast<size_t>(id - sp_.draft_vocab)] = 1;
        extra_ids_.push_back(id);
        added = true;
    }
    if (added) draft_.backend->restrict_logits(sp_.draft_vocab, extra_ids_);
}

// The row after `tokens`, which the sampler will read with context_: as candidates where sampled drafting reads only
// those, as the greedy pick and its confidence where that is all greedy drafting reads, else whole (greedy under a
// penalty reads the penalised pick and the whole row's softmax).
void DraftRunner::forward(std::span<const int> tokens) {
    if (picks_only_) {
        draft_.backend->forward_argmax_confidence(tokens, *draft_.cache, 1, &pick_, &confidence_, logits_);
        return;
    }
    as_candidates_ = !greedy_ && candidates_.plan(sampler_params_, vocab_, *draft_.backend,
                                                  penalty_window(sampler_params_, context_, {}, window_buffer_));
    if (as_candidates_)
        candidates_.forward(*draft_.backend, tokens, *draft_.cache, 1, logits_);
    else
        draft_.backend->forward(tokens, *draft_.cache, 1, logits_.data());
}

void DraftRunner::follow_grammar(std::span<const int> tokens) {
    if (!constraint_) return;
    grammar_.emplace(*constraint_);
    for (const int t : tokens) grammar_->accept(t);
}

int DraftRunner::read_last(SparseDistribution& q, float& top) {
    if (grammar_) {
        // The restricted vocabulary's other logits are -inf: what the grammar allows may all be among them.
        if (!grammar_->try_mask(logits_.data(), vocab_) ||
            *std::max_element(logits_.begin(), logits_.end()) == -std::numeric_limits<float>::infinity())
            return -1;
    }
    if (picks_only_) {
        top = confidence_;
        return greedy_pick(pick_);
    }
    if (greedy_) {
        // Greedy verification never reads q (the target's argmax decides), so the greedy draft only needs its token
        // and a confidence: its own top probability under a plain softmax, 1 / sum(exp(l - max)), in float SIMD.
        // (Every O(vocab) pass here costs ~1% of a 0.5B draft step at 151,936 ids.)
        const int d = sampler_.sample(logits_.data(), context_, next_position());
        const float mx = *std::max_element(logits_.begin(), logits_.end());
        std::copy(logits_.begin(), logits_.end(), scratch_.begin());
        top = 1.0f / cpu::exp_shifted_sum(scratch_.data(), vocab_, mx);
        return d;
    }
    if (as_candidates_)
        sampler_.distribution(candidates_.row(0), context_, q);
    else
        sampler_.distribution(logits_.data(), context_, q);
    if (proposal_use_ == NoiseUse::Token) {
        // Coupled: the draft is accepted iff the target's perturbed scores log p + g have their maximum where the
        // draft's log q + g have theirs, which is greedy decoding of the perturbed distributions. So the confidence
        // the p_min rule reads is the greedy one of the perturbed q: its pick's share of it.
        double share = 0;
        const int d = gumbel_max(q, sampler_.noise(), next_position(), NoiseUse::Token, &share);
        top = static_cast<float>(share);
        return d;
    }
    // Rejection: accepted with probability sum min(p, q), which q's own top probability bounds from below when p
    // resembles q.
    top = q.probs.empty() ? 0.0f : *std::max_element(q.probs.begin(), q.probs.end());
    return gumbel_max(q, sampler_.noise(), next_position(), NoiseUse::Proposal);
}

DraftRunner::Proposal DraftRunner::propose(int k, const std::vector<int>& history, std::vector<int>& drafted,
                                           std::vector<SparseDistribution>& q, SpeculativeStats& st) {
    Proposal r;
    Clock::time_point t0 = Clock::now();
    update_vocabulary(history);
    context_ = history;
    follow_grammar({});
    int i0 = 0;
    bool done = false;
    if (!carried_.empty()) {
        // Drafted ahead during the last verification, which accepted every draft and added the draft's guess (cur,
        // history's last token, at position base + history.size() - 1): the draft's cache holds cur and what followed
        // it. Proposed as they are; the draft goes on from the last one where p_min did not stop it there.
        const int t = std::min(k, static_cast<int>(carried_.size()));
        for (int j = 0; j < t; ++j) {
            drafted.push_back(carried_[static_cast<size_t>(j)]);
            context_.push_back(carried_[static_cast<size_t>(j)]);
            // Drafted ahead from the state after the drafts and the guess, which is the constraint's now.
            if (grammar_) grammar_->accept(carried_[static_cast<size_t>(j)]);
            if (!greedy_) std::swap(q[static_cast<size_t>(j)], carried_q_[static_cast<size_t>(j)]);
        }
        st.ahead_used += t;
        // cur and drafted[0..t-2]: the last is not read yet
        draft_.cache->truncate(base_ + static_cast<int>(history.size()) - 1 + t);
        done = t == k || carried_stopped_;
        carried_.clear();
        if (!done) {
            forward(std::span<const int>(&drafted.back(), 1));
            ++r.steps;
        }
        i0 = t;
    } else {
        // Catch up on everything not read yet: cur, after a full acceptance the last draft, and in the first drafting
        // round (or after a stretch of plain decoding) the prompt and what followed, in prefill chunks. A long
        // catch-up is not a draft step: its time is left out of the per-step cost.
        pending_.clear();
        for (int p = fed_; p < base_ + static_cast<int>(history.size()); ++p) pending_.push_back(token_at(p, history));
        const size_t n_pending = pending_.size();
        const size_t chunk = static_cast<size_t>(chunk_);
        for (size_t b = 0; b < n_pending; b += chunk) {
            const size_t n = std::min(n_pending - b, chunk);
            if (b + n == n_pending)
                forward(std::span<const int>(pending_.data() + b, n));
            else
                draft_.backend->forward(std::span<const int>(pending_.data() + b, n), *draft_.cache, 0, nullptr);
        }
        r.steps = 1;  // the forward of cur (or the catch-up standing in for it) gave drafted[0]'s logits
        r.caught_up = n_pending > 2;
        if (r.caught_up) {
            r.catch_up_seconds = since(t0);
            st.draft_s += r.catch_up_seconds;
            t0 = Clock::now();
        }
    }
    for (int i = i0; i < k && !done; ++i) {
        float top;
        const int d = read_last(q[static_cast<size_t>(i)], top);
        if (d < 0 || (top < sp_.p_min && i > 0)) {
            r.holds_last = true;
            break;
        }
        drafted.push_back(d);
        context_.push_back(d);
        if (grammar_) grammar_->accept(d);
        if (i + 1 < k) {
            forward(std::span<const int>(&d, 1));
            ++r.steps;
        }
    }
    fed_ = draft_.cache->n_committed();
    r.step_seconds = since(t0);
    st.draft_s += r.step_seconds;
    // A round after a long catch-up, or one whose proposals were all drafted ahead, measures no draft step.
    if (r.caught_up || r.steps == 0) r.step_seconds = 0;
    return r;
}

void DraftRunner::draft_ahead(const std::vector<int>& history, std::span<const int> drafted, bool holds_last,
                              int tokens_left, const std::function<bool()>& target_done, SpeculativeStats& st) {
    ahead_ids_.clear();
    ahead_stopped_ = false;
    const bool defers = draft_.backend->computes_in_background();
    const int room = draft_.cache->capacity() - draft_.cache->n_committed() + (holds_last ? 1 : 0);
    const int limit =
        std::min({sp_.draft_ahead > 0 ? sp_.draft_ahead : k_cap_ + 1, k_cap_ + 1, room, std::max(0, tokens_left)});
    context_ = history;
    context_.insert(context_.end(), drafted.begin(), drafted.end());
    follow_grammar(drafted);
    bool have_output = holds_last;  // the last forward read drafted.back()
    int last = drafted.back();
    for (int j = 0; j < limit; ++j) {
        if (target_done() && sp_.draft_ahead < 0) break;  // auto: only while the target works
        if (!have_output) {
            DeferredOutputs step(defers ? draft_.backend : nullptr);
            forward(std::span<const int>(&last, 1));
            while (!step.ready()) target_done();
            step.collect();
            ++st.ahead_steps;
        }
        have_output = false;
        SparseDistribution& q = ahead_q_[static_cast<size_t>(j)];
        float top;
        const int e = read_last(q, top);
        // ahead_ids_[j] would be the next round's draft j - 1, which the p_min rule stops from the second on.
        if (e < 0 || (j >= 2 && top < sp_.p_min)) {
            ahead_stopped_ = true;
            break;
        }
        ahead_ids_.push_back(e);
        context_.push_back(e);
        if (grammar_) grammar_->accept(e);
        last = e;
    }
}

void DraftRunner::settle(int keep, bool all_accepted, int next_token) {
    // The draft's cache holds the history, the drafts it read and what it drafted ahead. The guess (ahead_ids_[0])
    // sits at `keep` in it when it was right, followed by the rest; worth keeping when there is a rest.
    const bool as_guessed = all_accepted && ahead_ids_.size() >= 2 && next_token == ahead_ids_[0];
    if (as_guessed) {
        carried_.assign(ahead_ids_.begin() + 1, ahead_ids_.end());
        if (!greedy_)
            for (size_t j = 0; j < carried_.size(); ++j) std::swap(carried_q_[j], ahead_q_[j + 1]);
        carried_stopped_ = ahead_stopped_;
    } else {
        draft_.cache->truncate(keep);
    }
    fed_ = draft_.cache->n_committed();
    last_ahead_ = ahead_ids_.size();
    ahead_ids_.clear();
    ahead_stopped_ = false;
}

void DraftRunner::drop_carried(int committed) {
    if (carried_.empty()) return;
    carried_.clear();
    draft_.cache->truncate(committed + 1);
    fed_ = draft_.cache->n_committed();
}

}  // namespace tandem
