// Writing generated text and notes to the standard streams so that a signal handled without SA_RESTART (the
// REPL's Ctrl-C) neither loses text nor reads as a reader that has gone away.
#pragma once
#include <string_view>

namespace tandem {

// Writes all of `text` to `fd`, going on after EINTR and short writes. False only when the descriptor fails for
// another reason (EPIPE: the reader is gone).
bool write_all(int fd, std::string_view text);

// write_all to stdout, after flushing what stdio holds for it so earlier text keeps its place.
bool write_stdout(std::string_view text);

}  // namespace tandem
