// ContinuousBatcher (continuous_batcher.h): slots, the step's token budget, and each sequence's sampling and stops.
#include "generate/continuous_batcher.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <utility>

#include "backend.h"
#include "error.h"
#include "generate/token_output.h"
#include "grammar/constraint.h"
#include "model/model.h"
#include "sample/sampler.h"

namespace tandem {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

size_t common_prefix(std::span<const int> a, std::span<const int> b) {
    size_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
    return n;
}

// A prompt waits for another slot's prefill of a shared start only when it saves at least this many tokens (a chat
// template's own few tokens are not worth a step's delay).
constexpr size_t kMinWaitedPrefix = 32;
}  // namespace

// A place for one sequence in flight. The cache is made once and emptied for each job it takes.
struct ContinuousBatcher::Slot {
    std::unique_ptr<KvCache> cache;
    std::optional<BatchJob> job;             // before `out`, which refers to its emit: destroyed after it
    std::unique_ptr<GenerationStats> stats;  // `out` writes into it
    std::unique_ptr<TokenOutput> out;
    std::optional<Sampler> sampler;
    std::vector<float> logits;  // the row of the sequence's last step
    size_t prefilled = 0;       // prompt tokens in the cache
    int computed = 0;           // of those, the ones this job's prefill ran (not kept, copied or loaded)
    int cur = -1;               // decoding: the token the next step feeds (-1: still prefilling)
    long admitted = 0;          // admission order: prompts are prefilled first come, first served
    // The tokens whose keys and values the cache holds, in order (kept after the job ends: the next job in this slot,
    // or in another, may start from them).
    std::vector<int> held;
    // A prompt whose start another slot is still prefilling waits for it, then copies it: that slot, its job's
    // admission number, and the prefix length.
    Slot* wait_source = nullptr;
    long wait_admitted = -1;
    size_t wait_len = 0;
    Clock::time_point t_start, t_decode;
    bool busy() const { return job.has_value(); }
};

ContinuousBatcher::ContinuousBatcher(const Model& model, Backend& backend, const BatcherOptions& options)
    : model_(model), backend_(backend), options_(options) {
    options_.n_parallel = std::max(1, options_.n_parallel);
    options_.step_tokens = std::max(1, options_.step_tokens);
}

