// ReasoningSplitter (reasoning_split.h): a small state machine over the text held back so far. Every cut it makes is
// just before an ASCII '<' or '\n' (or at the end of a piece), so the UTF-8 characters of the input stay whole.
#include "text/reasoning_split.h"

#include <algorithm>
#include <utility>

namespace tandem {
namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// The length of the longest proper suffix of `s` that is a prefix of `tag` (what may become the tag).
size_t partial_tag(std::string_view s, std::string_view tag) {
    for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
        if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
    return 0;
}

}  // namespace

ReasoningSplitter::ReasoningSplitter(bool opened, Sink sink)
    : sink_(std::move(sink)), state_(opened ? State::ReasoningStart : State::Start), saw_reasoning_(opened) {}

bool ReasoningSplitter::emit(Part part, std::string_view text) {
    if (text.empty() || stopped_) return !stopped_;
    if (!sink_(part, text)) stopped_ = true;
    return !stopped_;
}

bool ReasoningSplitter::push(std::string_view text) {
    if (stopped_) return false;
    held_.append(text);
    return drain(false);
}

bool ReasoningSplitter::finish() {
    if (stopped_) return false;
    return drain(true);
}

bool ReasoningSplitter::drain(bool end) {
    for (;;) {
        switch (state_) {
            case State::Start: {
                // Whitespace, then either "<think>" (a think block) or anything else (all answer).
                const size_t text_at = held_.find_first_not_of(" \t\r\n");
                if (text_at == std::string::npos) {
                    if (!end) return true;  // only whitespace so far: undecided
                    state_ = State::Answer;
                    continue;
                }
                const std::string_view rest = std::string_view(held_).substr(text_at);
                if (starts_with(rest, kOpen)) {
                    held_.erase(0, text_at + kOpen.size());
                    saw_reasoning_ = true;
                    state_ = State::ReasoningStart;
                    continue;
                }
                if (!end && rest.size() < kOpen.size() && starts_with(kOpen, rest)) return true;  // "<thi…"
                state_ = State::Answer;
                continue;
            }
            case State::ReasoningStart: {
                const size_t text_at = held_.find_first_not_of('\n');
                if (text_at == std::string::npos) {
                    held_.clear();
                    return true;  // newlines after "<think>" are not reasoning; at the end nothing is left
                }
                held_.erase(0, text_at);
                state_ = State::Reasoning;
                continue;
            }
            case State::Reasoning: {
                const size_t close = held_.find(kClose);
                if (close != std::string::npos) {
                    size_t text_end = close;
                    while (text_end > 0 && held_[text_end - 1] == '\n') --text_end;
                    if (!emit(Part::Reasoning, std::string_view(held_).substr(0, text_end))) return false;
                    held_.erase(0, close + kClose.size());
                    state_ = State::AfterClose;
                    continue;
                }
                // Hold a possible "</thi…" at the end and the newlines just before it (or at the very end): they
                // are dropped if the tag follows, and are reasoning otherwise.
                size_t keep = end ? held_.size() : held_.size() - partial_tag(held_, kClose);
                while (keep > 0 && held_[keep - 1] == '\n') --keep;
                if (!emit(Part::Reasoning, std::string_view(held_).substr(0, keep))) return false;
                if (end) {
                    held_.clear();  // an unfinished reasoning: its trailing newlines go
                } else {
                    held_.erase(0, keep);
                }
                return true;
            }
            case State::AfterClose: {
                const size_t text_at = held_.find_first_not_of('\n');
                if (text_at == std::string::npos) {
                    held_.clear();
                    return true;
                }
                held_.erase(0, text_at);
                state_ = State::Answer;
                continue;
            }
            case State::Answer: {
                const bool ok = emit(Part::Answer, held_);
                held_.clear();
                return ok;
            }
        }
    }
}

}  // namespace tandem
