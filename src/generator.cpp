// Generator and StopStringFilter.
#include "generator.h"

#include <algorithm>
#include <chrono>

#include "backend.h"
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

Generator::Generator(const Model& model, Backend& backend, KvCache& cache)
    : model_(model), backend_(backend), cache_(cache), logits_(static_cast<size_t>(model.config.n_vocab)) {}

GenerationStats Generator::generate(const std::vector<int>& prompt, const GenerationParams& params,
                                    const std::function<bool(std::string_view)>& emit) {
    using Clock = std::chrono::steady_clock;
    auto seconds_since = [](Clock::time_point t0) {
        return std::chrono::duration<double>(Clock::now() - t0).count();
    };
    GenerationStats stats;
    if (prompt.empty()) throw Error("the prompt is empty (no tokens to start from)");
    if (cache_.n_committed() + static_cast<int>(prompt.size()) > cache_.capacity())
        throw Error("the prompt has " + std::to_string(prompt.size()) + " tokens but the context holds only " +
                    std::to_string(cache_.capacity() - cache_.n_committed()) + " (use --ctx to enlarge it)");
    const int chunk = std::max(1, params.chunk);

    const Clock::time_point t_start = Clock::now();
    for (size_t begin = 0; begin < prompt.size(); begin += static_cast<size_t>(chunk)) {
        const size_t n = std::min(prompt.size() - begin, static_cast<size_t>(chunk));
        const bool last = begin + n == prompt.size();
        backend_.forward(std::span<const int>(prompt.data() + begin, n), cache_, last ? 1 : 0, logits_.data());
    }
    stats.n_prompt = static_cast<int>(prompt.size());
    stats.prefill_s = seconds_since(t_start);

    Sampler sampler(params.sampler, model_.config.n_vocab);
    StopStringFilter stop_filter(params.stops);
    TokenStreamDecoder detok(*model_.tokenizer, /*at_start=*/false);
    std::vector<int> history = prompt;
    history.reserve(prompt.size() + static_cast<size_t>(std::max(0, params.n_predict)) + 1);

    const Clock::time_point t_decode = Clock::now();
    bool first = true;
    auto deliver = [&](const std::string& text) {
        if (first) {
            stats.ttft_s = seconds_since(t_start);
            first = false;
        }
        return text.empty() || emit(text);
    };
    for (;;) {
        const int tok = sampler.sample(logits_.data(), history);
        if (tok == model_.tokenizer->eos()) {
            stats.stop = StopReason::Eos;
            break;
        }
        ++stats.n_generated;
        history.push_back(tok);
        if (!deliver(stop_filter.push(detok.push(tok)))) {
            stats.stop = StopReason::OutputClosed;
            break;
        }
        if (stop_filter.stopped()) {
            stats.stop = StopReason::StopString;
            break;
        }
        if (params.n_predict >= 0 && stats.n_generated >= params.n_predict) {
            stats.stop = StopReason::Length;
            break;
        }
        if (cache_.n_committed() >= cache_.capacity()) {
            stats.stop = StopReason::ContextFull;
            break;
        }
        backend_.forward(std::span<const int>(&tok, 1), cache_, 1, logits_.data());
        ++stats.n_decode_forwards;
    }
    if (stats.stop != StopReason::OutputClosed && stats.stop != StopReason::StopString) {
        std::string rest = stop_filter.push(detok.flush());
        rest += stop_filter.flush();
        if (!deliver(rest)) stats.stop = StopReason::OutputClosed;
    }
    if (first) stats.ttft_s = seconds_since(t_start);
    stats.decode_s = seconds_since(t_decode);
    return stats;
}

}  // namespace tandem
