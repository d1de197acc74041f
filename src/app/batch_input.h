// The input of --batch: its lines, from a file or stdin, numbered as the records' default ids number them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace tandem {

// The lines to answer: a file is read whole at once (so a file that cannot be read fails before any model loads,
// and its number of requests is known for the progress line); stdin is read line by line as lines arrive, so a
// producer can feed a long-running batch.
class BatchInput {
public:
    // `path` "-": stdin. Throws tandem::Error naming a file that cannot be read.
    explicit BatchInput(const std::string& path);
    // The next line without its newline (nor a CR before it), or nullopt after the last.
    std::optional<std::string> next_line();
    // The 1-based number of the line next_line() returned last.
    uint64_t line_number() const { return line_number_; }
    // A file's non-blank lines (its records to come, from the start); nullopt for stdin.
    std::optional<size_t> requests() const { return requests_; }

private:
    bool stdin_ = false;
    std::string text_;  // a file's bytes
    size_t at_ = 0;     // where the next line of text_ starts
    uint64_t line_number_ = 0;
    std::optional<size_t> requests_;
};

}  // namespace tandem
