// Generator and StopStringFilter.
#include "generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "backend.h"
#include "cpu/vec_math.h"
#include "error.h"
#include "model.h"

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

// Where sampled tokens go: the history (for the penalty and lookup), the stop conditions, the streaming decoder,
// the stop-string filter and the consumer. Shared by the plain and the speculative loop so they stop alike.
class Generator::Output {
public:
    using Clock = std::chrono::steady_clock;
    Output(const Model& model, const GenerationParams& params, const std::vector<int>& prompt,
           const std::function<bool(std::string_view)>& emit, GenerationStats& stats, Clock::time_point t_start)
        : eos_(model.tokenizer->eos()), stop_tokens_(params.stop_tokens), n_predict_(params.n_predict), emit_(emit), stats_(stats),
          t_start_(t_start), detok_(*model.tokenizer, /*at_start=*/false), stop_filter_(params.stops),
          history(prompt) {
        history.reserve(prompt.size() + static_cast<size_t>(std::max(0, params.n_predict)) + 64);
    }

    GenerationStats& stats() { return stats_; }
    // Takes one sampled token; false when generation must end (the reason is in stats.stop).
    bool push(int tok) {
        if (tok == eos_ || std::find(stop_tokens_.begin(), stop_tokens_.end(), tok) != stop_tokens_.end())
            return end(StopReason::Eos);
        ++stats_.n_generated;
        history.push_back(tok);
        if (!deliver(stop_filter_.push(detok_.push(tok)))) return end(StopReason::OutputClosed);
        if (stop_filter_.stopped()) return end(StopReason::StopString);
        if (n_predict_ >= 0 && stats_.n_generated >= n_predict_) return end(StopReason::Length);
        return true;
    }
    int remaining() const { return n_predict_ < 0 ? 1 << 30 : n_predict_ - stats_.n_generated; }
    bool stop_context_full() { return end(StopReason::ContextFull); }

    // Hands out what the decoder and the filter still hold (not after a closed pipe or a stop string).
    void finish() {
        if (stats_.stop != StopReason::OutputClosed && stats_.stop != StopReason::StopString) {
            std::string rest = stop_filter_.push(detok_.flush());
            rest += stop_filter_.flush();
            if (!deliver(rest)) stats_.stop = StopReason::OutputClosed;
        }
        if (first_) stats_.ttft_s = std::chrono::duration<double>(Clock::now() - t_start_).count();
    }

private:
    bool end(StopReason reason) {
        stats_.stop = reason;
        return false;
    }
    bool deliver(const std::string& text) {
        if (first_) {
            stats_.ttft_s = std::chrono::duration<double>(Clock::now() - t_start_).count();
            first_ = false;
        }
        return text.empty() || emit_(text);
    }

    const int eos_;
    const std::vector<int> stop_tokens_;
    const int n_predict_;
    const std::function<bool(std::string_view)>& emit_;
    GenerationStats& stats_;
    const Clock::time_point t_start_;
    TokenStreamDecoder detok_;
    StopStringFilter stop_filter_;
    bool first_ = true;

public:
    std::vector<int> history;  // prompt + generated tokens
};

