// ContinuousBatcher (continuous_batcher.h): slots, the step's token budget, and each sequence's sampling and stops.
#include "generate/continuous_batcher.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
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
    int cur = -1;               // decoding: the token the next step feeds (-1: still prefilling)
    long admitted = 0;          // admission order: prompts are prefilled first come, first served
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

    // Gives a free slot the next job, if there is one.
    const auto admit = [&](Slot& s) {
        if (!more) return;
        std::optional<BatchJob> job = next();
        if (!job) {
            more = false;
            return;
        }
        if (!s.cache)
            s.cache = backend_.new_cache(options_.n_ctx);
        else
            s.cache->truncate(0);
        if (s.cache->n_committed() != 0) throw Error("internal: a batch slot's KV cache did not empty");
        if (job->prompt.empty() || static_cast<int>(job->prompt.size()) > s.cache->capacity())
            throw Error("a batch prompt of " + std::to_string(job->prompt.size()) +
                        " tokens does not fit a slot's context of " + std::to_string(s.cache->capacity()));
        s.job = std::move(job);
        s.stats = std::make_unique<GenerationStats>();
        s.stats->n_prompt = static_cast<int>(s.job->prompt.size());
        s.t_start = Clock::now();
        s.out =
            std::make_unique<TokenOutput>(model_, s.job->params, s.job->prompt, 0, s.job->emit, *s.stats, s.t_start);
        s.sampler.emplace(s.job->params.sampler, n_vocab);
        s.logits.resize(static_cast<size_t>(n_vocab));
        s.prefilled = 0;
        s.cur = -1;
        s.admitted = admitted++;
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
        for (Slot& s : slots)
            if (!s.busy()) admit(s);
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
            const size_t left = s->job->prompt.size() - s->prefilled;
            const int take = static_cast<int>(std::min(left, static_cast<size_t>(budget)));
            const bool last = static_cast<size_t>(take) == left;
            slices.push_back({std::span<const int>(s->job->prompt).subspan(s->prefilled, static_cast<size_t>(take)),
                              s->cache.get(), last ? 1 : 0, s->logits.data()});
            planned.push_back({s, take, true});
            budget -= take;
        }
        backend_.forward_batch(slices);
        ++totals.steps;
        for (const Planned& p : planned) totals.tokens_forwarded += p.n_tokens;

        // Each sequence with a new row samples its next token; those that stop give their slot back.
        for (size_t i = 0; i < planned.size(); ++i) {
            Slot& s = *planned[i].slot;
            if (planned[i].prefill) {
                s.prefilled += static_cast<size_t>(planned[i].n_tokens);
                if (slices[i].n_logits == 0) continue;
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
