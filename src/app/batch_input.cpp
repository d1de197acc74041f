// Reading --batch's lines (batch_input.h).
#include "app/batch_input.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string_view>

#include "app/batch_request.h"
#include "error.h"

namespace tandem {

namespace {

std::string read_batch_file(const std::string& path) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) throw Error(path + ": is a directory, not a batch file");
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(path + ": cannot open the batch file: " + std::strerror(errno));
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) throw Error(path + ": cannot read the batch file");
    return ss.str();
}

}  // namespace

BatchInput::BatchInput(const std::string& path) : stdin_(path == "-") {
    if (stdin_) return;
    text_ = read_batch_file(path);
    size_t n = 0;
    for (size_t at = 0; at < text_.size();) {
        const size_t end = std::min(text_.find('\n', at), text_.size());
        if (!is_blank_line(std::string_view(text_).substr(at, end - at))) ++n;
        at = end + 1;
    }
    requests_ = n;
}

std::optional<std::string> BatchInput::next_line() {
    std::string line;
    if (stdin_) {
        if (!std::getline(std::cin, line)) return std::nullopt;
    } else {
        if (at_ >= text_.size()) return std::nullopt;
        const size_t end = std::min(text_.find('\n', at_), text_.size());
        line = text_.substr(at_, end - at_);
        at_ = end + 1;
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    ++line_number_;
    return line;
}

}  // namespace tandem
