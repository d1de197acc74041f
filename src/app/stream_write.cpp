// write_all / write_stdout: see stream_write.h. A write blocked on a full pipe or terminal (a slow reader) is
// where a Ctrl-C lands most often; stdio's fwrite/fflush report that EINTR as a plain failure, so the text goes
// straight to write(2) and an interrupted call is simply made again.
#include "app/stream_write.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>

namespace tandem {

bool write_all(int fd, std::string_view text) {
    while (!text.empty()) {
        const ssize_t n = ::write(fd, text.data(), text.size());
        if (n < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        text.remove_prefix(static_cast<size_t>(n));
    }
    return true;
}

bool write_stdout(std::string_view text) {
    while (std::fflush(stdout) != 0) {
        if (errno != EINTR) return false;
        std::clearerr(stdout);
    }
    return write_all(STDOUT_FILENO, text);
}

}  // namespace tandem
