// Unit tests of stream_write.h: a write blocked on a full pipe survives signals handled without SA_RESTART (as
// the REPL's Ctrl-C is) with every byte delivered in order, and a reader that has gone away still reads as a
// failure. Before write_all, stdio's fflush returned that EINTR as an error and the REPL quit as if stdout had
// closed (seen in CI: Ctrl-C while tmux drained the terminal slowly ended the program).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <string>
#include <thread>

#include "app/stream_write.h"

using namespace tandem;

namespace {

std::atomic<int> g_signals{0};
extern "C" void count_signal(int) { g_signals.fetch_add(1); }

// Installs a handler for `sig` without SA_RESTART (blocking calls fail with EINTR) and restores the old one.
struct ScopedHandler {
    int sig;
    struct sigaction old {};
    ScopedHandler(int s, void (*fn)(int)) : sig(s) {
        struct sigaction sa {};
        sa.sa_handler = fn;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = 0;
        sigaction(sig, &sa, &old);
    }
    ~ScopedHandler() { sigaction(sig, &old, nullptr); }
};

}  // namespace

TEST_CASE("write_all delivers everything through signals that interrupt a blocked write") {
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    fcntl(fds[1], F_SETPIPE_SZ, 4096);  // a small pipe if the system allows; the text is larger than any default
    std::string text(1 << 20, '\0');
    for (size_t i = 0; i < text.size(); ++i) text[i] = static_cast<char>('a' + (i * 7 + i / 4096) % 26);

    const ScopedHandler handler(SIGUSR1, count_signal);
    g_signals = 0;
    const pthread_t writer = pthread_self();
    std::string received;
    std::thread reader([&] {
        // The pipe cannot hold the text, so the writer is inside write_all until the drain below: every signal
        // lands in a write that is blocked or has delivered only part of its bytes.
        for (int i = 0; i < 5; ++i) {
            usleep(20000);
            pthread_kill(writer, SIGUSR1);
        }
        usleep(20000);
        char buf[65536];
        ssize_t n;
        while ((n = read(fds[0], buf, sizeof buf)) > 0) received.append(buf, static_cast<size_t>(n));
    });
    const bool ok = write_all(fds[1], text);
    close(fds[1]);
    reader.join();
    close(fds[0]);
    CHECK(ok);
    CHECK(g_signals.load() == 5);
    CHECK(received.size() == text.size());
    // The first byte that differs (a lost or repeated piece), rather than a megabyte of text on failure.
    const size_t common = std::min(received.size(), text.size());
    size_t first_difference = 0;
    while (first_difference < common && received[first_difference] == text[first_difference]) ++first_difference;
    CHECK(first_difference == common);
}

TEST_CASE("write_all fails when the reader has gone") {
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    close(fds[0]);
    const ScopedHandler no_sigpipe(SIGPIPE, SIG_IGN);
    CHECK_FALSE(write_all(fds[1], "text"));
    close(fds[1]);
}

TEST_CASE("write_all of nothing writes nothing and succeeds") {
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    CHECK(write_all(fds[1], ""));
    close(fds[1]);
    char c;
    CHECK(read(fds[0], &c, 1) == 0);
    close(fds[0]);
}
