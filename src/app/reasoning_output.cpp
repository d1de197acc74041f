// ReasoningPrinter (reasoning_output.h). Each piece is dimmed on its own (faint on, text, reset), so that a Ctrl-C
// or a closed pipe between two pieces never leaves the terminal faint.
#include "app/reasoning_output.h"

#include <unistd.h>

#include <string>

#include "app/stream_write.h"

namespace tandem {

ReasoningPrinter::ReasoningPrinter(bool to_stdout)
    : fd_(to_stdout ? STDOUT_FILENO : STDERR_FILENO), dim_(isatty(fd_)), tags_(to_stdout) {}

bool ReasoningPrinter::write(std::string_view text) const {
    if (text.empty()) return true;
    const std::string out = dim_ ? "\x1b[2m" + std::string(text) + "\x1b[0m" : std::string(text);
    if (fd_ == STDOUT_FILENO) return write_stdout(out);
    write_all(fd_, out);
    return true;
}

bool ReasoningPrinter::reasoning(std::string_view text) {
    if (text.empty()) return true;
    if (!open_) {
        open_ = true;
        if (tags_ && !write("<think>\n")) return false;
    }
    return write(text);
}

bool ReasoningPrinter::end(bool closed) {
    if (!open_) return true;
    open_ = false;
    return write(tags_ && closed ? "\n</think>\n\n" : "\n");
}

}  // namespace tandem
