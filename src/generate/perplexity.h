// Perplexity of a model over a token sequence, computed exactly as llama.cpp's `llama-perplexity` does (its
// perplexity() in tools/perplexity/perplexity.cpp), so tandem's figures can be compared with llama.cpp's:
//   - the tokens are cut into consecutive, non-overlapping windows of n_ctx tokens (a tail shorter than a window
//     is dropped) and at least two windows are required;
//   - every window is evaluated from an empty KV cache (positions 0..n_ctx-1), with its first token replaced by
//     BOS when the model's tokenizer adds BOS;
//   - only the second half is scored: with first = n_ctx/2, the logits at positions first..n_ctx-2 predict the
//     tokens at first+1..n_ctx-1, so each window contributes n_ctx - first - 1 negative log-likelihoods;
//   - PPL = exp(mean NLL), and the ± is the standard error of the mean NLL propagated through exp:
//     ppl * sqrt((mean(NLL²) - mean(NLL)²) / (count - 1)).
#pragma once
#include <functional>
#include <span>
#include <vector>

namespace tandem {

class Backend;
class KvCache;

struct PerplexityParams {
    int n_ctx = 512;    // tokens per window
    int n_chunks = -1;  // windows to evaluate at most (-1: every whole window)
    int batch = 512;    // tokens per forward call within a window
    int bos = -1;       // when >= 0, replaces the first token of every window (the model adds BOS)
};

// Running sums of NLL and NLL², and llama.cpp's arithmetic on them.
struct NllStats {
    double nll = 0.0;   // sum of -log p(token)
    double nll2 = 0.0;  // sum of its squares
    long count = 0;
    void add(double v) {
        nll += v;
        nll2 += v * v;
        ++count;
    }
    double ppl() const;    // exp(nll / count)
    double error() const;  // the ± of the final estimate (0 when undefined: fewer than two values)
};

// -log softmax(logits)[token], as llama.cpp computes it: max in float, the sum of expf(l - max) in double.
double token_nll(std::span<const float> logits, int token);

struct PerplexityResult {
    NllStats stats;
    std::vector<double> running_ppl;  // the perplexity over the first k windows, k = 1..n_windows
    int n_windows = 0;
    int n_tokens_total = 0;  // the whole text's tokens
    double seconds = 0.0;    // forward passes and scoring
    double ppl() const { return stats.ppl(); }
    double error() const { return stats.error(); }
};

// How many windows perplexity() evaluates for `n_tokens` tokens; throws tandem::Error when the text is too short
// (fewer than 2 * n_ctx tokens, llama.cpp's rule) or the parameters are invalid.
int perplexity_windows(int n_tokens, const PerplexityParams& params);

// Evaluates `tokens` window by window on `backend`, reusing `cache` (capacity >= n_ctx; truncated before each
// window). `on_window(k, running_ppl)` is called after window k (1-based) when given.
PerplexityResult perplexity(Backend& backend, KvCache& cache, int n_vocab, std::span<const int> tokens,
                            const PerplexityParams& params, const std::function<void(int, double)>& on_window = {});

}  // namespace tandem
