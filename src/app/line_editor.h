// The chat REPL's terminal input: one edited line at a time through libedit (emacs keys, arrows, Ctrl-R
// incremental history search), with Ctrl-C as a key that abandons the line, and history kept in a file.
#pragma once
#include <cstdio>
#include <string>

struct editline;
struct history;

namespace tandem {

class LineEditor {
public:
    enum class Result { Line, Interrupted, Eof };
    // `out`: where the prompt and the echoed line go (the terminal). `history_path` empty: no history file.
    LineEditor(const std::string& history_path, FILE* out);
    ~LineEditor();
    LineEditor(const LineEditor&) = delete;
    LineEditor& operator=(const LineEditor&) = delete;

    // Reads one line (without its newline). Interrupted: Ctrl-C was pressed (the line is abandoned); Eof: Ctrl-D
    // on an empty line or the input ended.
    Result read_line(const std::string& prompt, std::string* line);
    // Adds an entry (possibly several lines) to the history and saves the history file.
    void add_history(const std::string& entry);

private:
    static char* prompt_fn(editline* el);
    static unsigned char interrupt_fn(editline* el, int ch);

    editline* el_ = nullptr;
    history* hist_ = nullptr;
    std::string history_path_;
    FILE* out_;
    std::string prompt_;
    bool interrupted_ = false;
};

}  // namespace tandem
