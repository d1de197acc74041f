// The records and the progress line of --batch (batch_output.h).
#include "app/batch_output.h"

#include <unistd.h>

#include <cstdio>

#include "app/stream_write.h"
#include "json/json_value.h"

namespace tandem {

namespace {

// M:SS, or H:MM:SS from an hour on.
std::string duration(double seconds) {
    const long s = seconds > 0 ? static_cast<long>(seconds + 0.5) : 0;
    char buf[32];
    if (s >= 3600)
        std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
    else
        std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
    return buf;
}

}  // namespace

std::string batch_answer_record(std::string_view id, std::string_view fields) {
    std::string out = "{\"id\": ";
    out += id;
    out += ", ";
    out += fields;
    return out + "}";
}

std::string batch_error_record(std::string_view id, std::string_view message) {
    std::string out = "{\"id\": ";
    out += id;
    return out + ", \"error\": " + json_quote(message) + "}";
}

bool BatchWriter::answer(std::string_view id, std::string_view fields) {
    ++answered_;
    return write_stdout(batch_answer_record(id, fields) + "\n");
}

bool BatchWriter::error(std::string_view id, std::string_view message) {
    ++failed_;
    return write_stdout(batch_error_record(id, message) + "\n");
}

std::string batch_progress_line(size_t done, size_t failed, std::optional<size_t> total, uint64_t tokens,
                                double elapsed_s) {
    std::string out = "batch: " + std::to_string(done);
    if (total) out += "/" + std::to_string(*total);
    out += done == 1 && !total ? " line" : " lines";
    if (failed > 0) out += " (" + std::to_string(failed) + " failed)";
    char buf[64];
    std::snprintf(buf, sizeof buf, ", %.1f tokens/s", elapsed_s > 0 ? tokens / elapsed_s : 0.0);
    out += buf;
    if (total && done > 0 && done < *total) out += ", ETA " + duration(elapsed_s / done * (*total - done));
    return out;
}

BatchProgress::BatchProgress(std::optional<size_t> total)
    : total_(total), enabled_(isatty(STDERR_FILENO) != 0), start_(std::chrono::steady_clock::now()) {}

double BatchProgress::elapsed_s() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void BatchProgress::line_done(bool failed, int generated) {
    ++done_;
    if (failed) ++failed_;
    tokens_ += static_cast<uint64_t>(generated > 0 ? generated : 0);
    if (!enabled_) return;
    // \r and erase-to-end-of-line: the line is redrawn in place.
    std::fprintf(stderr, "\r\033[Ktandem: %s",
                 batch_progress_line(done_, failed_, total_, tokens_, elapsed_s()).c_str());
    std::fflush(stderr);
    drawn_ = true;
}

void BatchProgress::finish() {
    if (!drawn_) return;
    std::fputc('\n', stderr);
    drawn_ = false;
}

}  // namespace tandem