namespace {

// Greedy with nothing else that reads the logits (a repeat penalty does, even with an empty window): the argmax is
// all the sampler would take from them, so the backend may pick it (Backend::forward_argmax; a GPU then copies one
// int per row back instead of the row).
bool argmax_is_enough(const SamplerParams& p) { return p.temperature == 0.0f && p.repeat_penalty == 1.0f; }

// Rows (the target's or the draft's) as candidates (Backend::forward_candidates) where the sampler reads nothing
// else of them (plan_candidates): a GPU backend then copies back a few hundred numbers per row instead of the row,
// and the sampler's work per row no longer grows with the vocabulary. The picks are the whole rows' picks, bit for
// bit. `whole_rows` (GenerationParams) turns it off.
class CandidateRows {
public:
    explicit CandidateRows(bool whole_rows) : whole_rows_(whole_rows) {}
    // For rows sampled with `params` whose penalty windows lie within `window`; false where whole rows are needed.
    bool plan(const SamplerParams& params, int n_vocab, const Backend& backend, std::span<const int> window) {
        if (whole_rows_) return false;
        k_ = plan_candidates(params, n_vocab, window, extra_);
        if (k_ > backend.max_candidates()) k_ = 0;
        return k_ > 0;
    }
    // Runs `tokens` and keeps the candidates of the last n_rows (`scratch`: n_rows whole rows, for the default).
    void forward(Backend& backend, std::span<const int> tokens, KvCache& cache, int n_rows, std::span<float> scratch) {
        const size_t rows = static_cast<size_t>(n_rows);
        top_logits_.resize(rows * static_cast<size_t>(k_));
        top_ids_.resize(top_logits_.size());
        extra_logits_.resize(rows * extra_.size());
        backend.forward_candidates(tokens, cache, n_rows, k_, extra_, top_logits_.data(), top_ids_.data(),
                                   extra_logits_.data(), scratch);
    }
    CandidateRow row(int r) const {
        const size_t k = static_cast<size_t>(k_), e = extra_.size(), i = static_cast<size_t>(r);
        return {std::span<const float>(top_logits_).subspan(i * k, k), std::span<const int>(top_ids_).subspan(i * k, k),
                extra_, std::span<const float>(extra_logits_).subspan(i * e, e)};
    }

private:
    bool whole_rows_;
    int k_ = 0;
    std::vector<int> extra_, top_ids_;
    std::vector<float> top_logits_, extra_logits_;
};

// The tokens a repeat penalty can see from a row whose history is `history` followed by `drafted` (any prefix of
// them): the history's last repeat_last_n and the drafts.
std::span<const int> penalty_window(const SamplerParams& p, const std::vector<int>& history,
                                    std::span<const int> drafted, std::vector<int>& buffer) {
    const size_t n = std::min(history.size(), static_cast<size_t>(std::max(0, p.repeat_last_n)));
    if (drafted.empty()) return std::span<const int>(history).last(n);
    buffer.assign(history.end() - static_cast<std::ptrdiff_t>(n), history.end());
    buffer.insert(buffer.end(), drafted.begin(), drafted.end());
    return buffer;
}

// A greedy id from forward_argmax; -1 is the row where Sampler would have thrown.
int greedy_pick(int id) {
    if (id < 0) throw Error("sampler: every logit is -inf or NaN");
    return id;
}

// A backend's deferred outputs (Backend::defer_outputs) for a scope: collect() delivers them; leaving the scope by an
// exception still lets the queued work land before the outputs' buffers go, and the backend stops deferring (its
// later calls write their outputs again). Does nothing for a null backend.
class DeferredOutputs {
public:
    explicit DeferredOutputs(Backend* backend) : backend_(backend) {
        if (backend_) backend_->defer_outputs();
    }
    ~DeferredOutputs() {
        if (!backend_) return;
        try {
            backend_->collect_outputs();
        } catch (...) {  // the error that unwound the scope is the one reported
        }
    }
    DeferredOutputs(const DeferredOutputs&) = delete;
    DeferredOutputs& operator=(const DeferredOutputs&) = delete;
    bool ready() const { return !backend_ || backend_->outputs_ready(); }
    void collect() {
        if (backend_) std::exchange(backend_, nullptr)->collect_outputs();
    }

private:
    Backend* backend_;
};

}  // namespace

Generator::Generator(const Model& model, Backend& backend, KvCache& cache, DraftModel draft)
    : model_(model), backend_(backend), cache_(cache), draft_(draft),
      logits_(static_cast<size_t>(model.config.n_vocab)) {}

void Generator::prefill(const std::vector<int>& prompt, int chunk) {
    chunk = std::max(1, chunk);
    for (size_t begin = 0; begin < prompt.size(); begin += static_cast<size_t>(chunk)) {
        const size_t n = std::min(prompt.size() - begin, static_cast<size_t>(chunk));
        const bool last = begin + n == prompt.size();
        backend_.forward(std::span<const int>(prompt.data() + begin, n), cache_, last ? 1 : 0, logits_.data());
    }
}

GenerationStats Generator::generate(const std::vector<int>& prompt, const GenerationParams& params,
                                    const std::function<bool(std::string_view)>& emit, std::span<const int> held) {
    using Clock = std::chrono::steady_clock;
    GenerationStats stats;
    if (prompt.empty()) throw Error("the prompt is empty (no tokens to start from)");
    if (cache_.n_committed() + static_cast<int>(prompt.size()) > cache_.capacity())
        throw Error("the prompt has " + std::to_string(prompt.size()) + " tokens but the context holds only " +
                    std::to_string(cache_.capacity() - cache_.n_committed()) + " (use --ctx to enlarge it)");

    const Clock::time_point t_start = Clock::now();
    prefill(prompt, params.chunk);
    stats.n_prompt = static_cast<int>(prompt.size());
    stats.prefill_s = std::chrono::duration<double>(Clock::now() - t_start).count();

    Sampler sampler(params.sampler, model_.config.n_vocab);
    Output out(model_, params, prompt, emit, stats, t_start);
    const Clock::time_point t_decode = Clock::now();
    const bool speculative = draft_.model != nullptr || params.speculative.lookup;
    if (speculative)
        decode_speculative(out, sampler, params, prompt, held);
    else
        decode_plain(out, sampler, params);
    out.finish();
    stats.generated.assign(out.history.begin() + static_cast<std::ptrdiff_t>(prompt.size()), out.history.end());
    stats.decode_s = std::chrono::duration<double>(Clock::now() - t_decode).count();
    stats.speculative = speculative;
    return stats;
}

