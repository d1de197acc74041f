// Fuzz target: arbitrary bytes as a GGUF model file. The file is opened (and its metadata and tensor table
// rendered as text, as tandem-inspect prints them), loaded as a model (config, weights, tokenizer), and when that
// succeeds the CPU backend runs a forward of two tokens with logits for both. Every input must either work or be
// refused with tandem::Error: "anything missing or inconsistent is an error", so an accepted file whose forward
// then reads out of bounds is a loader bug the sanitizers report.
#include <unistd.h>

#include <filesystem>
#include <vector>

#include "error.h"
#include "fuzz_checks.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "common/architecture_fixtures.h"
#include "common/synthetic_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const tandem::fuzz::MemoryFile file(data, size);
    try {
        // What tandem-inspect prints of a file that opens: every value and tensor shape as text.
        const auto gguf = tandem::GgufFile::open(file.path());
        for (const auto& [key, value] : gguf->metadata()) (void)value.to_string(8);
        for (const tandem::GgufTensorInfo& t : gguf->tensors()) (void)t.shape_string();
        auto model = tandem::Model::load(file.path());
        tandem::fuzz::run_two_tokens(*model);
    } catch (const tandem::Error&) {
    }
    return 0;
}

namespace tandem::fuzz {

std::vector<std::pair<std::string, std::string>> fuzz_seeds() {
    // Small synthetic llama and qwen2 models, in a float and two block types (dims of whole blocks), and one whose rows
    // are shorter than a block (its matrices fall back to f16).
    struct Seed {
        const char* name;
        SyntheticShape shape;
        GgmlType type;
    };
    const Seed seeds[] = {
        {"llama-q8_0.gguf", {"s", 64, 96, 1, 4, 2, 300, 16, false, "llama"}, GgmlType::Q8_0},
        {"llama-tied-q4_0.gguf", {"s", 64, 64, 2, 2, 1, 270, 16, true, "llama"}, GgmlType::Q4_0},
        {"qwen2-f16.gguf", {"s", 32, 64, 1, 4, 2, 260, 16, false, "qwen2"}, GgmlType::F16},
        {"llama-q4_k-f16-fallback.gguf", {"s", 16, 32, 1, 2, 2, 260, 8, true, "llama"}, GgmlType::Q4_K},
    };
    const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("tandem-fuzz-seeds-" +
                                                                                 std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    std::vector<std::pair<std::string, std::string>> out;
    for (const Seed& seed : seeds) {
        const std::string path = (dir / seed.name).string();
        write_synthetic_model(path, seed.shape, seed.type);
        out.emplace_back(seed.name, read_file(path));
    }
    // Every other architecture, with its block's variations on (QK-norm, post-norms, windows, layers without RoPE,
    // rope_freqs, LongRoPE, fused Q/K/V and gate+up): the keys and tensors the loader reads for them.
    for (const std::string& name : architecture_fixture_names()) {
        const std::string path = (dir / (name + ".gguf")).string();
        write_architecture_fixture(name, path);
        out.emplace_back("arch-" + name + ".gguf", read_file(path));
    }
    std::filesystem::remove_all(dir);
    return out;
}

}  // namespace tandem::fuzz
