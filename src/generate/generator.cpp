// Generator (the plain and the speculative decode loop; the draft's side is DraftRunner's) and StopStringFilter.
#include "generate/generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <utility>

#include "backend.h"
#include "error.h"
#include "generate/decode_rows.h"
#include "generate/draft_runner.h"
#include "generate/token_output.h"
#include "grammar/constraint.h"
#include "model/model.h"

namespace tandem {

const char* stop_reason_name(StopReason reason) {
    switch (reason) {
        case StopReason::Eos: return "eos";
        case StopReason::Length: return "length";
        case StopReason::StopString: return "stop string";
        case StopReason::ContextFull: return "context full";
        case StopReason::OutputClosed: return "output closed";
    }
    return "?";
}

StopStringFilter::StopStringFilter(std::vector<std::string> stops) : stops_(std::move(stops)) {
    std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string StopStringFilter::push(std::string_view text) {
    if (stopped_) return {};
    pending_.append(text);
    // Earliest complete stop string wins.
    size_t cut = std::string::npos;
    for (const std::string& s : stops_) cut = std::min(cut, pending_.find(s));
    if (cut != std::string::npos) {
        stopped_ = true;
        std::string out = pending_.substr(0, cut);
        pending_.clear();
        return out;
    }
    // Keep the longest suffix that is a proper prefix of some stop string; release the rest.
    size_t keep = 0;
    for (const std::string& s : stops_)
        for (size_t len = std::min(s.size() - 1, pending_.size()); len > keep; --len)
            if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
                keep = len;
                break;
            }
    std::string out = pending_.substr(0, pending_.size() - keep);
    pending_.erase(0, pending_.size() - keep);
    return out;
}

std::string StopStringFilter::flush() {
    std::string out = stopped_ ? std::string() : pending_;
    pending_.clear();
    return out;
}

namespace {

// The target's side of a speculative round: one forward over cur and the drafts, its rows read as verification
// needs them (pure greedy: the argmax ids; else candidates where the sampler reads only those, else whole rows; under
// a grammar always whole rows, which it masks), and the verdict on the drafts.
class Verification {
public:
    Verification(const GenerationParams& params, int n_vocab, int k_cap)
        : sampler_(params.sampler),
          greedy_(params.sampler.temperature <= 0.0f),
          rejection_(!greedy_ && params.speculative.sampling == SpecSampling::Rejection),
          ids_only_(greedy_ && argmax_is_enough(params.sampler) && !params.constraint),
          n_vocab_(n_vocab),
          logits_((static_cast<size_t>(k_cap) + 1) * static_cast<size_t>(n_vocab)),
          ids_(static_cast<size_t>(k_cap) + 1),
          candidates_(params.whole_rows || params.constraint),
          p_dists_(static_cast<size_t>(k_cap) + 1) {}

    // Runs (or queues, under deferred outputs) the target over cur + `drafted`, which follow `history`.
    void forward(Backend& backend, KvCache& cache, const std::vector<int>& history, int cur,
                 std::span<const int> drafted) {
        batch_.assign(1, cur);
        batch_.insert(batch_.end(), drafted.begin(), drafted.end());
        const int n_rows = static_cast<int>(batch_.size());
        const std::span<float> rows(logits_.data(), static_cast<size_t>(n_rows) * static_cast<size_t>(n_vocab_));
        as_candidates_ = !ids_only_ && candidates_.plan(sampler_, n_vocab_, backend,
                                                        penalty_window(sampler_, history, drafted, window_buffer_));
        if (ids_only_)
            backend.forward_argmax(batch_, cache, n_rows, ids_.data(), rows);
        else if (as_candidates_)
            candidates_.forward(backend, batch_, cache, n_rows, rows);
        else
            backend.forward(batch_, cache, n_rows, logits_.data());
    }