void Generator::decode_plain(Output& out, Sampler& sampler, const GenerationParams& params) {
    const bool ids_only = argmax_is_enough(params.sampler);
    CandidateRows candidates(params.whole_rows);
    std::vector<int> window_buffer;
    int tok = sampler.sample(logits_.data(), out.history);  // the prefill's logits
    for (;;) {
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
            tok = sampler.sample(candidates.row(0), out.history);
        } else {
            backend_.forward(std::span<const int>(&cur, 1), cache_, 1, logits_.data());
            tok = sampler.sample(logits_.data(), out.history);
        }
        ++out.stats().n_decode_forwards;
    }
}

// Each round: the draft (or prompt lookup) proposes k tokens, the target scores cur + the k tokens in one
// forward, the accepted prefix and the target's next token are emitted, and both caches are cut back to what was
// accepted. `cur` (the last emitted token) is never in the target's cache at the start of a round: it is the
// first token of the verification batch.
void Generator::decode_speculative(Output& out, Sampler& sampler, const GenerationParams& params,
                                   const std::vector<int>& prompt, std::span<const int> held) {
    using Clock = std::chrono::steady_clock;
    auto since = [](Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); };
    const SpeculativeParams& sp = params.speculative;
    const bool greedy = params.sampler.temperature <= 0.0f;
    const int n_vocab = model_.config.n_vocab;
    const size_t V = static_cast<size_t>(n_vocab);
    SpeculativeStats& st = out.stats().spec;

    const int draft_vocab = draft_.model ? draft_.model->config.n_vocab : 0;
    // The draft's logits restricted to the first sp.draft_vocab ids and the ids of the context (see below).
    const bool restrict_draft = draft_.model && sp.draft_vocab > 0 && sp.draft_vocab < draft_vocab;
    DraftLengthController controller(sp.draft_min, sp.draft_max);
    controller.set_free_drafts(draft_.model == nullptr);
    // The controller counts on drafting ahead where it runs by itself (auto, a target that computes in the
    // background); forced steps (tests, benchmarks) leave its model as without.
    controller.set_draft_ahead(draft_.model && sp.draft_ahead < 0 && backend_.computes_in_background());
    // The prompt prefill's cost per token, only from a prompt long enough for the per-token part to dominate: what
    // each further verified token adds to a target forward, beyond the first few (DraftLengthController::verify_cost).
    const int n_prompt = out.stats().n_prompt;
    const double prefill_token_s = n_prompt >= 32 ? out.stats().prefill_s / n_prompt : 0.0;
    if (!draft_.model) {
        controller.set_cost_prior(0.0, prefill_token_s, 0.0, static_cast<double>(out.remaining()));
    } else {
        // The prior: the draft's share of the target's weight bytes, the prefill's cost per token, the draft's own
        // prefill of the prompt (the same work at the weight-bytes ratio) and the tokens still wanted.
        double draft_bytes = static_cast<double>(draft_.model->weights.bytes_per_token());
        if (restrict_draft)  // the output rows it will not read
            draft_bytes -= static_cast<double>(draft_.model->weights.output.n_bytes()) *
                           (1.0 - static_cast<double>(sp.draft_vocab) / draft_vocab);
        const double ratio = draft_bytes / static_cast<double>(std::max<uint64_t>(1, model_.weights.bytes_per_token()));
        controller.set_cost_prior(ratio, prefill_token_s, ratio * out.stats().prefill_s,
                                  static_cast<double>(out.remaining()));
    }
    LookupProposer lookup(sp);
    const int k_cap = std::max(0, sp.draft_max);
    // The draft's sampler applies the same transforms with its own random stream.
    SamplerParams draft_sampler_params = params.sampler;
    draft_sampler_params.seed = params.sampler.seed ^ 0x9e3779b97f4a7c15ull;
    Sampler draft_sampler(draft_sampler_params, std::max(1, draft_vocab));
    std::vector<float> draft_logits(static_cast<size_t>(std::max(1, draft_vocab)));
    std::vector<float> target_logits((static_cast<size_t>(k_cap) + 1) * V);
    // Pure greedy verification needs only the target's argmax at each position: ids, not rows of logits.
    const bool ids_only = greedy && argmax_is_enough(params.sampler);
    std::vector<int> target_ids(static_cast<size_t>(k_cap) + 1);
    // Otherwise, where the sampler reads only their candidates, the target's rows come back as those.
    CandidateRows target_candidates(params.whole_rows);
    std::vector<int> window_buffer;
    // The distributions of rejection sampling, sparse (greedy verification compares tokens and needs none).
    std::vector<SparseDistribution> p_dists(static_cast<size_t>(k_cap) + 1);
    std::vector<SparseDistribution> q_dists(static_cast<size_t>(std::max(1, k_cap)));
    std::vector<float> scratch(std::max(V, static_cast<size_t>(draft_vocab)));
    std::vector<int> batch, context;
    batch.reserve(static_cast<size_t>(k_cap) + 1);

    // The first token comes from the prefill's logits; it is shown before the draft catches up on the prompt, so
    // drafting does not delay the time to first token.
    int cur = sampler.sample(logits_.data(), out.history);
    if (!out.push(cur)) return;

    // Cache positions are absolute: out.history[i] sits at position `base + i`, and held[p] at p < base (a chat
    // keeps earlier turns in the caches). The draft's cache holds a prefix of the same tokens; what it holds beyond
    // `base` is stale and dropped. The draft reads what it lacks only when the controller first asks it for
    // tokens: when drafting does not pay on this machine, neither the prompt nor earlier turns ever go through it.
    const int base = cache_.n_committed() - static_cast<int>(prompt.size());
    int draft_fed = 0;  // absolute: positions in the draft's cache
    if (draft_.model) {
        draft_fed = std::min(draft_.cache->n_committed(), base);
        if (draft_fed < base && static_cast<int>(held.size()) < base)
            throw Error("internal: the draft's cache holds fewer tokens than the target's, and they were not given");
        draft_.cache->truncate(draft_fed);
    }
    // Token at absolute position p, for the draft's catch-up.
    auto token_at = [&](int p) { return p < base ? held[static_cast<size_t>(p)] : out.history[static_cast<size_t>(p - base)]; };
    // The draft's logits restricted to the first sp.draft_vocab ids and the ids of the context (held, prompt and
    // what was generated): code that the answer repeats from the prompt stays draftable. Set here (or an earlier
    // call's lifted), then widened before drafting whenever the context brought new ids.
    if (draft_.model) draft_.backend->restrict_logits(restrict_draft ? sp.draft_vocab : draft_vocab, {});
    std::vector<int> draft_extra_ids;
    std::vector<char> draft_extra_seen(restrict_draft ? static_cast<size_t>(draft_vocab - sp.draft_vocab) : 0);
    int draft_vocab_scanned = 0;  // absolute positions looked at
    auto update_draft_vocab = [&] {
        if (!restrict_draft) return;
        const int end = base + static_cast<int>(out.history.size());
        bool added = false;
        for (; draft_vocab_scanned < end; ++draft_vocab_scanned) {
            const int id = draft_vocab_scanned < base && draft_vocab_scanned >= static_cast<int>(held.size())
                               ? -1  // not given (the draft's cache already holds it)
                               : token_at(draft_vocab_scanned);
            if (id < sp.draft_vocab || id >= draft_vocab || draft_extra_seen[static_cast<size_t>(id - sp.draft_vocab)]) continue;
            draft_extra_seen[static_cast<size_t>(id - sp.draft_vocab)] = 1;
            draft_extra_ids.push_back(id);
            added = true;
        }
        if (added) draft_.backend->restrict_logits(sp.draft_vocab, draft_extra_ids);
    };
    // The draft's row after `tokens` (the sampler will read it with `context`): as candidates where sampled
    // drafting reads only those, as the greedy pick and its confidence where that is all greedy drafting reads,
    // else whole (greedy under a penalty reads the penalised pick and the whole row's softmax).
    CandidateRows draft_candidates(params.whole_rows);
    const bool draft_picks_only = ids_only && !params.whole_rows;
    bool draft_as_candidates = false;
    int draft_pick = -1;
    float draft_confidence = 0.0f;
    auto draft_forward = [&](std::span<const int> tokens) {
        if (draft_picks_only) {
            draft_.backend->forward_argmax_confidence(tokens, *draft_.cache, 1, &draft_pick, &draft_confidence,
                                                      draft_logits);
            return;
        }
        draft_as_candidates = !greedy && draft_candidates.plan(draft_sampler_params, draft_vocab, *draft_.backend,
                                                               penalty_window(params.sampler, context, {}, window_buffer));
        if (draft_as_candidates)
            draft_candidates.forward(*draft_.backend, tokens, *draft_.cache, 1, draft_logits);
        else
            draft_.backend->forward(tokens, *draft_.cache, 1, draft_logits.data());
    };
    // The draft's proposal from its last forward, for the position after `ctx`: its token and its top probability;
    // sampled drafting fills q with its distribution and leaves the draw (-1 returned) to the caller, after the
    // p_min rule (a token that is not proposed takes no draw from the draft's random stream).
    auto read_draft = [&](const std::vector<int>& ctx, SparseDistribution& q, float& top) {
        if (draft_picks_only) {
            top = draft_confidence;
            return greedy_pick(draft_pick);
        }
        if (greedy) {
            // Greedy verification never reads q (the target's argmax decides), so the greedy draft only needs its
            // token and a confidence: its own top probability under a plain softmax, 1 / sum(exp(l - max)), in
            // float SIMD. (Every O(vocab) pass here costs ~1% of a 0.5B draft step at 151,936 ids.)
            const int d = draft_sampler.sample(draft_logits.data(), ctx);
            const float mx = *std::max_element(draft_logits.begin(), draft_logits.end());
            std::copy(draft_logits.begin(), draft_logits.end(), scratch.begin());
            top = 1.0f / cpu::exp_shifted_sum(scratch.data(), draft_vocab, mx);
            return d;
        }
        if (draft_as_candidates)
            draft_sampler.distribution(draft_candidates.row(0), ctx, q);
        else
            draft_sampler.distribution(draft_logits.data(), ctx, q);
        top = q.probs.empty() ? 0.0f : *std::max_element(q.probs.begin(), q.probs.end());
        return -1;
    };
    // Drafting ahead (SpeculativeParams::draft_ahead). ahead_ids[0] is the draft's guess of the token the target
    // adds after a round's drafts, ahead_ids[1..] what it drafted after that guess (ahead_q: their distributions
    // when sampled). When the round accepts every draft and adds that guess, ahead_ids[1..] move to `carried`, the
    // next round's first proposals.
    const int draft_ahead = draft_.model ? sp.draft_ahead : 0;
    std::vector<int> ahead_ids, carried;
    std::vector<SparseDistribution> ahead_q(static_cast<size_t>(k_cap) + 1), carried_q(static_cast<size_t>(k_cap) + 1);
    bool ahead_stopped = false, carried_stopped = false;  // stopped by p_min: drafting does not go on after them
    std::vector<int> pending;
    bool layouts_settled = false;
    // TANDEM_SPEC_TRACE=1: one stderr line per round (the controller's k, what was drafted and accepted, the length of
    // the lookup match proposed (0: not a lookup round), the draft's, the verification's and the round's
    // milliseconds; catch=1 when the draft read a long catch-up; the draft steps of its own, the tokens it drafted
    // ahead during the verification and those of them carried to the next round), for diagnosis.
    static const bool trace = [] {
        const char* v = std::getenv("TANDEM_SPEC_TRACE");
        return v && v[0] == '1';
    }();

    for (;;) {
        const int committed = cache_.n_committed();
        if (committed >= cache_.capacity()) {
            out.stop_context_full();
            return;
        }
        // Room in the cache for cur + k, and no point drafting past the tokens still wanted.
        const int k_limit = std::min({k_cap, cache_.capacity() - committed - 1, out.remaining() - 1});
        // Prompt lookup first, where its match promises more than plain decoding (or the draft); else the draft.
        LookupProposal looked;
        int k = 0;
        if (sp.lookup) {
            looked = lookup.propose(out.history, k_limit);
            k = controller.choose_lookup(looked.match_len, static_cast<int>(looked.tokens.size()), k_limit);
        }
        const bool from_lookup = k > 0;
        if (!from_lookup && draft_.model) k = controller.choose(k_limit);
        if (k > 0 && !layouts_settled) {
            // Verifying several tokens, and the draft's catch-up on the prompt, are compute-bound and cheaper on
            // the CPU backend's repacked weights (the 1.5B verifying 4 tokens: 1.4x a plain step against 1.7x in the
            // file's layout), which plain decoding, bound by memory bandwidth, does without; and the background
            // copies, at idle priority, make no progress while decoding keeps both cores busy. So the first
            // drafting round waits for them, outside every timing the controller learns from. (1.5B + 0.5B draft,
            // 128 tokens, 5 runs: 31.6 tokens/s median against 26.1 without the wait; it lasted 0-0.9 s.)
            const Clock::time_point tw = Clock::now();
            backend_.wait_for_repacking();
            const double target_wait = since(tw);
            if (draft_.backend) draft_.backend->wait_for_repacking();
            layouts_settled = true;
            if (trace)
                std::fprintf(stderr, "speculative: waited %.1f ms for repacked weights (target %.1f ms)\n", since(tw) * 1e3,
                             target_wait * 1e3);
        }
        const bool draft_round = k > 0 && !from_lookup && draft_.model;
        if (!carried.empty() && !draft_round) {
            // Drafted ahead for a round that does not use them: the draft keeps cur (the guess it drafted after).
            carried.clear();
            draft_.cache->truncate(committed + 1);
            draft_fed = draft_.cache->n_committed();
        }
        const Clock::time_point t_round = Clock::now();
        bool round_caught_up = false;  // the draft read many tokens this round: not a typical round's cost
        double catch_up_seconds = 0;

        // ---- propose ----
        std::vector<int> drafted;
        double draft_seconds = 0;
        int draft_steps = 0;  // draft forwards behind the proposal (see DraftLengthController::record_round)
        if (from_lookup) drafted.assign(looked.tokens.begin(), looked.tokens.begin() + k);
        // The draft's cache holds cur and every draft but the last (draft_cache_holds_last: and the last too, when
        // the p_min rule stopped drafting after the draft had read it).
        bool draft_cache_holds_last = false;
        if (draft_round) {
            Clock::time_point t0 = Clock::now();
            update_draft_vocab();
            context = out.history;
            int i0 = 0;
            bool done = false;
            if (!carried.empty()) {
                // Drafted ahead during the last verification, which accepted every draft and added the draft's guess
                // (cur): the draft's cache holds cur and what followed it. Proposed as they are; the draft goes on
                // from the last one where p_min did not stop it there.
                const int t = std::min(k, static_cast<int>(carried.size()));
                for (int j = 0; j < t; ++j) {
                    drafted.push_back(carried[static_cast<size_t>(j)]);
                    context.push_back(carried[static_cast<size_t>(j)]);
                    if (!greedy) std::swap(q_dists[static_cast<size_t>(j)], carried_q[static_cast<size_t>(j)]);
                }
                st.ahead_used += t;
                draft_.cache->truncate(committed + t);  // cur and drafted[0..t-2]: the last is not read yet
                done = t == k || carried_stopped;
                carried.clear();
                draft_steps = 0;
                if (!done) {
                    draft_forward(std::span<const int>(&drafted.back(), 1));
                    ++draft_steps;
                }
                i0 = t;
            } else {
                // Catch the draft up on everything it has not seen: cur, after a full acceptance the last draft,
                // and in the first drafting round (or after a stretch of plain decoding) the prompt and what
                // followed, in prefill chunks. A long catch-up is not a draft step: its time is left out of the
                // per-step cost.
                pending.clear();
                for (int p = draft_fed; p < base + static_cast<int>(out.history.size()); ++p)
                    pending.push_back(token_at(p));
                const size_t n_pending = pending.size();
                const size_t chunk = static_cast<size_t>(std::max(1, params.chunk));
                for (size_t b = 0; b < n_pending; b += chunk) {
                    const size_t n = std::min(n_pending - b, chunk);
                    if (b + n == n_pending)
                        draft_forward(std::span<const int>(pending.data() + b, n));
                    else
                        draft_.backend->forward(std::span<const int>(pending.data() + b, n), *draft_.cache, 0, nullptr);
                }
                draft_steps = 1;  // the forward of cur (or the catch-up standing in for it) gave drafted[0]'s logits
                const bool long_catch_up = n_pending > 2;
                round_caught_up = long_catch_up;
                if (long_catch_up) {
                    catch_up_seconds = since(t0);
                    st.draft_s += catch_up_seconds;
                    t0 = Clock::now();
                }
            }
            for (int i = i0; i < k && !done; ++i) {
                float top;
                int d = read_draft(context, q_dists[static_cast<size_t>(i)], top);
                if (top < sp.p_min && i > 0) {
                    draft_cache_holds_last = true;
                    break;
                }
                if (!greedy) d = draft_sampler.draw(q_dists[static_cast<size_t>(i)]);
                drafted.push_back(d);
                context.push_back(d);
                if (i + 1 < k) {
                    draft_forward(std::span<const int>(&d, 1));
                    ++draft_steps;
                }
            }
            draft_fed = draft_.cache->n_committed();
            draft_seconds = since(t0);
            st.draft_s += draft_seconds;
            // A round after a long catch-up, or one whose proposals were all drafted ahead, measures no draft step.
            if (round_caught_up || draft_steps == 0) draft_seconds = 0;
        } else if (from_lookup && !greedy) {
            for (size_t i = 0; i < drafted.size(); ++i)
                q_dists[i].assign_one(drafted[i]);  // a deterministic proposal: q is one-hot
        }
        const int n_drafted = static_cast<int>(drafted.size());

        // ---- verify: one target forward over cur + drafted ----
        batch.assign(1, cur);
        batch.insert(batch.end(), drafted.begin(), drafted.end());
        const Clock::time_point t_verify = Clock::now();
        // Draft ahead while the target verifies (SpeculativeParams::draft_ahead): a round the draft proposed, on a
        // target that computes in the background, or forced.
        const bool ahead = draft_round && draft_ahead != 0 && (draft_ahead > 0 || backend_.computes_in_background());
        DeferredOutputs verification(ahead ? &backend_ : nullptr);
        const std::span<float> target_rows(target_logits.data(), static_cast<size_t>(n_drafted + 1) * V);
        const bool as_candidates =
            !ids_only && target_candidates.plan(params.sampler, n_vocab, backend_,
                                                penalty_window(params.sampler, out.history, drafted, window_buffer));
        if (ids_only)
            backend_.forward_argmax(batch, cache_, n_drafted + 1, target_ids.data(), target_rows);
        else if (as_candidates)
            target_candidates.forward(backend_, batch, cache_, n_drafted + 1, target_rows);
        else
            backend_.forward(batch, cache_, n_drafted + 1, target_logits.data());
        // Row i of the target's verification, for the sampler.
        auto target_sample = [&](int i, std::span<const int> history) {
            return as_candidates ? sampler.sample(target_candidates.row(i), history)
                                 : sampler.sample(&target_logits[static_cast<size_t>(i) * V], history);
        };
        double verify_seconds = -1;  // from the start until the outputs were first seen ready
        ahead_ids.clear();
        ahead_stopped = false;
        if (ahead) {
            auto target_done = [&] {
                if (verify_seconds < 0 && verification.ready()) verify_seconds = since(t_verify);
                return verify_seconds >= 0;
            };
            // A draft on a GPU steps with its outputs deferred too, and the host watches the target meanwhile, so
            // that the verification's time is its own (not rounded up to the end of a draft step).
            const bool draft_defers = draft_.backend->computes_in_background();
            // The draft reads the last draft (unless it has) and drafts on as if the target accepts them all: its
            // first token is its guess of the target's next one, the rest could open the next round. At most a
            // guess and k_cap proposals, within the draft's cache and the tokens still wanted.
            const int room = draft_.cache->capacity() - draft_.cache->n_committed() + (draft_cache_holds_last ? 1 : 0);
            int limit = std::min({draft_ahead > 0 ? draft_ahead : k_cap + 1, k_cap + 1, room,
                                  std::max(0, out.remaining() - n_drafted - 1)});
            context = out.history;
            context.insert(context.end(), drafted.begin(), drafted.end());
            bool have_output = draft_cache_holds_last;  // the draft's last forward read drafted.back()
            int last = drafted.back();
            for (int j = 0; j < limit; ++j) {
                if (target_done() && draft_ahead < 0) break;  // auto: only while the target works
                if (!have_output) {
                    DeferredOutputs step(draft_defers ? draft_.backend : nullptr);
                    draft_forward(std::span<const int>(&last, 1));
                    while (!step.ready()) target_done();
                    step.collect();
                    ++st.ahead_steps;
                }
                have_output = false;
                SparseDistribution& q = ahead_q[static_cast<size_t>(j)];
                float top;
                int e = read_draft(context, q, top);
                // ahead_ids[j] would be the next round's draft j - 1, which the p_min rule stops from the second on.
                if (j >= 2 && top < sp.p_min) {
                    ahead_stopped = true;
                    break;
                }
                if (!greedy) e = draft_sampler.draw(q);
                ahead_ids.push_back(e);
                context.push_back(e);
                last = e;
            }
            verification.collect();
        }
        if (verify_seconds < 0) verify_seconds = since(t_verify);
        st.verify_s += verify_seconds;
        controller.record_verify(n_drafted + 1, verify_seconds);
        ++st.rounds;
        ++out.stats().n_decode_forwards;

        Verdict verdict;
        if (n_drafted == 0) {
            ++st.plain_steps;
            verdict.next_token = ids_only ? greedy_pick(target_ids[0])  // exactly the plain step
                                          : target_sample(0, out.history);
        } else if (greedy) {
            // The target's greedy choice at each position (penalties see the drafts before it), accepted while the
            // draft agrees: verify_proposal's greedy rule without building one-hot rows.
            context = out.history;
            for (int i = 0; i <= n_drafted; ++i) {
                const int choice = ids_only ? greedy_pick(target_ids[static_cast<size_t>(i)]) : target_sample(i, context);
                if (i == n_drafted || choice != drafted[static_cast<size_t>(i)]) {
                    verdict.next_token = choice;
                    break;
                }
                ++verdict.n_accepted;
                context.push_back(choice);
            }
        } else {
            context = out.history;
            for (int i = 0; i <= n_drafted; ++i) {
                SparseDistribution& p = p_dists[static_cast<size_t>(i)];
                if (as_candidates)
                    sampler.distribution(target_candidates.row(i), context, p);
                else
                    sampler.distribution(&target_logits[static_cast<size_t>(i) * V], context, p);
                if (i < n_drafted) context.push_back(drafted[static_cast<size_t>(i)]);
            }
            verdict = verify_proposal(drafted, std::span<const SparseDistribution>(p_dists).first(drafted.size() + 1),
                                      std::span<const SparseDistribution>(q_dists).first(drafted.size()), greedy, sampler);
        }
        if (n_drafted > 0) {
            st.drafted += n_drafted;
            st.accepted += verdict.n_accepted;
            ++st.accepted_hist[static_cast<size_t>(std::min(verdict.n_accepted, 64))];
            if (from_lookup) {
                controller.record_lookup(looked.match_len, n_drafted, verdict.n_accepted);
                lookup.follow(looked, verdict.n_accepted);
            } else {
                controller.record_round(n_drafted, verdict.n_accepted, draft_seconds, draft_steps);
            }
        }

        // ---- roll back what was not accepted, then emit ----
        const int keep = committed + 1 + verdict.n_accepted;  // cur + the accepted drafts
        cache_.truncate(keep);
        if (draft_.model) {
            // The draft's cache holds history + the drafts it was fed (+ what it drafted ahead); what survives is the
            // accepted part, and what it drafted ahead when the round went as it guessed: every draft accepted, and
            // the target's next token its guess (which then sits at `keep` in its cache, followed by the rest).
            const bool as_guessed = ahead && verdict.n_accepted == n_drafted && ahead_ids.size() >= 2 &&
                                    verdict.next_token == ahead_ids[0];
            if (as_guessed) {
                carried.assign(ahead_ids.begin() + 1, ahead_ids.end());
                if (!greedy)
                    for (size_t j = 0; j < carried.size(); ++j) std::swap(carried_q[j], ahead_q[j + 1]);
                carried_stopped = ahead_stopped;
            } else {
                draft_.cache->truncate(keep);
            }
            draft_fed = draft_.cache->n_committed();
        }
        // A round that began with a long catch-up (the first drafting round, a probe after plain rounds) counts as
        // the round it would have been without: less the catch-up, plus the one draft step that it stood in for.
        // Left out, the rounds after a stretch of plain decoding could never outweigh the drafting rounds before it.
        // A lookup round beside a draft model took no draft steps: it says nothing of what the draft's rounds cost.
        double round_seconds = since(t_round);
        if (round_caught_up) round_seconds += controller.draft_step_seconds() - catch_up_seconds;
        if ((!round_caught_up || controller.draft_step_seconds() > 0) && !(from_lookup && draft_.model))
            controller.record_throughput(n_drafted, verdict.n_accepted + 1, round_seconds, draft_steps);
        if (trace)
            std::fprintf(stderr,
                         "round k=%d drafted=%d lookup=%d acc=%d draft=%.1fms verify=%.1fms round=%.1fms catch=%d "
                         "alpha=%.2f steps=%d ahead=%zu carried=%zu\n",
                         k, n_drafted, from_lookup ? looked.match_len : 0, verdict.n_accepted, draft_seconds * 1e3,
                         verify_seconds * 1e3, since(t_round) * 1e3, round_caught_up ? 1 : 0, controller.acceptance(),
                         draft_steps, ahead_ids.size(), carried.size());
        for (int i = 0; i < verdict.n_accepted; ++i)
            if (!out.push(drafted[static_cast<size_t>(i)])) return;
        cur = verdict.next_token;
        if (!out.push(cur)) return;
    }
}

}  // namespace tandem
