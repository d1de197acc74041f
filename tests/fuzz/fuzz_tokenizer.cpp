// Fuzz target: the tokenizers on arbitrary text and arbitrary id sequences, against their documented properties.
// Input: byte 0 picks the vocabulary (Qwen2's, Llama 3's and Qwen3.5's byte-level BPE, Llama 2's and Phi-3's
// sentencepiece-style ones: the tests/data vocabularies) and the mode, the rest is the payload.
//   text:    encode(payload) without special tokens; every id in range; byte-level BPE is lossless, so
//            decode(encode(text)) == text with invalid UTF-8 replaced by U+FFFD (utf8::sanitize); so is Llama 2's
//            vocabulary (byte fallback, the space prefix dropped again) for valid UTF-8 without a literal "▁",
//            which would come back as a space (Phi-3's is not: a space prefix follows its user-defined "</s>").
//            Invalid UTF-8 is lossy there, as in llama.cpp: spaces become "▁" before the text is cut into
//            characters, so a stray lead byte can claim part of one;
//   special: encode(payload, add_bos, parse_special) (the chat template's path);
//   ids:     the payload as little-endian 32-bit ids modulo the vocabulary size.
// In every mode the ids go through TokenStreamDecoder, whose pushes and flush must concatenate to decode(ids)
// and each be whole UTF-8 characters (tokenizer.h).
#include <sys/types.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "error.h"
#include "fuzz_checks.h"
#include "gguf/gguf.h"
#include "text/tokenizer.h"

namespace {

using tandem::Tokenizer;

// tests/data/NAME, or NAME.xz unpacked once into a temp directory.
std::unique_ptr<Tokenizer> load_vocabulary(const std::string& name) {
    std::string path = tandem::fuzz::data_dir() + "/" + name;
    if (!std::filesystem::exists(path)) {
        const std::filesystem::path dir =
            std::filesystem::temp_directory_path() / ("tandem-fuzz-vocab-" + std::to_string(getpid()));
        std::filesystem::create_directories(dir);
        const std::string out = (dir / name).string();
        const std::string cmd = "xz -dc '" + path + ".xz' > '" + out + "'";
        if (std::system(cmd.c_str()) != 0) tandem::fuzz::fail("cannot unpack " + path + ".xz (xz-utils)");
        path = out;
        auto tok = Tokenizer::from_gguf(*tandem::GgufFile::open(path));
        std::filesystem::remove_all(dir);
        return tok;
    }
    return Tokenizer::from_gguf(*tandem::GgufFile::open(path));
}

struct Vocabulary {
    std::unique_ptr<Tokenizer> tokenizer;
    bool byte_level;                           // byte-level BPE: encoding is lossless
    bool lossless_without_space_mark = false;  // sentencepiece-style, lossless for UTF-8 text without "▁"
};

const std::vector<Vocabulary>& vocabularies() {
    static const std::vector<Vocabulary> all = [] {
        std::vector<Vocabulary> v;
        v.push_back({load_vocabulary("ggml-vocab-qwen2.gguf"), true});
        v.push_back({load_vocabulary("ggml-vocab-llama-bpe.gguf"), true});
        v.push_back({load_vocabulary("ggml-vocab-llama-spm.gguf"), false, true});
        v.push_back({load_vocabulary("ggml-vocab-qwen35.gguf"), true});
        v.push_back({load_vocabulary("ggml-vocab-phi-3.gguf"), false});
        return v;
    }();
    return all;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1) return 0;
    const auto& vocabs = vocabularies();
    const Vocabulary& vocab = vocabs[data[0] % vocabs.size()];
    const Tokenizer& tok = *vocab.tokenizer;
    const int mode = (data[0] / vocabs.size()) % 3;
    const std::string_view payload(reinterpret_cast<const char*>(data + 1), size - 1);
    std::vector<int> ids;
    if (mode == 0 || mode == 1) {
        ids = tok.encode(payload, mode == 1, mode == 1);
        for (int id : ids)
            if (id < 0 || id >= tok.n_vocab()) tandem::fuzz::fail("encode gave id " + std::to_string(id));
        if (mode == 0 && vocab.byte_level && tok.decode(ids) != tandem::utf8::sanitize(payload))
            tandem::fuzz::fail("byte-level BPE did not decode its encoding back to the text");
        if (mode == 0 && vocab.lossless_without_space_mark && payload.find("\xE2\x96\x81") == std::string::npos &&
            tandem::utf8::sanitize(payload) == payload && tok.decode(ids) != payload)
            tandem::fuzz::fail("the sentencepiece-style vocabulary did not decode its encoding back to the text");
    } else {
        for (size_t at = 0; at + 4 <= payload.size(); at += 4) {
            uint32_t v;
            std::memcpy(&v, payload.data() + at, 4);
            ids.push_back(static_cast<int>(v % static_cast<uint32_t>(tok.n_vocab())));
        }
    }
    tandem::fuzz::check_stream(tok, ids);
    return 0;
}

namespace tandem::fuzz {

std::vector<std::pair<std::string, std::string>> fuzz_seeds() {
    // The llama.cpp tokenizer test cases (tests/data/*.inp) split at their separators, for each vocabulary and
    // text mode, and a few id sequences.
    std::vector<std::pair<std::string, std::string>> out;
    const std::string sep = "\n__ggml_vocab_test__\n";
    std::vector<std::string> texts;
    for (const char* inp :
         {"ggml-vocab-qwen2.gguf.inp", "ggml-vocab-llama-spm.gguf.inp", "ggml-vocab-qwen35.gguf.inp"}) {
        const std::string all = read_file(data_dir() + "/" + inp);
        for (size_t at = 0; at < all.size();) {
            const size_t end = std::min(all.find(sep, at), all.size());
            texts.push_back(all.substr(at, end - at));
            at = end + sep.size();
        }
    }
    texts.push_back("<|im_start|>user\nHi <s> [INST] <0x0A>\xe2\x96\x81 caf\xc3\xa9 \xff\xfe<|im_end|>");
    // Phi-3's special tokens (whitespace after them is stripped), its user-defined "</s>", a padding token typed
    // "unknown"; invalid UTF-8 whose lead bytes claim the ASCII after them.
    texts.push_back(
        "<|user|>\n Hi</s>  x<|end|>\n<|assistant|>\t[PAD32011] <unk><s>\xC3"
        "A\xF0 b\xE2\x96");
    const size_t n_vocabs = 5;
    for (size_t v = 0; v < n_vocabs; ++v)
        for (int mode = 0; mode < 2; ++mode)
            for (size_t i = 0; i < texts.size(); i += 7) {
                const char selector = static_cast<char>(v + n_vocabs * static_cast<size_t>(mode));
                out.emplace_back("v" + std::to_string(v) + "-m" + std::to_string(mode) + "-" + std::to_string(i),
                                 selector + texts[i]);
            }
    for (size_t v = 0; v < n_vocabs; ++v) {
        std::string ids(1, static_cast<char>(v + n_vocabs * 2));
        for (uint32_t id : {1u, 2u, 13u, 300u, 3000u, 30000u, 128000u, 151643u, 151645u, 259u, 131u, 32011u, 29871u}) {
            char bytes[4];
            std::memcpy(bytes, &id, 4);
            ids.append(bytes, 4);
        }
        out.emplace_back("v" + std::to_string(v) + "-ids", ids);
    }
    return out;
}

}  // namespace tandem::fuzz
