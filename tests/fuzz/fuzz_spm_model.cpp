// Fuzz target: arbitrary bytes as a sentencepiece .model file (the --tokenizer override): our protobuf reader
// (sentencepiece_proto.h), then libsentencepiece on what it accepted. Loading either works or throws
// tandem::Error; a tokenizer that loads encodes a fixed text into ids in range, which stream as decode() renders
// them.
#include <string>
#include <vector>

#include "error.h"
#include "fuzz_checks.h"
#include "text/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const tandem::fuzz::MemoryFile file(data, size);
    try {
        const auto tok = tandem::Tokenizer::from_model_file(file.path());
        const std::vector<int> ids = tok->encode("Hello world, caf\xc3\xa9 \xe2\x96\x81 \xf0\x9f\x98\x80\n", true);
        for (int id : ids)
            if (id < 0 || id >= tok->n_vocab()) tandem::fuzz::fail("encode gave id " + std::to_string(id));
        tandem::fuzz::check_stream(*tok, ids);
    } catch (const tandem::Error&) {
    }
    return 0;
}

namespace tandem::fuzz {

std::vector<std::pair<std::string, std::string>> fuzz_seeds() {
    // tok512.model: a 512-piece llama2.c tokenizer (identity rules); nfkc512.model: sentencepiece's own trainer
    // with its nmt_nfkc rules, so a real normalization trie (tests/data/PROVENANCE.md).
    std::vector<std::pair<std::string, std::string>> out;
    for (const char* name : {"tok512.model", "nfkc512.model"}) {
        out.emplace_back(name, read_file(data_dir() + "/" + name));
    }
    return out;
}

}  // namespace tandem::fuzz
