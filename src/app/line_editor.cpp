// LineEditor: libedit setup (keys, Ctrl-C binding, history file) for the chat REPL.
#include "app/line_editor.h"

#include <histedit.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>

namespace tandem {
namespace {

void make_dirs(const std::string& path) {
    for (size_t i = 1; i < path.size(); ++i)
        if (path[i] == '/') ::mkdir(path.substr(0, i).c_str(), 0700);
}

}  // namespace

LineEditor::LineEditor(const std::string& history_path, FILE* out) : history_path_(history_path), out_(out) {
    el_ = el_init("tandem", stdin, out, stderr);
    el_set(el_, EL_CLIENTDATA, this);
    el_set(el_, EL_EDITOR, "emacs");
    // libedit restores the terminal and re-raises on the signals that stop or end the program, and follows
    // window resizes.
    el_set(el_, EL_SIGNAL, 1);
    el_set(el_, EL_PROMPT, &LineEditor::prompt_fn);
    // Ctrl-C reaches libedit as a key (no SIGINT while a line is edited), so abandoning a line is an ordinary
    // editor action instead of a signal racing with libedit's terminal handling.
    el_set(el_, EL_SETTY, "-d", "-isig", nullptr);
    el_set(el_, EL_ADDFN, "tandem-interrupt", "abandon the line", &LineEditor::interrupt_fn);
    el_set(el_, EL_BIND, "^C", "tandem-interrupt", nullptr);
    // libedit's emacs map leaves Ctrl-R as redisplay; readline users expect reverse history search.
    el_set(el_, EL_BIND, "^R", "em-inc-search-prev", nullptr);
    el_set(el_, EL_BIND, "^S", "em-inc-search-next", nullptr);

    hist_ = history_init();
    HistEvent ev;
    history(hist_, &ev, H_SETSIZE, 1000);
    history(hist_, &ev, H_SETUNIQUE, 1);
    if (!history_path_.empty()) history(hist_, &ev, H_LOAD, history_path_.c_str());
    el_set(el_, EL_HIST, history, hist_);
    el_source(el_, nullptr);  // the user's ~/.editrc, as other libedit programs read it
}

LineEditor::~LineEditor() {
    el_end(el_);  // restores the terminal
    history_end(hist_);
}

char* LineEditor::prompt_fn(EditLine* el) {
    void* self = nullptr;
    el_get(el, EL_CLIENTDATA, &self);
    return const_cast<char*>(static_cast<LineEditor*>(self)->prompt_.c_str());
}

unsigned char LineEditor::interrupt_fn(EditLine* el, int) {
    void* self = nullptr;
    el_get(el, EL_CLIENTDATA, &self);
    auto* ed = static_cast<LineEditor*>(self);
    ed->interrupted_ = true;
    // Show "^C" after the abandoned text, as a shell does: CC_NEWLINE draws nothing more, so write the rest of
    // the line (moving the terminal's cursor to its end), the mark and the newline ourselves.
    const LineInfo* li = el_line(el);
    std::fwrite(li->cursor, 1, static_cast<size_t>(li->lastchar - li->cursor), ed->out_);
    std::fputs("^C\n", ed->out_);
    std::fflush(ed->out_);
    return CC_NEWLINE;
}

LineEditor::Result LineEditor::read_line(const std::string& prompt, std::string* line) {
    prompt_ = prompt;
    interrupted_ = false;
    int count = 0;
    const char* got = el_gets(el_, &count);
    if (interrupted_) return Result::Interrupted;
    if (!got || count <= 0) {
        // A signal that still reached the read (e.g. SIGINT sent by kill) abandons the line too.
        if (count < 0 && errno == EINTR) {
            std::fputc('\n', stderr);
            return Result::Interrupted;
        }
        return Result::Eof;
    }
    line->assign(got, static_cast<size_t>(count));
    while (!line->empty() && (line->back() == '\n' || line->back() == '\r')) line->pop_back();
    return Result::Line;
}

void LineEditor::add_history(const std::string& entry) {
    if (entry.empty()) return;
    HistEvent ev;
    history(hist_, &ev, H_ENTER, entry.c_str());
    if (history_path_.empty()) return;
    make_dirs(history_path_);
    history(hist_, &ev, H_SAVE, history_path_.c_str());
}

}  // namespace tandem