    // The verdict on `drafted` (the forward's, its outputs delivered; drafted[i] at context position `position` + i),
    // drawn from with `q` under rejection sampling: greedy and coupled sampling accept while the target's own pick
    // (penalties see the drafts before it) is the draft, rejection sampling runs verify_proposal. No drafts: the
    // target's token, exactly the plain step. Under `constraint` (its state after `history`; drafts it allows, as
    // proposals under it are) row i is masked with the state after drafted[0..i-1], as plain decoding would mask it:
    // p is the masked distribution, and q, the draft's, was masked alike.
    Verdict judge(std::span<const int> drafted, std::span<const SparseDistribution> q, const std::vector<int>& history,
                  int64_t position, Sampler& sampler, const grammar::TokenConstraint* constraint) {
        const int n_drafted = static_cast<int>(drafted.size());
        Verdict verdict;
        // A copy, advanced along the drafts; the loop keeps the original.
        std::optional<grammar::TokenConstraint> state;
        if (constraint) state.emplace(*constraint);
        const auto mask = [&](int i) {
            if (state) state->mask(row(i), n_vocab_);
        };
        if (n_drafted == 0) {
            mask(0);
            verdict.next_token = ids_only_ ? greedy_pick(ids_[0]) : sample(0, history, position, sampler);
            return verdict;
        }
        context_ = history;
        if (!rejection_) {  // verify_proposal's greedy and coupled rule without building the target's distributions
            for (int i = 0; i <= n_drafted; ++i) {
                mask(i);
                const int choice =
                    ids_only_ ? greedy_pick(ids_[static_cast<size_t>(i)]) : sample(i, context_, position + i, sampler);
                if (i == n_drafted || choice != drafted[static_cast<size_t>(i)]) {
                    verdict.next_token = choice;
                    break;
                }
                ++verdict.n_accepted;
                context_.push_back(choice);
                if (state) state->accept(choice);
            }
            return verdict;
        }
        for (int i = 0; i <= n_drafted; ++i) {
            SparseDistribution& p = p_dists_[static_cast<size_t>(i)];
            mask(i);
            if (as_candidates_)
                sampler.distribution(candidates_.row(i), context_, p);
            else
                sampler.distribution(row(i), context_, p);
            if (i < n_drafted) {
                context_.push_back(drafted[static_cast<size_t>(i)]);
                if (state) state->accept(drafted[static_cast<size_t>(i)]);
            }
        }
        return verify_proposal(drafted, std::span<const SparseDistribution>(p_dists_).first(drafted.size() + 1),
                               q.first(drafted.size()), greedy_, SpecSampling::Rejection, sampler.noise(), position);
    }

private:
    const float* row(int i) const { return &logits_[static_cast<size_t>(i) * static_cast<size_t>(n_vocab_)]; }
    float* row(int i) { return &logits_[static_cast<size_t>(i) * static_cast<size_t>(n_vocab_)]; }
    int sample(int i, std::span<const int> history, int64_t position, Sampler& sampler) const {
        return as_candidates_ ? sampler.sample(candidates_.row(i), history, position)
                              : sampler.sample(row(i), history, position);
    }

