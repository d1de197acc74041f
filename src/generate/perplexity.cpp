// llama.cpp-compatible perplexity (see perplexity.h for the exact rules and why they are what they are).
#include "generate/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "backend.h"
#include "error.h"

namespace tandem {

double NllStats::ppl() const { return count > 0 ? std::exp(nll / static_cast<double>(count)) : 0.0; }

double NllStats::error() const {
    // llama.cpp: the variance of the NLLs over count values, divided by count - 1 (the standard error of their
    // mean), then scaled by ppl because d exp(x) = exp(x) dx.
    if (count < 2) return 0.0;
    const double mean = nll / static_cast<double>(count);
    const double var = nll2 / static_cast<double>(count) - mean * mean;
    if (!(var > 0.0)) return 0.0;
    return std::sqrt(var / static_cast<double>(count - 1)) * std::exp(mean);
}

double token_nll(std::span<const float> logits, int token) {
    // Same precision choices as llama.cpp's log_softmax: float max, float differences and expf, a double sum.
    float max_logit = logits[0];
    for (float l : logits) max_logit = std::max(max_logit, l);
    double sum_exp = 0.0;
    for (float l : logits) sum_exp += std::exp(l - max_logit);
    return -((logits[token] - max_logit) - std::log(sum_exp));
}

int perplexity_windows(int n_tokens, const PerplexityParams& p) {
    if (p.n_ctx < 4)
        throw Error("perplexity needs a context of at least 4 tokens (got " + std::to_string(p.n_ctx) + ")");
    if (p.batch < 1) throw Error("perplexity needs a batch of at least 1 token");
    if (n_tokens < 2 * p.n_ctx)
        throw Error("the text has " + std::to_string(n_tokens) + " tokens; perplexity with a context of " +
                    std::to_string(p.n_ctx) + " needs at least " + std::to_string(2 * p.n_ctx));
    const int n_max = n_tokens / p.n_ctx;
    return p.n_chunks < 0 ? n_max : std::min(p.n_chunks, n_max);
}

PerplexityResult perplexity(Backend& backend, KvCache& cache, int n_vocab, std::span<const int> tokens,
                            const PerplexityParams& p, const std::function<void(int, double)>& on_window) {
    PerplexityResult r;
    r.n_tokens_total = static_cast<int>(tokens.size());
    r.n_windows = perplexity_windows(r.n_tokens_total, p);
    if (cache.capacity() < p.n_ctx)
        throw Error("the KV cache holds " + std::to_string(cache.capacity()) + " positions, fewer than the context " +
                    std::to_string(p.n_ctx));
    const int n_ctx = p.n_ctx;
    const int first = n_ctx / 2;
    // Logits are only needed from position `first` on; the backend returns the last n_logits rows of a call, so
    // the first half of a window skips the output projection (the costliest matmul for a 150k vocabulary).
    std::vector<float> logits(static_cast<size_t>(n_ctx - first) * n_vocab);
    std::vector<int> window(n_ctx);
    const auto t0 = std::chrono::steady_clock::now();

    for (int w = 0; w < r.n_windows; ++w) {
        const size_t start = static_cast<size_t>(w) * n_ctx;
        std::copy(tokens.begin() + start, tokens.begin() + start + n_ctx, window.begin());
        if (p.bos >= 0) window[0] = p.bos;  // as llama.cpp: the input only; token 0 is never scored
        cache.truncate(0);
        for (int b = 0; b < n_ctx; b += p.batch) {
            const int e = std::min(n_ctx, b + p.batch);
            const int out_from = std::max(b, first);
            const int n_logits = std::max(0, e - out_from);
            float* dst = n_logits > 0 ? logits.data() + static_cast<size_t>(out_from - first) * n_vocab : nullptr;
            backend.forward(std::span<const int>(window.data() + b, e - b), cache, n_logits, dst);
        }
        for (int pos = first; pos < n_ctx - 1; ++pos) {
            const std::span<const float> row(logits.data() + static_cast<size_t>(pos - first) * n_vocab, n_vocab);
            r.stats.add(token_nll(row, tokens[start + pos + 1]));
        }
        r.running_ppl.push_back(r.stats.ppl());
        if (on_window) on_window(w + 1, r.stats.ppl());
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
}

}  // namespace tandem
