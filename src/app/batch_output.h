// What --batch writes: one JSONL record per input line on stdout, and a progress line on stderr when it is a terminal.
// Independent of how the lines are run: the sequential runner of today (batch.h) hands records over in input order; a
// scheduler that runs several sequences at once will hand them over as they finish, in any order, which is why every
// record carries its line's id.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tandem {

// {"id": ID, FIELDS}: `id` is JSON text (BatchLine::id), `fields` the answer's members (answer_record_fields()).
std::string batch_answer_record(std::string_view id, std::string_view fields);

// {"id": ID, "error": "MESSAGE"}: the record of a line that did not run.
std::string batch_error_record(std::string_view id, std::string_view message);

// Writes the records to stdout, each on its own line, whole (stream_write.h), as they are handed over.
class BatchWriter {
public:
    // Each returns false when stdout is gone (a closed pipe): the run then ends quietly.
    bool answer(std::string_view id, std::string_view fields);
    bool error(std::string_view id, std::string_view message);
    size_t answered() const { return answered_; }
    size_t failed() const { return failed_; }

private:
    size_t answered_ = 0, failed_ = 0;
};

// The progress line's text: "batch: DONE/TOTAL lines[ (F failed)], X tokens/s, ETA M:SS" for a file, whose number of
// lines is known; "batch: DONE lines[ (F failed)], X tokens/s" for stdin. X counts the tokens generated over the
// time since the batch began (prefill included); the ETA assumes the remaining lines take as long as the done ones.
std::string batch_progress_line(size_t done, size_t failed, std::optional<size_t> total, uint64_t tokens,
                                double elapsed_s);

// The progress line on stderr, redrawn in place after each line, only when stderr is a terminal (a script's stderr
// stays clean). The destructor ends the line, so that an error message after it starts on a line of its own.
class BatchProgress {
public:
    explicit BatchProgress(std::optional<size_t> total);
    ~BatchProgress() { finish(); }
    BatchProgress(const BatchProgress&) = delete;
    BatchProgress& operator=(const BatchProgress&) = delete;
    // One more line done: `generated` tokens, or failed.
    void line_done(bool failed, int generated);
    // Ends the progress line (once).
    void finish();
    size_t done() const { return done_; }
    uint64_t tokens() const { return tokens_; }
    double elapsed_s() const;

private:
    std::optional<size_t> total_;
    bool enabled_;
    bool drawn_ = false;
    size_t done_ = 0, failed_ = 0;
    uint64_t tokens_ = 0;
    std::chrono::steady_clock::time_point start_;
};

}  // namespace tandem
