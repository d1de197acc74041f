// Generation: chunked prefill of the prompt, then the decode loop (sample → stream → forward one token), with the
// stop conditions (EOS, token budget, stop strings, full context) and timing.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "generate/speculative.h"
#include "sample/sampler.h"

namespace tandem {

namespace grammar {
class TokenConstraint;
}
struct Model;
class Backend;
class KvCache;
class TokenOutput;

struct GenerationParams {
    int n_predict = -1;              // new tokens at most; -1 = until EOS or the context is full
    int chunk = 256;                 // prompt tokens per prefill forward
    std::vector<std::string> stops;  // generation ends before the first occurrence of any of these
    std::vector<int> stop_tokens;    // tokens that end generation like EOS (e.g. a chat template's end of turn)
    SamplerParams sampler;
    SpeculativeParams speculative;  // used when the Generator has a draft model or speculative.lookup is set
    // Every row of logits comes back whole: no candidates (Backend::forward_candidates), no device confidence
    // (forward_argmax_confidence). The same tokens, slower on a GPU: for measuring what those save.
    bool whole_rows = false;
    // A grammar the output must follow (--grammar, --json-schema): every row of logits is masked before sampling
    // and the constraint advanced by each token (not owned; its end ids should be EOS and stop_tokens). Speculative
    // decoding keeps to it too: the draft proposes under it, lookup proposals are cut where it rejects them, and
    // verification masks each position with the state after the drafts before it, so the output is what plain
    // constrained decoding gives (greedy: bitwise; sampled: in distribution, or token for token when coupled).
    grammar::TokenConstraint* constraint = nullptr;
};

enum class StopReason { Eos, Length, StopString, ContextFull, OutputClosed };
const char* stop_reason_name(StopReason reason);

struct GenerationStats {
    int n_prompt = 0;           // tokens of the prompt (prefilled, or loaded: n_cached)
    int n_cached = 0;           // of those, loaded into the cache before generate() (the prompt cache): not prefilled
    double prefill_s = 0;       // wall time of the prefill forwards
    double ttft_s = 0;          // from the start of prefill to the first token's text being handed out (a caller
                                // that loaded n_cached positions adds the load's time)
    int n_generated = 0;        // tokens sampled (EOS excluded)
    double decode_s = 0;        // wall time from the first sampled token to the end
    int n_decode_forwards = 0;  // forwards of one token after the prompt
    StopReason stop = StopReason::Eos;
    std::vector<int> generated;  // the generated ids (EOS excluded), e.g. for a chat to keep its history
    bool speculative = false;    // the speculative loop ran; `spec` holds its figures
    SpeculativeStats spec;
};

// Holds back text that might be the beginning of a stop string, and cuts the text at the first stop string.
class StopStringFilter {
public:
    explicit StopStringFilter(std::vector<std::string> stops);
    // Appends `text`; returns what can safely be shown now. After a stop string is seen, stopped() is true and
    // the text before it has been returned (nothing after it ever is).
    std::string push(std::string_view text);
    // The held-back remainder at the end of generation (empty once stopped).
    std::string flush();
    bool stopped() const { return stopped_; }

private:
    std::vector<std::string> stops_;
    std::string pending_;
    bool stopped_ = false;
};

// A draft model beside the target: its own backend and cache.
struct DraftModel {
    const Model* model = nullptr;
    Backend* backend = nullptr;
    KvCache* cache = nullptr;
};

class Generator {
public:
    // With `draft` (or GenerationParams::speculative.lookup) generation runs the speculative loop: proposals are
    // verified by one batched target forward, so the output is exactly what plain decoding would give (greedy:
    // bitwise; sampling: in distribution).
    Generator(const Model& model, Backend& backend, KvCache& cache, DraftModel draft = {});
    // Prefills `prompt` after whatever the cache holds, then generates. `emit` receives the text as it becomes
    // final (UTF-8 complete, stop strings removed) and returns false when the consumer is gone (closed pipe).
    // `held` is what the target's cache already holds (positions 0..n_committed-1, a chat's earlier turns): the
    // draft's cache may hold any prefix of it, and the draft reads the rest only if and when it first drafts (a
    // draft that never pays never reads it). Without `held`, the draft's cache must hold all of it.
    // `cached`: the caches already hold prompt[0, cached) after `held` (the prompt cache loaded them): the target's
    // all of it, the draft's any prefix; only the rest is prefilled, while the prompt's tokens all count as context
    // (the penalty window, prompt lookup, positions).
    GenerationStats generate(const std::vector<int>& prompt, const GenerationParams& params,
                             const std::function<bool(std::string_view)>& emit, std::span<const int> held = {},
                             int cached = 0);

private:
    void prefill(std::span<const int> prompt, int chunk);
    void decode_plain(TokenOutput& out, Sampler& sampler, const GenerationParams& params);
    void decode_speculative(TokenOutput& out, Sampler& sampler, const GenerationParams& params,
                            const std::vector<int>& prompt, std::span<const int> held, int cached);

    const Model& model_;
    Backend& backend_;
    KvCache& cache_;
    DraftModel draft_;
    std::vector<float> logits_;
};

}  // namespace tandem
