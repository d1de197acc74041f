// ContinuousBatcher: many sequences decoded together (continuous batching), for --batch. Up to n_parallel sequences
// are in flight, each in a slot with its own KV cache; every step is one Backend::forward_batch over a token budget:
// first one token for each decoding sequence, then chunks of the waiting prompts in what is left (Sarathi-style
// chunked prefill), so that a long prompt never holds the decoding sequences up for more than one step. A finished
// sequence's slot takes the next job at once.
//
// Shared prompt starts are run once: a job goes to the free slot whose cache holds the longest start of its prompt
// (the cache is cut back to it), or copies it from another slot's cache (KvCache::copy_prefix), waiting for that
// slot's prefill where it is still running. So lines that share a system prompt or a few-shot block prefill it once
// per batch, not once per line. (Each slot keeps its own copy: the paged cache, which would store it once, is still
// to come.)
//
// What a sequence generates does not depend on what shares its steps: the backend's logits are those of the sequence
// alone (bitwise on the CPU: Backend::forward_batch), sampling is keyed by the sequence's own seed and context
// positions (Sampler), and the stop conditions are the Generator's (TokenOutput). So a greedy answer here is the
// Generator's answer byte for byte, and a seeded one is the same text whatever else runs. Plain decoding only: the
// batch itself keeps the compute busy that speculative decoding would have used.
#pragma once
#include <cstddef>
#include <functional>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "generate/generator.h"

namespace tandem {

struct Model;
class Backend;
class KvCache;

// One sequence to generate.
struct BatchJob {
    size_t tag = 0;           // the caller's: handed back in the done callback
    std::vector<int> prompt;  // not empty, and at most the slots' context
    // n_predict, sampler, stops, stop_tokens, constraint (the job's own, at its start; alive until done); chunk and
    // speculative are not read (the batcher's step budget decides the chunks)
    GenerationParams params;
    // Receives the text as it becomes final; false when the consumer is gone (the sequence then ends, OutputClosed).
    std::function<bool(std::string_view)> emit;
};

struct BatcherOptions {
    int n_parallel = 8;     // sequences in flight at most
    int n_ctx = 4096;       // each slot's KV cache
    int step_tokens = 256;  // the token budget of one step (decode tokens first, prefill chunks in the rest)
    // A store of prompts' keys and values outside the batch (the on-disk prompt cache, app/prompt_reuse.h); both
    // optional. load_prefix(prompt, cache) may replace the cache.n_committed() positions of the prompt that an
    // admitted job's cache holds with more of them, and returns the positions it holds then (fewer only where a
    // damaged entry left it empty). save_prefix(prompt, cache, computed) is called when a prompt has been prefilled
    // (the cache holds it), with how many of its positions the batch computed.
    std::function<int(std::span<const int>, KvCache&)> load_prefix;
    std::function<void(std::span<const int>, const KvCache&, int)> save_prefix;
};

// What the batcher did, for --stats and the benchmarks.
struct BatcherStats {
    int steps = 0;
    long tokens_forwarded = 0;  // prompt and decode tokens through the backend
    int peak_in_flight = 0;
    long prefix_tokens_reused = 0;  // prompt tokens not run: kept in a slot's cache, copied from another's, loaded
    long prefix_tokens_loaded = 0;  // of those, loaded by load_prefix
    double seconds = 0;
    // Steps in which every sequence in flight decoded (no prompt chunk): the aggregate decode speed is
    // decode_tokens / decode_seconds.
    int decode_steps = 0;
    long decode_tokens = 0;
    double decode_seconds = 0;
};

class ContinuousBatcher {
public:
    ContinuousBatcher(const Model& model, Backend& backend, const BatcherOptions& options);

    // Runs jobs until `next` has no more (it is called whenever a slot is free; nullopt: none left) and every
    // sequence has finished; done(job, stats) is called for each as it finishes, in finishing order. Throws what the
    // backend or the sampler throws (the sequences in flight are then abandoned).
    BatcherStats run(const std::function<std::optional<BatchJob>()>& next,
                     const std::function<void(BatchJob&, GenerationStats&)>& done);

private:
    struct Slot;
    const Model& model_;
    Backend& backend_;
    BatcherOptions options_;
};

}  // namespace tandem
