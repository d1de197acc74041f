// TokenOutput: what becomes of one sequence's sampled tokens (stop conditions, text, timing). Shared by the
// Generator's plain and speculative loops and the continuous batcher, so that a sequence stops and reads alike
// whichever loop decodes it.
#pragma once
#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "generate/generator.h"
#include "model/model.h"
#include "text/tokenizer.h"

namespace tandem {

// Where a sequence's sampled tokens go: the history (for the penalty and lookup), the stop conditions, the streaming
// decoder, the stop-string filter and the consumer. `base` is the context position of prompt[0]; `t_start` the start
// of the prefill (the time to first token counts from it).
class TokenOutput {
public:
    using Clock = std::chrono::steady_clock;
    TokenOutput(const Model& model, const GenerationParams& params, const std::vector<int>& prompt, int base,
                const std::function<bool(std::string_view)>& emit, GenerationStats& stats, Clock::time_point t_start)
        : base_(base),
          eos_(model.tokenizer->eos()),
          stop_tokens_(params.stop_tokens),
          n_predict_(params.n_predict),
          emit_(emit),
          stats_(stats),
          t_start_(t_start),
          detok_(*model.tokenizer, /*at_start=*/false),
          stop_filter_(params.stops),
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
    // The context position of the next token: where it will sit in the cache, after what earlier turns left there.
    // Sampling noise is keyed by it (Sampler::sample).
    int64_t next_position() const { return base_ + static_cast<int64_t>(history.size()); }
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

    const int base_;  // the context position of history[0]
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

}  // namespace tandem
