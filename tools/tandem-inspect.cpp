// tandem-inspect: prints a GGUF file's header, metadata and tensor table, with per-type totals, in readable form.
// It validates the file exactly as the model loader does (GgufFile::open), so it doubles as a corruption check.
#include <CLI/CLI.hpp>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "gguf/ggml_types.h"
#include "gguf/gguf.h"

namespace {

// A closed pipe (`tandem-inspect f.gguf | head`) is a normal way for the reader to say "enough": stop quietly
// with status 0. Any other write error is real (e.g. a full disk) and is reported.
[[noreturn]] void stdout_failed() {
    int err = errno;
    if (err == EPIPE) std::_Exit(0);
    std::fprintf(stderr, "tandem-inspect: cannot write to stdout: %s\n", std::strerror(err));
    std::_Exit(1);
}

void emit(const std::string& line) {
    if (std::fwrite(line.data(), 1, line.size(), stdout) != line.size() || std::fputc('\n', stdout) == EOF)
        stdout_failed();
}

std::string pad(const std::string& s, size_t width) {
    return s.size() >= width ? s : s + std::string(width - s.size(), ' ');
}
std::string pad_left(const std::string& s, size_t width) {
    return s.size() >= width ? s : std::string(width - s.size(), ' ') + s;
}

std::string human_bytes(uint64_t n) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double x = static_cast<double>(n);
    int u = 0;
    while (x >= 1024 && u < 4) {
        x /= 1024;
        ++u;
    }
    char buf[32];
    if (u == 0)
        std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(n));
    else
        std::snprintf(buf, sizeof buf, "%.1f %s", x, units[u]);
    return buf;
}

// Chat templates and the like run to kilobytes; one metadata line shows the start and says how long it is.
std::string render_value(const tandem::GgufValue& v, size_t max_items) {
    constexpr size_t kMaxStringBytes = 120;
    if (v.type != tandem::GgufValueType::STRING || v.str.size() <= kMaxStringBytes) return v.to_string(max_items);
    size_t cut = kMaxStringBytes;
    while (cut > 0 && (static_cast<unsigned char>(v.str[cut]) & 0xC0) == 0x80) --cut;  // stay on a UTF-8 boundary
    tandem::GgufValue head = v;
    head.str = v.str.substr(0, cut);
    return head.to_string(max_items) + "... (" + std::to_string(v.str.size()) + " bytes)";
}

std::string type_label(const tandem::GgufValue& v) {
    if (v.type == tandem::GgufValueType::ARRAY) return "array";
    return tandem::gguf_value_type_name(v.type);
}

void print(const tandem::GgufFile& f, size_t max_items) {
    emit("file:        " + f.path() + " (" + std::to_string(f.file_size()) + " bytes, " +
         human_bytes(f.file_size()) + ")");
    emit("version:     " + std::to_string(f.version()));
    emit("alignment:   " + std::to_string(f.alignment()));
    emit("data offset: " + std::to_string(f.data_offset()));
    emit("metadata:    " + std::to_string(f.metadata().size()) + " keys");
    emit("tensors:     " + std::to_string(f.tensors().size()));

    emit("");
    emit("metadata:");
    size_t key_width = 0;
    for (const auto& kv : f.metadata()) key_width = std::max(key_width, std::min<size_t>(kv.first.size(), 48));
    for (const auto& [key, value] : f.metadata())
        emit("  " + pad(key, key_width) + "  " + pad(type_label(value), 6) + "  " + render_value(value, max_items));

    if (f.tensors().empty()) return;

    emit("");
    emit("tensors:");
    struct Row {
        std::string name, type, shape, offset, bytes;
    };
    std::vector<Row> rows;
    rows.push_back({"name", "type", "shape", "offset", "bytes"});
    struct Total {
        uint64_t count = 0, elements = 0, bytes = 0;
        bool supported = true;
    };
    std::map<std::string, Total> totals;
    Total all;
    for (const tandem::GgufTensorInfo& t : f.tensors()) {
        const char* type = tandem::ggml_type_name(t.type);
        rows.push_back({t.name, type, t.shape_string(), std::to_string(t.offset), std::to_string(t.n_bytes)});
        totals[type].supported = tandem::ggml_type_info(t.type).supported;
        for (Total* total : {&totals[type], &all}) {
            total->count += 1;
            total->elements += t.n_elements();
            total->bytes += t.n_bytes;
        }
    }
    size_t w[5] = {};
    for (const Row& r : rows) {
        w[0] = std::max(w[0], r.name.size());
        w[1] = std::max(w[1], r.type.size());
        w[2] = std::max(w[2], r.shape.size());
        w[3] = std::max(w[3], r.offset.size());
        w[4] = std::max(w[4], r.bytes.size());
    }
    for (const Row& r : rows)
        emit("  " + pad(r.name, w[0]) + "  " + pad(r.type, w[1]) + "  " + pad(r.shape, w[2]) + "  " +
             pad_left(r.offset, w[3]) + "  " + pad_left(r.bytes, w[4]));

    emit("");
    emit("totals:");
    auto total_line = [&](const std::string& label, const Total& t) {
        emit("  " + pad(label, 8) + pad_left(std::to_string(t.count), 6) + " tensors  " +
             pad_left(std::to_string(t.elements), 14) + " elements  " + pad_left(std::to_string(t.bytes), 14) +
             " bytes (" + human_bytes(t.bytes) + ")" + (t.supported ? "" : "  [type not supported by tandem]"));
    };
    for (const auto& [type, total] : totals) total_line(type, total);
    total_line("all", all);
}

}  // namespace

int main(int argc, char** argv) {
    // Without this a closed pipe kills the process by signal; with it writes fail with EPIPE, handled above.
    std::signal(SIGPIPE, SIG_IGN);

    CLI::App app{"Print the header, metadata and tensor table of a GGUF file (validating it on the way)."};
    std::string path;
    size_t max_items = 8;
    app.add_option("file", path, "GGUF file to inspect")->required();
    app.add_option("--items", max_items, "Array elements shown per metadata value")->capture_default_str();
    CLI11_PARSE(app, argc, argv);

    try {
        std::unique_ptr<tandem::GgufFile> file = tandem::GgufFile::open(path);
        print(*file, max_items);
    } catch (const std::exception& e) {
        // Parsing finishes before the first line is printed, so a bad file leaves stdout empty.
        std::fflush(stdout);
        std::fprintf(stderr, "tandem-inspect: %s\n", e.what());
        return 1;
    }
    if (std::fflush(stdout) != 0 || std::ferror(stdout)) stdout_failed();
    return 0;
}
