// run_repl: the chat loop — input (line editor or pipe), commands, Ctrl-C handling, streaming and summaries.
#include "app/repl.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "app/answer_record.h"
#include "app/environment.h"
#include "app/line_editor.h"
#include "app/reasoning_output.h"
#include "app/repl_session.h"
#include "app/stream_write.h"
#include "backend.h"
#include "error.h"
#include "model/model.h"

namespace tandem {
namespace {

// Set by SIGINT while an answer is generated; the emit callback sees it and stops generation. A signal handler
// may only touch a lock-free atomic, hence a file-level flag (the one global the REPL needs).
std::atomic<bool> g_interrupted{false};
static_assert(std::atomic<bool>::is_always_lock_free);

extern "C" void on_sigint(int) { g_interrupted.store(true); }

// Messages for the user on stderr, dimmed when stderr is a terminal so they stand apart from the answers. Written
// with write_all: the "[... interrupted]" line is the one most likely to meet a second Ctrl-C.
class Notes {
public:
    Notes() : dim_(isatty(STDERR_FILENO)) {}
    void dim(const std::string& text) const {
        write_all(STDERR_FILENO, dim_ ? "\x1b[2m" + text + "\x1b[0m\n" : text + "\n");
    }
    void say(const std::string& text) const { write_all(STDERR_FILENO, text + "\n"); }
    void error(const std::string& text) const { write_all(STDERR_FILENO, "tandem: error: " + text + "\n"); }

private:
    bool dim_;
};

const char* kHelp =
    "Commands:\n"
    "  /help                this list\n"
    "  /reset               forget the conversation (the system prompt stays)\n"
    "  /system [TEXT]       set the system prompt (no TEXT: show it)\n"
    "  /regen               answer the last message again\n"
    "  /undo                drop the last exchange\n"
    "  /stats               figures of the last answer\n"
    "  /save FILE           write the conversation as JSON\n"
    "  /load FILE           read a conversation written by /save\n"
    "  /grammar [GBNF]      answers follow this GBNF grammar (no GBNF: show the grammar or schema in force)\n"
    "  /grammar-file FILE   answers follow the GBNF grammar in FILE\n"
    "  /json-schema SCHEMA  answers are JSON valid against SCHEMA (inline JSON, or @FILE)\n"
    "  /grammar off         answers are free text again (also after /json-schema)\n"
    "  /quit                leave (also Ctrl-D on an empty line)\n"
    "Input: a line ending in \\ continues on the next line; \"\"\" starts and ends a block of lines.\n"
    "Keys: arrows and Ctrl-R search the history; Ctrl-C stops an answer or clears the line.\n";

std::string format(const char* fmt, double a, double b = 0, double c = 0) {
    char buf[256];
    std::snprintf(buf, sizeof buf, fmt, a, b, c);
    return buf;
}

// The one-line summary after each answer.
std::string summary(const TurnReport& r) {
    const GenerationStats& st = r.stats;
    std::string s = "[" + std::to_string(st.n_generated) + " tokens";
    if (st.decode_s > 0 && st.n_generated > 0) s += format(", %.1f tokens/s", st.n_generated / st.decode_s);
    if (st.speculative && st.spec.drafted > 0)
        s += format(", acceptance %.0f%%",
                    100.0 * static_cast<double>(st.spec.accepted) / static_cast<double>(st.spec.drafted));
    if (r.reasoning_unfinished) s += ", stopped while thinking";
    if (r.interrupted)
        s += ", interrupted";
    else if (st.stop == StopReason::ContextFull)
        s += ", the context is full";
    else if (st.stop == StopReason::Length)
        s += ", length limit";
    return s + "]";
}

std::string stats_block(const TurnReport& r, const KvCache& cache) {
    const GenerationStats& st = r.stats;
    std::string s;
    const int prefilled = st.n_prompt - st.n_cached;
    s += "prompt tokens:       " + std::to_string(prefilled) + " prefilled this turn, " + std::to_string(r.n_reused) +
         " reused from the cache" +
         (st.n_cached > 0 ? ", " + std::to_string(st.n_cached) + " loaded from the prompt cache" : std::string()) +
         " (conversation: " + std::to_string(r.n_conversation) + " tokens)\n";
    s += format("prefill:             %.3f s, %.1f tokens/s\n", st.prefill_s,
                st.prefill_s > 0 ? prefilled / st.prefill_s : 0.0);
    s += format("time to first token: %.3f s\n", st.ttft_s);
    s += "generated tokens:    " + std::to_string(st.n_generated) +
         " (stop: " + (r.interrupted ? "interrupted" : stop_reason_name(st.stop)) + ")\n";
    s += format("decode:              %.3f s, %.1f tokens/s\n", st.decode_s,
                st.decode_s > 0 ? st.n_generated / st.decode_s : 0.0);
    if (st.speculative) s += st.spec.summary(st.decode_s, st.n_generated);
    s += "context:             " + std::to_string(cache.n_committed()) + " of " + std::to_string(cache.capacity()) +
         " tokens in use\n";
    return s;
}

std::string expand_home(const std::string& path) {
    if (path.rfind("~/", 0) == 0) return environment().home + path.substr(1);
    return path;
}

std::string trim(const std::string& s) {
    const size_t b = s.find_first_not_of(" \t");
    if (b == std::string::npos) return "";
    return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

bool ends_with(const std::string& s, std::string_view tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// One user input from the terminal: a line, lines joined by a trailing backslash, or a """ block.
LineEditor::Result read_input(LineEditor& ed, std::string* input) {
    std::string line;
    LineEditor::Result r = ed.read_line(">>> ", &line);
    if (r != LineEditor::Result::Line) return r;
    if (trim(line).rfind("\"\"\"", 0) == 0) {
        std::string rest = trim(line).substr(3);
        if (rest.size() >= 3 && ends_with(rest, "\"\"\"")) {
            *input = rest.substr(0, rest.size() - 3);
            return LineEditor::Result::Line;
        }
        std::string text = rest;
        bool have = !rest.empty();
        for (;;) {
            r = ed.read_line("... ", &line);
            if (r == LineEditor::Result::Interrupted) return r;
            if (r == LineEditor::Result::Eof) break;  // Ctrl-D ends the block
            const bool closing = ends_with(line, "\"\"\"");
            if (closing) line.resize(line.size() - 3);
            if (!closing || !line.empty()) {
                if (have) text += '\n';
                text += line;
                have = true;
            }
            if (closing) break;
        }
        *input = text;
        return LineEditor::Result::Line;
    }
    std::string text;
    while (ends_with(line, "\\")) {
        line.pop_back();
        text += line + "\n";
        r = ed.read_line("... ", &line);
        if (r == LineEditor::Result::Interrupted) return r;
        if (r == LineEditor::Result::Eof) {
            line.clear();
            break;
        }
    }
    *input = text + line;
    return LineEditor::Result::Line;
}

bool is_command(const std::string& word) {
    static const char* known[] = {"/help",        "/?",     "/reset", "/clear", "/system",  "/regen",
                                  "/undo",        "/stats", "/save",  "/load",  "/grammar", "/grammar-file",
                                  "/json-schema", "/quit",  "/exit",  "/bye"};
    for (const char* k : known)
        if (word == k) return true;
    return false;
}

}  // namespace

CommandLine split_command(const std::string& input) {
    static constexpr const char* kBlank = " \t\r\n";
    CommandLine c;
    const size_t b = input.find_first_not_of(kBlank);
    if (b == std::string::npos || input[b] != '/') return c;
    const size_t e = input.find_first_of(kBlank, b);
    c.word = input.substr(b, e == std::string::npos ? std::string::npos : e - b);
    if (e == std::string::npos) return c;
    const size_t ab = input.find_first_not_of(kBlank, e);
    if (ab != std::string::npos) c.arg = input.substr(ab, input.find_last_not_of(kBlank) - ab + 1);
    return c;
}

int run_repl(const Model& model, Generator& generator, KvCache& cache, DraftModel draft, const ReplConfig& config) {
    const ChatTemplate tmpl = config.chat_template ? *config.chat_template : *ChatTemplate::by_name("raw");
    ChatSession session(model, generator, cache, draft, tmpl, config.system);
    session.prompts = config.prompts;
    const Notes notes;
    session.notice = [&](const std::string& s) { notes.dim("tandem: " + s); };

    std::unique_ptr<LineEditor> editor;
    struct sigaction old_int {};
    if (config.interactive) {
        const std::string hist = config.history_path.empty() ? environment().history_path : config.history_path;
        // Prompts go to the terminal: stdout when it is one, else stderr so a redirected stdout gets only answers.
        editor = std::make_unique<LineEditor>(hist, isatty(STDOUT_FILENO) ? stdout : stderr);
        // No SA_RESTART: a Ctrl-C during a blocking read should interrupt it rather than wait. Writes of answers
        // and notes go through write_all, which finishes a write that the signal interrupted.
        struct sigaction sa {};
        sa.sa_handler = on_sigint;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = 0;
        sigaction(SIGINT, &sa, &old_int);
        const std::string thinking =
            tmpl.supports_thinking() ? std::string(", thinking ") + (tmpl.thinking() ? "on" : "off") : "";
        notes.dim("tandem: chat with " + config.model_name + " (template " + tmpl.name() + thinking + ", context " +
                  std::to_string(cache.capacity()) + " tokens). /help for commands, Ctrl-D or /quit to leave.");
    }

    TurnReport last;
    bool have_last = false;
    bool output_closed = false;

    // The grammar in force (the flags', then /grammar's). Each answer gets a fresh copy of its constraint, so every
    // answer follows it from its own start; the masks' figures of the last answer are kept for /stats.
    std::optional<AnswerGrammar> in_force = config.grammar;
    std::optional<grammar::TokenConstraint> turn_constraint;
    struct Masks {
        int calls = 0;
        double seconds = 0;
    } masks_before, last_masks;  // the figures are shared by a constraint's copies: a turn's are the change
    auto turn_params = [&] {
        GenerationParams p = config.params;
        turn_constraint.reset();
        if (in_force) {
            turn_constraint.emplace(in_force->for_answer());
            p.constraint = &*turn_constraint;
            masks_before = {turn_constraint->mask_calls(), turn_constraint->mask_seconds()};
        }
        return p;
    };

    // A reasoning model's thinking: dimmed on stderr (or stdout with --show-thinking), never in the conversation.
    // With jsonl and --show-thinking it goes into the record instead (TurnReport::reasoning).
    const bool reasoning_in_record = config.jsonl && config.show_thinking;
    ReasoningPrinter printer(config.show_thinking && !config.jsonl);
    session.on_reasoning = [&](std::string_view text) {
        if (g_interrupted.load()) return false;
        if (reasoning_in_record) return true;
        if (!printer.reasoning(text)) {
            output_closed = true;
            return false;
        }
        return true;
    };

    // Streams one answer; returns false when the program should end (stdout closed).
    auto run_turn = [&](auto&& call) -> bool {
        g_interrupted.store(false);
        auto emit = [&](std::string_view text) {
            if (g_interrupted.load()) return false;
            if (config.jsonl) return true;  // the answer is in the record (TurnReport::answer)
            if (!printer.end() || !write_stdout(text)) {
                output_closed = true;
                return false;
            }
            return true;
        };
        try {
            last = call(emit);
            have_last = true;
        } catch (const Error& e) {
            printer.end(false);
            notes.error(e.what());
            return true;
        }
        last_masks = {};
        if (turn_constraint)
            last_masks = {turn_constraint->mask_calls() - masks_before.calls,
                          turn_constraint->mask_seconds() - masks_before.seconds};
        if (!printer.end(!last.reasoning_unfinished)) output_closed = true;
        if (output_closed) return false;
        // Every answer ends with a newline: one answer per line in --chat, and the prompt starts a fresh line. With
        // jsonl the line is the answer's record.
        const std::optional<std::string> reasoning =
            reasoning_in_record && tmpl.supports_thinking() ? std::optional<std::string>(last.reasoning) : std::nullopt;
        if (!write_stdout(config.jsonl ? answer_record(last.answer, reasoning, last.stats) + "\n" : "\n")) return false;
        notes.dim(summary(last));
        return true;
    };

    // /grammar, /grammar-file, /json-schema. A grammar that does not parse, or that cannot apply, is an error and
    // the one in force stays.
    auto grammar_command = [&](const std::string& word, const std::string& arg) {
        if (word == "/grammar" && arg.empty()) {
            notes.say(in_force ? in_force->description : "no grammar: answers are free text");
            return;
        }
        if (word == "/grammar" && arg == "off") {
            notes.dim(in_force ? "tandem: grammar off: answers are free text" : "tandem: no grammar was in force");
            in_force.reset();
            return;
        }
        if (arg.empty()) {
            notes.error(word == "/grammar-file" ? "usage: /grammar-file FILE"
                                                : "usage: /json-schema SCHEMA (inline JSON, or @FILE)");
            return;
        }
        const GrammarSource source = word == "/grammar"        ? GrammarSource::Gbnf
                                     : word == "/grammar-file" ? GrammarSource::GbnfFile
                                                               : GrammarSource::JsonSchema;
        const std::string expanded = source == GrammarSource::GbnfFile ? expand_home(arg)
                                     : source == GrammarSource::JsonSchema && arg[0] == '@'
                                         ? "@" + expand_home(arg.substr(1))
                                         : arg;
        try {
            grammar::TokenConstraint constraint = answer_constraint(model, read_grammar(source, expanded), tmpl);
            in_force.emplace(AnswerGrammar{describe_grammar(source, arg), std::move(constraint)});
            notes.dim(std::string("tandem: answers now follow the ") +
                      (source == GrammarSource::JsonSchema ? "JSON schema" : "grammar"));
        } catch (const Error& e) {
            notes.error(std::string(e.what()) + (in_force ? " (the grammar in force stays)" : ""));
        }
    };

    for (;;) {
        std::string input;
        if (editor) {
            const LineEditor::Result r = read_input(*editor, &input);
            if (r == LineEditor::Result::Eof) break;
            if (r == LineEditor::Result::Interrupted) continue;
            if (!trim(input).empty()) editor->add_history(input);
        } else {
            if (!std::getline(std::cin, input)) break;
            if (!input.empty() && input.back() == '\r') input.pop_back();
        }

        // Commands: a known /word. At the terminal an unknown /word is a typo; in a pipe it is just text.
        const std::string t = trim(input);
        const auto [word, arg] = split_command(input);
        if (!word.empty() && (is_command(word) || editor)) {
            if (word == "/quit" || word == "/exit" || word == "/bye") break;
            if (word == "/help" || word == "/?") {
                write_all(STDERR_FILENO, kHelp);
            } else if (word == "/reset" || word == "/clear") {
                session.reset();
                notes.dim("tandem: the conversation is cleared");
            } else if (word == "/system") {
                if (arg.empty()) {
                    notes.say(session.system().empty() ? "(no system prompt)" : session.system());
                } else {
                    session.set_system(arg);
                    notes.dim("tandem: system prompt set");
                }
            } else if (word == "/regen") {
                if (!run_turn([&](auto& emit) { return session.regenerate(turn_params(), emit); })) break;
            } else if (word == "/undo") {
                if (session.undo())
                    notes.dim("tandem: dropped the last exchange (" + std::to_string(session.messages().size()) +
                              " messages left)");
                else
                    notes.error("nothing to undo");
            } else if (word == "/grammar" || word == "/grammar-file" || word == "/json-schema") {
                grammar_command(word, arg);
            } else if (word == "/stats") {
                if (have_last) {
                    write_all(STDERR_FILENO, stats_block(last, cache));
                    if (last_masks.calls > 0)
                        notes.say(format("grammar masks:       %.0f, %.3f ms each", last_masks.calls,
                                         last_masks.seconds * 1e3 / last_masks.calls));
                } else
                    notes.say("no answer yet");
            } else if (word == "/save") {
                if (arg.empty()) {
                    notes.error("usage: /save FILE");
                    continue;
                }
                std::ofstream out(expand_home(arg), std::ios::binary);
                out << session.to_json();
                out.close();
                if (!out)
                    notes.error("cannot write " + arg);
                else
                    notes.dim("tandem: saved " + std::to_string(session.messages().size()) + " messages to " + arg);
            } else if (word == "/load") {
                if (arg.empty()) {
                    notes.error("usage: /load FILE");
                    continue;
                }
                std::ifstream in(expand_home(arg), std::ios::binary);
                if (!in) {
                    notes.error("cannot read " + arg);
                    continue;
                }
                std::ostringstream ss;
                ss << in.rdbuf();
                try {
                    std::string system;
                    std::vector<ChatMessage> messages;
                    conversation_from_json(ss.str(), &system, &messages);
                    const size_t n = messages.size();
                    session.replace(std::move(system), std::move(messages));
                    notes.dim("tandem: loaded " + std::to_string(n) + " messages from " + arg);
                } catch (const Error& e) {
                    notes.error(arg + ": " + e.what());
                }
            } else {
                notes.error("unknown command " + word + " (/help lists them)");
            }
            continue;
        }
        if (editor && t.empty()) continue;  // an empty line at the terminal asks nothing
        if (!run_turn([&](auto& emit) { return session.send(input, turn_params(), emit); })) break;
    }

    if (config.interactive) sigaction(SIGINT, &old_int, nullptr);
    editor.reset();  // restores the terminal before the program goes on
    return 0;
}

}  // namespace tandem