BatcherStats ContinuousBatcher::run(const std::function<std::optional<BatchJob>()>& next,
                                    const std::function<void(BatchJob&, GenerationStats&)>& done) {
    const Clock::time_point t0 = Clock::now();
    const int n_vocab = model_.config.n_vocab;
    BatcherStats totals;
    std::vector<Slot> slots(static_cast<size_t>(options_.n_parallel));
    bool more = true;
    long admitted = 0;

    // Takes the next job, if there is one and a slot is free: into the free slot whose cache holds the longest start
    // of its prompt (kept: the cache is cut back to it), or starting from another slot's copy where one holds more,
    // or waiting for a slot that is prefilling more of it. Returns false when nothing was admitted.
    const auto admit = [&]() {
        if (!more) return false;
        if (std::none_of(slots.begin(), slots.end(), [](const Slot& s) { return !s.busy(); })) return false;
        std::optional<BatchJob> job = next();
        if (!job) {
            more = false;
            return false;
        }
        const std::vector<int> prompt = std::move(job->prompt);
        if (prompt.empty() || static_cast<int>(prompt.size()) > options_.n_ctx)
            throw Error("a batch prompt of " + std::to_string(prompt.size()) +
                        " tokens does not fit a slot's context of " + std::to_string(options_.n_ctx));
        Slot* best = nullptr;
        size_t best_len = 0;
        for (Slot& s : slots)
            if (!s.busy() && (!best || common_prefix(prompt, s.held) > best_len)) {
                best = &s;
                best_len = common_prefix(prompt, s.held);
            }
        Slot& s = *best;
        s.job = std::move(job);
        s.job->prompt = prompt;
        if (!s.cache) s.cache = backend_.new_cache(options_.n_ctx);
        // At least the prompt's last token is run: its logits give the first token.
        const size_t limit = prompt.size() - 1;
        s.cache->truncate(static_cast<int>(std::min(best_len, limit)));
        s.prefilled = static_cast<size_t>(s.cache->n_committed());
        s.held.resize(s.prefilled);
        totals.prefix_tokens_reused += static_cast<long>(s.prefilled);
        // Another slot with more of the prompt: its copy now, or a wait for its prefill.
        s.wait_source = nullptr;
        Slot* source = nullptr;
        size_t source_len = s.prefilled;
        bool later = false;
        for (Slot& o : slots) {
            if (&o == &s) continue;
            const size_t now = std::min(common_prefix(s.job->prompt, o.held), limit);
            if (now > source_len) source = &o, source_len = now, later = false;
            if (o.busy() && o.cur < 0) {  // prefilling: what it will hold
                const size_t then = std::min(common_prefix(s.job->prompt, o.job->prompt), limit);
                if (then > source_len && then >= s.prefilled + kMinWaitedPrefix)
                    source = &o, source_len = then, later = true;
            }
        }
        if (source && later) {
            s.wait_source = source;
            s.wait_admitted = source->admitted;
            s.wait_len = source_len;
        } else if (source && s.cache->copy_prefix(*source->cache, static_cast<int>(source_len))) {
            totals.prefix_tokens_reused += static_cast<long>(source_len - s.prefilled);
            s.prefilled = source_len;
            s.held.assign(s.job->prompt.begin(), s.job->prompt.begin() + static_cast<std::ptrdiff_t>(source_len));
        }
        // The store outside the batch, where it holds more than this (a later copy would wait for another slot).
        if (options_.load_prefix && !s.wait_source) {
            const size_t before = s.prefilled;
            s.prefilled = static_cast<size_t>(options_.load_prefix(s.job->prompt, *s.cache));
            s.held.assign(s.job->prompt.begin(), s.job->prompt.begin() + static_cast<std::ptrdiff_t>(s.prefilled));
            totals.prefix_tokens_reused += static_cast<long>(s.prefilled) - static_cast<long>(before);
            totals.prefix_tokens_loaded += static_cast<long>(s.prefilled > before ? s.prefilled - before : 0);
        }
        s.computed = 0;
        s.stats = std::make_unique<GenerationStats>();
        s.stats->n_prompt = static_cast<int>(s.job->prompt.size());
        s.t_start = Clock::now();
        s.out =
            std::make_unique<TokenOutput>(model_, s.job->params, s.job->prompt, 0, s.job->emit, *s.stats, s.t_start);
        s.sampler.emplace(s.job->params.sampler, n_vocab);
        s.logits.resize(static_cast<size_t>(n_vocab));
        s.cur = -1;
        s.admitted = admitted++;
        return true;
    };
    // A waiting prompt's source has prefilled its part (or moved on): copy what it holds of the prompt.
    const auto resolve_wait = [&](Slot& s) {
        Slot& src = *s.wait_source;
        if (src.busy() && src.admitted == s.wait_admitted && src.prefilled < s.wait_len) return false;
        s.wait_source = nullptr;
        const size_t m = std::min(common_prefix(s.job->prompt, src.held), s.job->prompt.size() - 1);
        if (m > s.prefilled && s.cache->copy_prefix(*src.cache, static_cast<int>(m))) {
            totals.prefix_tokens_reused += static_cast<long>(m - s.prefilled);
            s.prefilled = m;
            s.held.assign(s.job->prompt.begin(), s.job->prompt.begin() + static_cast<std::ptrdiff_t>(m));
        }
        return true;
    };
    const auto finish = [&](Slot& s) {
        s.out->finish();
        GenerationStats& st = *s.stats;
        st.generated.assign(s.out->history.begin() + static_cast<std::ptrdiff_t>(s.job->prompt.size()),
                            s.out->history.end());
        st.decode_s = seconds_since(s.t_decode);
        s.out.reset();
        done(*s.job, st);
        s.job.reset();
        s.sampler.reset();
    };

    struct Planned {
        Slot* slot;
        int n_tokens;
        bool prefill;
    };
    std::vector<SequenceSlice> slices;
    std::vector<Planned> planned;
    std::vector<Slot*> waiting;
    for (;;) {
        while (admit()) {
        }
        // The step: one token for every decoding sequence, then prompt chunks, oldest first, in the rest.
        slices.clear();
        planned.clear();
        waiting.clear();
        int budget = options_.step_tokens, in_flight = 0;
        for (Slot& s : slots) {
            if (!s.busy()) continue;
            ++in_flight;
            if (s.cur < 0) {
                waiting.push_back(&s);
                continue;
            }
            slices.push_back({std::span<const int>(&s.cur, 1), s.cache.get(), 1, s.logits.data()});
            planned.push_back({&s, 1, false});
            --budget;
        }
        if (in_flight == 0) break;
        totals.peak_in_flight = std::max(totals.peak_in_flight, in_flight);
        std::sort(waiting.begin(), waiting.end(),
                  [](const Slot* a, const Slot* b) { return a->admitted < b->admitted; });
        for (Slot* s : waiting) {
            if (budget <= 0) break;
            if (s->wait_source && !resolve_wait(*s)) continue;
            const size_t left = s->job->prompt.size() - s->prefilled;
            const int take = static_cast<int>(std::min(left, static_cast<size_t>(budget)));
            const bool last = static_cast<size_t>(take) == left;
            slices.push_back({std::span<const int>(s->job->prompt).subspan(s->prefilled, static_cast<size_t>(take)),
                              s->cache.get(), last ? 1 : 0, s->logits.data()});
            planned.push_back({s, take, true});
            budget -= take;
        }
        const Clock::time_point t_step = Clock::now();
        backend_.forward_batch(slices);
        ++totals.steps;
        for (const Planned& p : planned) totals.tokens_forwarded += p.n_tokens;
        if (waiting.empty()) {
            ++totals.decode_steps;
            totals.decode_tokens += static_cast<long>(slices.size());
            totals.decode_seconds += seconds_since(t_step);
        }

        // Each sequence with a new row samples its next token; those that stop give their slot back.
        for (size_t i = 0; i < planned.size(); ++i) {
            Slot& s = *planned[i].slot;
            s.held.insert(s.held.end(), slices[i].tokens.begin(), slices[i].tokens.end());
            if (planned[i].prefill) {
                s.prefilled += static_cast<size_t>(planned[i].n_tokens);
                s.computed += planned[i].n_tokens;
                if (slices[i].n_logits == 0) continue;
                if (options_.save_prefix) options_.save_prefix(s.job->prompt, *s.cache, s.computed);
                s.stats->prefill_s = seconds_since(s.t_start);
                s.t_decode = Clock::now();
            } else {
                ++s.stats->n_decode_forwards;
            }
            grammar::TokenConstraint* constraint = s.job->params.constraint;
            if (constraint) constraint->mask(s.logits.data(), n_vocab);
            const int tok = s.sampler->sample(s.logits.data(), s.out->history, s.out->next_position());
            if (constraint) constraint->accept(tok);
            if (!s.out->push(tok)) {
                finish(s);
            } else if (s.cache->n_committed() >= s.cache->capacity()) {
                s.out->stop_context_full();
                finish(s);
            } else {
                s.cur = tok;
            }
        }
    }
    totals.seconds = seconds_since(t0);
    return totals;
}

}  // namespace tandem
