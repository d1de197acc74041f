// answer_record (answer_record.h).
#include "app/answer_record.h"

#include <cstdio>

#include "json/json_value.h"

namespace tandem {

namespace {

std::string number(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", v);
    return buf;
}

const char* stop_name(StopReason reason) {
    switch (reason) {
        case StopReason::Eos: return "eos";
        case StopReason::Length: return "length";
        case StopReason::StopString: return "stop_string";
        case StopReason::ContextFull: return "context_full";
        case StopReason::OutputClosed: return "output_closed";
    }
    return "unknown";
}

}  // namespace

std::string answer_record(const std::string& text, const std::optional<std::string>& reasoning,
                          const GenerationStats& stats) {
    return "{" + answer_record_fields(text, reasoning, stats) + "}";
}

std::string answer_record_fields(const std::string& text, const std::optional<std::string>& reasoning,
                                 const GenerationStats& st) {
    std::string out = "\"text\": " + json_quote(text);
    if (reasoning) out += ", \"reasoning\": " + json_quote(*reasoning);
    out += ", \"prompt_tokens\": " + std::to_string(st.n_prompt);
    out += ", \"generated_tokens\": " + std::to_string(st.n_generated);
    out += ", \"stop\": \"" + std::string(stop_name(st.stop)) + "\"";
    out += ", \"time_to_first_token_s\": " + number(st.ttft_s);
    out += ", \"prefill_tokens_per_s\": " + number(st.prefill_s > 0 ? (st.n_prompt - st.n_cached) / st.prefill_s : 0.0);
    out += ", \"decode_tokens_per_s\": " + number(st.decode_s > 0 ? st.n_generated / st.decode_s : 0.0);
    if (st.speculative) {
        out += ", \"drafted\": " + std::to_string(st.spec.drafted);
        out += ", \"accepted\": " + std::to_string(st.spec.accepted);
        out += ", \"acceptance\": " +
               number(st.spec.drafted > 0 ? static_cast<double>(st.spec.accepted) / st.spec.drafted : 0.0);
    }
    return out;
}

}  // namespace tandem