    const SamplerParams sampler_;
    const bool greedy_, rejection_, ids_only_;
    const int n_vocab_;
    std::vector<float> logits_;
    std::vector<int> ids_, batch_, context_, window_buffer_;
    CandidateRows candidates_;
    bool as_candidates_ = false;
    std::vector<SparseDistribution> p_dists_;  // the target's distributions (sampled verification)
};

// The draft-length controller of one generation, with its prior (DraftLengthController::set_cost_prior): a draft
// step's share of a target step (the weight bytes), the prefill's cost per token (only from a prompt long enough
// for the per-token part to dominate: what each further verified token adds to a target forward), the draft's own
// prefill of the prompt (the same work at the weight-bytes ratio) and the tokens still wanted.
DraftLengthController make_controller(const SpeculativeParams& sp, const Model& target, const Model* draft,
                                      bool ahead_auto, const GenerationStats& stats, int tokens_wanted,
                                      int draft_lacks) {
    DraftLengthController controller(sp.draft_min, sp.draft_max);
    controller.set_free_drafts(draft == nullptr);
    // It counts on drafting ahead where that runs by itself (auto, a target that computes in the background); forced
    // steps (tests, benchmarks) leave its model as without.
    controller.set_draft_ahead(ahead_auto);
    // Only the tokens prefilled were timed (not those the prompt cache loaded); the draft reads `draft_lacks` of the
    // prompt's tokens (all of them, less what the prompt cache loaded into its own cache).
    const int prefilled = stats.n_prompt - stats.n_cached;
    const double prefill_token_s = prefilled >= 32 ? stats.prefill_s / prefilled : 0.0;
    const double ratio = draft ? DraftRunner::bytes_per_step(*draft, sp) /
                                     static_cast<double>(std::max<uint64_t>(1, target.weights.bytes_per_token()))
                               : 0.0;
    const double draft_prefill_s =
        stats.n_cached == 0 ? ratio * stats.prefill_s
                            : ratio * stats.prefill_s / std::max(1, prefilled) * static_cast<double>(draft_lacks);
    controller.set_cost_prior(ratio, prefill_token_s, draft_prefill_s, static_cast<double>(tokens_wanted));
    return controller;
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// One round of the speculative loop: what was proposed, by whom, and the target's verdict.
struct Round {
    int k = 0;                       // the draft length chosen (0: a plain step)
    bool from_lookup = false;        // prompt lookup proposes
    bool draft_round = false;        // the draft model proposes
    LookupProposal looked;           // the lookup's match (when lookup is on)
    std::vector<int> drafted;        // the proposal: at most k tokens
    DraftRunner::Proposal proposal;  // the draft's steps and their time (none in lookup and plain rounds)
    Clock::time_point start;         // after the length was chosen
    double verify_seconds = 0;       // the target's forward, until its outputs were first seen ready
    Verdict verdict;
    int n_drafted() const { return static_cast<int>(drafted.size()); }
};

// The round's length and source: prompt lookup first, where its match promises more than plain decoding (or the
// draft); else the draft; k = 0 is a plain step. At most k_limit tokens.
Round plan_round(const SpeculativeParams& sp, DraftLengthController& controller, LookupProposer& lookup,
                 const std::vector<int>& history, int k_limit, bool have_draft) {
    Round r;
    if (sp.lookup) {
        r.looked = lookup.propose(history, k_limit);
        r.k = controller.choose_lookup(r.looked.match_len, static_cast<int>(r.looked.tokens.size()), k_limit);
    }
    r.from_lookup = r.k > 0;
    if (!r.from_lookup && have_draft) r.k = controller.choose(k_limit);
    r.draft_round = r.k > 0 && !r.from_lookup && have_draft;
    return r;
}

// Waits, once, for both models' repacked weights. Verifying several tokens, and the draft's catch-up on the prompt,
// are compute-bound and cheaper on the CPU backend's repacked weights (the 1.5B verifying 4 tokens: 1.4x a plain
// step against 1.7x in the file's layout), which plain decoding, bound by memory bandwidth, does without; and the
// background copies, at idle priority, make no progress while decoding keeps both cores busy. So the first drafting
// round waits for them, outside every timing the controller learns from. (1.5B + 0.5B draft, 128 tokens, 5 runs:
// 31.6 tokens/s median against 26.1 without the wait; it lasted 0-0.9 s.)
void wait_for_layouts(Backend& target, std::optional<DraftRunner>& draft, bool trace) {
    const Clock::time_point t0 = Clock::now();
    target.wait_for_repacking();
    const double target_wait = seconds_since(t0);
    if (draft) draft->backend().wait_for_repacking();
    if (trace)
        std::fprintf(stderr, "speculative: waited %.1f ms for repacked weights (target %.1f ms)\n",
                     seconds_since(t0) * 1e3, target_wait * 1e3);
}

// Fills r.drafted: the draft model's k tokens (their distributions in q), or the lookup's (q one-hot: a
// deterministic proposal, for rejection sampling), or none. Under `constraint` (its state after `history`) the draft
// proposes under it, and a lookup proposal is cut before the first token it does not allow.
void propose(Round& r, std::optional<DraftRunner>& draft, const std::vector<int>& history,
             std::vector<SparseDistribution>& q, bool rejection, const grammar::TokenConstraint* constraint,
             SpeculativeStats& st) {
    if (r.draft_round) {
        r.proposal = draft->propose(r.k, history, r.drafted, q, st);
    } else if (r.from_lookup) {
        r.drafted.assign(r.looked.tokens.begin(), r.looked.tokens.begin() + r.k);
        if (constraint) {
            grammar::TokenConstraint state = *constraint;
            for (size_t i = 0; i < r.drafted.size(); ++i) {
                if (!state.allows(r.drafted[i])) {
                    r.drafted.resize(i);
                    break;
                }
                state.accept(r.drafted[i]);
            }
        }
        if (rejection)
            for (size_t i = 0; i < r.drafted.size(); ++i) q[i].assign_one(r.drafted[i]);
    }
}

// The target's forward over cur + r.drafted (r.verify_seconds), while the draft drafts ahead where it may.
void verify(Round& r, int cur, Backend& target, KvCache& cache, Verification& verification,
            std::optional<DraftRunner>& draft, const std::vector<int>& history, int remaining, SpeculativeStats& st) {
    const Clock::time_point t0 = Clock::now();
    const bool ahead = r.draft_round && !r.drafted.empty() && draft->drafts_ahead_of(target);
    DeferredOutputs deferred(ahead ? &target : nullptr);
    verification.forward(target, cache, history, cur, r.drafted);
    r.verify_seconds = -1;  // from the start until the outputs were first seen ready
    if (ahead) {
        auto target_done = [&] {
            if (r.verify_seconds < 0 && deferred.ready()) r.verify_seconds = seconds_since(t0);
            return r.verify_seconds >= 0;
        };
        draft->draft_ahead(history, r.drafted, r.proposal.holds_last, remaining - r.n_drafted() - 1, target_done, st);
        deferred.collect();
    }
    if (r.verify_seconds < 0) r.verify_seconds = seconds_since(t0);
}

// The loop's bookkeeping: what each round adds to the statistics and teaches the draft-length controller (and
// prompt lookup), and the --spec-trace line. Apart from the loop, so that it reads as propose → verify → commit and
// what the controller learns from stands in one place.
class RoundLedger {
public:
    RoundLedger(DraftLengthController& controller, LookupProposer& lookup, GenerationStats& stats, bool trace)
        : controller_(controller), lookup_(lookup), stats_(stats), trace_(trace) {}

    // After the verdict: the verification's cost, and the round's drafted and accepted tokens.
    void verified(const Round& r) {
        SpeculativeStats& st = stats_.spec;
        st.verify_s += r.verify_seconds;
        controller_.record_verify(r.n_drafted() + 1, r.verify_seconds);
        ++st.rounds;
        ++stats_.n_decode_forwards;
        if (r.n_drafted() == 0) {
            ++st.plain_steps;
            return;
        }
        st.drafted += r.n_drafted();
        st.accepted += r.verdict.n_accepted;
        ++st.accepted_hist[static_cast<size_t>(std::min(r.verdict.n_accepted, 64))];
        if (r.from_lookup) {
            controller_.record_lookup(r.looked.match_len, r.n_drafted(), r.verdict.n_accepted);
            lookup_.follow(r.looked, r.verdict.n_accepted);
        } else {
            controller_.record_round(r.n_drafted(), r.verdict.n_accepted, r.proposal.step_seconds, r.proposal.steps);
        }
    }

    // After both caches are cut back: the round's throughput. A round that began with a long catch-up (the first
    // drafting round, a probe after plain rounds) counts as the round it would have been without: less the catch-up,
    // plus the one draft step that it stood in for. Left out, the rounds after a stretch of plain decoding could never
    // outweigh the drafting rounds before it. A lookup round beside a draft model took no draft steps: it says
    // nothing of what the draft's rounds cost.
    void committed(const Round& r, const DraftRunner* draft) {
        const double elapsed = seconds_since(r.start);
        double round_seconds = elapsed;
        if (r.proposal.caught_up) round_seconds += controller_.draft_step_seconds() - r.proposal.catch_up_seconds;
        if ((!r.proposal.caught_up || controller_.draft_step_seconds() > 0) && !(r.from_lookup && draft))
            controller_.record_throughput(r.n_drafted(), r.verdict.n_accepted + 1, round_seconds, r.proposal.steps);
        // --spec-trace (SpeculativeParams::trace).
        if (trace_)
            std::fprintf(stderr,
                         "round k=%d drafted=%d lookup=%d acc=%d draft=%.1fms verify=%.1fms round=%.1fms catch=%d "
                         "alpha=%.2f steps=%d ahead=%zu carried=%zu\n",
                         r.k, r.n_drafted(), r.from_lookup ? r.looked.match_len : 0, r.verdict.n_accepted,
                         r.proposal.step_seconds * 1e3, r.verify_seconds * 1e3, elapsed * 1e3,
                         r.proposal.caught_up ? 1 : 0, controller_.acceptance(), r.proposal.steps,
                         draft ? draft->ahead_count() : 0, draft ? draft->carried() : 0);
    }

private:
    DraftLengthController& controller_;
    LookupProposer& lookup_;
    GenerationStats& stats_;
    const bool trace_;
};

}  // namespace

Generator::Generator(const Model& model, Backend& backend, KvCache& cache, DraftModel draft)
    : model_(model),
      backend_(backend),
      cache_(cache),
      draft_(draft),
      logits_(static_cast<size_t>(model.config.n_vocab)) {}

void Generator::prefill(std::span<const int> prompt, int chunk) {
    chunk = std::max(1, chunk);
    for (size_t begin = 0; begin < prompt.size(); begin += static_cast<size_t>(chunk)) {
        const size_t n = std::min(prompt.size() - begin, static_cast<size_t>(chunk));
        const bool last = begin + n == prompt.size();
        backend_.forward(std::span<const int>(prompt.data() + begin, n), cache_, last ? 1 : 0, logits_.data());
    }
}

GenerationStats Generator::generate(const std::vector<int>& prompt, const GenerationParams& params,
                                    const std::function<bool(std::string_view)>& emit, std::span<const int> held,
                                    int cached) {
    using Clock = std::chrono::steady_clock;
    GenerationStats stats;
    if (prompt.empty()) throw Error("the prompt is empty (no tokens to start from)");
    // At least the last token is prefilled: its forward gives the first token's logits.
    if (cached < 0 || cached >= static_cast<int>(prompt.size()) || cached > cache_.n_committed())
        throw Error("internal: " + std::to_string(cached) + " cached tokens of a prompt of " +
                    std::to_string(prompt.size()) + " with " + std::to_string(cache_.n_committed()) + " in the cache");
    const int to_prefill = static_cast<int>(prompt.size()) - cached;
    if (cache_.n_committed() + to_prefill > cache_.capacity())
        throw Error("the prompt has " + std::to_string(prompt.size()) + " tokens but the context holds only " +
                    std::to_string(cache_.capacity() - cache_.n_committed() + cached) + " (use --ctx to enlarge it)");

    const Clock::time_point t_start = Clock::now();
    prefill(std::span<const int>(prompt).subspan(static_cast<size_t>(cached)), params.chunk);
    stats.n_prompt = static_cast<int>(prompt.size());
    stats.n_cached = cached;
    stats.prefill_s = std::chrono::duration<double>(Clock::now() - t_start).count();

    Sampler sampler(params.sampler, model_.config.n_vocab);
    TokenOutput out(model_, params, prompt, cache_.n_committed() - static_cast<int>(prompt.size()), emit, stats,
                    t_start);
    const Clock::time_point t_decode = Clock::now();
    const bool speculative = draft_.model != nullptr || params.speculative.lookup;
    if (speculative)
        decode_speculative(out, sampler, params, prompt, held, cached);
    else
        decode_plain(out, sampler, params);
    out.finish();
    stats.generated.assign(out.history.begin() + static_cast<std::ptrdiff_t>(prompt.size()), out.history.end());
    stats.decode_s = std::chrono::duration<double>(Clock::now() - t_decode).count();
    stats.speculative = speculative;
    return stats;
}

void Generator::decode_plain(TokenOutput& out, Sampler& sampler, const GenerationParams& params) {
    grammar::TokenConstraint* constraint = params.constraint;
    // A grammar masks whole rows: no device argmax, no candidate rows.
    const bool ids_only = !constraint && argmax_is_enough(params.sampler);
    CandidateRows candidates(params.whole_rows || constraint);
    std::vector<int> window_buffer;
    const int n_vocab = model_.config.n_vocab;
    if (constraint) constraint->mask(logits_.data(), n_vocab);
    int tok = sampler.sample(logits_.data(), out.history, out.next_position());  // the prefill's logits
    for (;;) {
        if (constraint) constraint->accept(tok);
        if (!out.push(tok)) return;
        if (cache_.n_committed() >= cache_.capacity()) {
            out.stop_context_full();
            return;
        }
        const int cur = tok;
        if (ids_only) {
            backend_.forward_argmax(std::span<const int>(&cur, 1), cache_, 1, &tok, logits_);
            tok = greedy_pick(tok);
        } else if (candidates.plan(params.sampler, model_.config.n_vocab, backend_,
                                   penalty_window(params.sampler, out.history, {}, window_buffer))) {
            candidates.forward(backend_, std::span<const int>(&cur, 1), cache_, 1, logits_);
            tok = sampler.sample(candidates.row(0), out.history, out.next_position());
        } else {
            backend_.forward(std::span<const int>(&cur, 1), cache_, 1, logits_.data());
            if (constraint) constraint->mask(logits_.data(), n_vocab);
            tok = sampler.sample(logits_.data(), out.history, out.next_position());
        }
        ++out.stats().n_decode_forwards;
    }
}

// Each round: the draft (or prompt lookup) proposes k tokens, the target scores cur + the k tokens in one
// forward, the accepted prefix and the target's next token are emitted, and both caches are cut back to what was
// accepted. `cur` (the last emitted token) is never in the target's cache at the start of a round: it is the
// first token of the verification batch.
void Generator::decode_speculative(TokenOutput& out, Sampler& sampler, const GenerationParams& params,
                                   const std::vector<int>& prompt, std::span<const int> held, int cached) {
    const SpeculativeParams& sp = params.speculative;
    const bool rejection = params.sampler.temperature > 0.0f && sp.sampling == SpecSampling::Rejection;
    const int k_cap = std::max(0, sp.draft_max);
    const bool ahead_auto = draft_.model && sp.draft_ahead < 0 && backend_.computes_in_background();
    // The prompt's tokens the draft lacks: all but what the prompt cache loaded into its cache (at most `cached`).
    const int base = cache_.n_committed() - static_cast<int>(prompt.size());
    const int draft_loaded = draft_.cache ? std::clamp(draft_.cache->n_committed() - base, 0, cached) : 0;
    DraftLengthController controller = make_controller(sp, model_, draft_.model, ahead_auto, out.stats(),
                                                       out.remaining(), static_cast<int>(prompt.size()) - draft_loaded);
    LookupProposer lookup(sp);
    RoundLedger ledger(controller, lookup, out.stats(), sp.trace);
    Verification verification(params, model_.config.n_vocab, k_cap);
    // The proposals' distributions (rejection sampling reads them; greedy and coupled verification compare tokens).
    std::vector<SparseDistribution> q_dists(static_cast<size_t>(std::max(1, k_cap)));

    // Under a grammar its state follows what is emitted (the rounds' copies are dropped: a rejected draft leaves it).
    grammar::TokenConstraint* constraint = params.constraint;
    const auto emit = [&](int tok) {
        if (constraint) constraint->accept(tok);
        return out.push(tok);
    };
    // The first token comes from the prefill's logits; it is shown before the draft catches up on the prompt, so
    // drafting does not delay the time to first token.
    if (constraint) constraint->mask(logits_.data(), model_.config.n_vocab);
    int cur = sampler.sample(logits_.data(), out.history, out.next_position());
    if (!emit(cur)) return;
    // Cache positions are absolute: out.history[i] sits at base + i, after what the caches hold of earlier turns.
    std::optional<DraftRunner> draft;
    if (draft_.model)
        draft.emplace(draft_, params, cache_.n_committed() - static_cast<int>(prompt.size()), held, cached);
    bool layouts_settled = false;

    for (;;) {
        const int committed = cache_.n_committed();
        if (committed >= cache_.capacity()) {
            out.stop_context_full();
            return;
        }
        // Room in the cache for cur + k, and no point drafting past the tokens still wanted.
        const int k_limit = std::min({k_cap, cache_.capacity() - committed - 1, out.remaining() - 1});
        Round round = plan_round(sp, controller, lookup, out.history, k_limit, draft.has_value());
        if (round.k > 0 && !layouts_settled) {
            wait_for_layouts(backend_, draft, sp.trace);
            layouts_settled = true;
        }
        if (draft && !round.draft_round) draft->drop_carried(committed);
        round.start = Clock::now();

        // ---- propose: up to k tokens from the draft model or prompt lookup (none in a plain round) ----
        propose(round, draft, out.history, q_dists, rejection, constraint, out.stats().spec);

        // ---- verify: one target forward over cur + the proposal, the draft drafting ahead meanwhile ----
        verify(round, cur, backend_, cache_, verification, draft, out.history, out.remaining(), out.stats().spec);
        round.verdict =
            verification.judge(round.drafted, q_dists, out.history, out.next_position(), sampler, constraint);
        ledger.verified(round);

        // ---- commit: both caches keep cur and the accepted drafts; emit those, then the target's next token ----
        const int keep = committed + 1 + round.verdict.n_accepted;
        cache_.truncate(keep);
        if (draft) draft->settle(keep, round.verdict.n_accepted == round.n_drafted(), round.verdict.next_token);
        ledger.committed(round, draft ? &*draft : nullptr);
        for (int i = 0; i < round.verdict.n_accepted; ++i)
            if (!emit(round.drafted[static_cast<size_t>(i)])) return;
        cur = round.verdict.next_token;
        if (!emit(cur)) return;
    }
}

}  // namespace tandem
