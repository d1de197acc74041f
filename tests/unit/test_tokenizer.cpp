// Tokenizer tests: the ModelProto serializer against real .model files, llama.cpp's 46 cases for the Llama 2 and
// Phi-3 sentencepiece vocabularies, the stories260K prompts and texts from llama2.c, the streaming decoder (byte
// pieces, invalid bytes, control tokens, random sequences) and the errors a user can run into.
#include <doctest/doctest.h>
#include <sentencepiece_processor.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>

#include "error.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "reference_files.h"
#include "text/sentencepiece_proto.h"
#include "test_paths.h"
#include "text/tokenizer.h"

using namespace tandem;

namespace {

const std::string kData = TANDEM_TEST_DATA;

std::string slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    REQUIRE(in);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::unique_ptr<Tokenizer> gguf_tokenizer(const std::string& name) {
    auto file = GgufFile::open(kData + "/" + name);
    return Tokenizer::from_gguf(*file);  // the tokenizer copies what it needs; the file may close
}

const Tokenizer& llama_vocab() {
    static const auto tok = gguf_tokenizer("ggml-vocab-llama-spm.gguf");
    return *tok;
}

// Phi-3's vocabulary: Llama 2's pieces plus 64 added tokens; architecture phi3, which tandem does not run.
const Tokenizer& phi3_vocab() {
    static const auto tok = gguf_tokenizer("ggml-vocab-phi-3.gguf");
    return *tok;
}

const Tokenizer& stories_vocab() {
    static const auto tok = gguf_tokenizer("stories260K.gguf");
    return *tok;
}

// llama.cpp's tokenizer test pairs: inputs separated by "\n__ggml_vocab_test__\n" (the file ends with one, so
// the last split is empty and not a case), expected ids one line per input.
struct VocabCase {
    std::string text;
    std::vector<int> ids;
};

std::vector<VocabCase> read_vocab_cases(const std::string& base) {
    const std::string inp = slurp(base + ".inp");
    const std::string sep = "\n__ggml_vocab_test__\n";
    std::vector<std::string> texts;
    size_t start = 0;
    for (size_t at; (at = inp.find(sep, start)) != std::string::npos; start = at + sep.size())
        texts.push_back(inp.substr(start, at - start));
    REQUIRE(start == inp.size());  // nothing after the last separator

    std::istringstream out(slurp(base + ".out"));
    std::vector<VocabCase> cases;
    std::string line;
    for (const std::string& text : texts) {
        REQUIRE(std::getline(out, line));
        cases.push_back({text, test::parse_ids(line)});
    }
    CHECK_FALSE(std::getline(out, line));
    return cases;
}

// Pushes ids one at a time; returns every piece of output.
std::vector<std::string> stream(const Tokenizer& tok, const std::vector<int>& ids, bool at_start = true) {
    TokenStreamDecoder dec(tok, at_start);
    std::vector<std::string> parts;
    for (int id : ids) parts.push_back(dec.push(id));
    parts.push_back(dec.flush());
    return parts;
}

std::string join(const std::vector<std::string>& parts) {
    std::string s;
    for (const auto& p : parts) s += p;
    return s;
}

// Strict UTF-8 validity: what a terminal or JSON encoder receives must never hold half a character.
bool valid_utf8(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        const size_t n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (n == 0 || i + n > s.size()) return false;
        for (size_t k = 1; k < n; ++k)
            if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
        i += n;
    }
    return true;
}

int id_of(const Tokenizer& tok, const std::string& piece) {
    const auto& texts = tok.token_texts();
    for (size_t i = 0; i < texts.size(); ++i)
        if (texts[i] == piece) return static_cast<int>(i);
    FAIL("no piece " << piece);
    return -1;
}

int byte_id(const Tokenizer& tok, int byte) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", byte);
    return id_of(tok, name);
}

const std::string kReplacement = "\xEF\xBF\xBD";  // U+FFFD, what sentencepiece prints for an invalid byte

// The minimal GGUF metadata of a sentencepiece vocabulary: <unk> <s> </s>, the 256 byte pieces, a few words.
struct VocabSpec {
    std::string model = "llama";
    std::vector<std::string> tokens;
    std::vector<float> scores;
    std::vector<int32_t> types;
    VocabSpec() {
        auto add = [&](const std::string& t, float s, int type) {
            tokens.push_back(t);
            scores.push_back(s);
            types.push_back(type);
        };
        add("<unk>", 0, 2);
        add("<s>", 0, 3);
        add("</s>", 0, 3);
        for (int b = 0; b < 256; ++b) {
            char name[8];
            std::snprintf(name, sizeof name, "<0x%02X>", b);
            add(name, 0, 6);
        }
        add("\xE2\x96\x81", -1, 1);  // ▁
        add("h", -2, 1);
        add("i", -3, 1);
        add("\xE2\x96\x81h", -4, 1);
        add("\xE2\x96\x81hi", -5, 1);
    }
};

std::string write_vocab_gguf(const std::string& name, const VocabSpec& v,
                             const std::function<void(GgufWriter&)>& extra = {}) {
    GgufWriter w;
    w.add_string("general.architecture", "llama");
    w.add_string("tokenizer.ggml.model", v.model);
    w.add_string_array("tokenizer.ggml.tokens", v.tokens);
    w.add_f32_array("tokenizer.ggml.scores", v.scores);
    w.add_i32_array("tokenizer.ggml.token_type", v.types);
    if (extra) extra(w);
    const std::string path = std::string(TANDEM_BUILD_DIR) + "/test_tokenizer_" + name + ".gguf";
    w.write(path);
    return path;
}

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

// The message of the error that loading this vocabulary raises.
std::string load_error(const std::string& name, const VocabSpec& v) {
    const std::string path = write_vocab_gguf(name, v);
    return error_of([&] { Tokenizer::from_gguf(*GgufFile::open(path)); });
}

}  // namespace

// ---- the ModelProto serializer ------------------------------------------------------------------------------

TEST_CASE("tokenizer proto: parses the fields of real sentencepiece models") {
    const spm::ModelProto tok512 = spm::parse(slurp(kData + "/tok512.model"));
    REQUIRE(tok512.pieces.size() == 512);
    CHECK(tok512.pieces[0].piece == "<unk>");
    CHECK(tok512.pieces[0].type == spm::PieceType::UNKNOWN);
    CHECK(tok512.pieces[1].type == spm::PieceType::CONTROL);
    CHECK(tok512.pieces[3].piece == "<0x00>");
    CHECK(tok512.pieces[3].type == spm::PieceType::BYTE);
    CHECK(tok512.pieces[261].piece == "\xE2\x96\x81" "a");
    CHECK(tok512.pieces[261].score == -2.0f);
    CHECK(tok512.pieces[261].type == spm::PieceType::NORMAL);
    CHECK(tok512.trainer_spec.model_type == spm::ModelType::BPE);
    CHECK(tok512.trainer_spec.vocab_size == 512);
    CHECK(tok512.trainer_spec.byte_fallback);
    CHECK(tok512.normalizer_spec.name == "identity");
    CHECK(tok512.normalizer_spec.add_dummy_prefix);
    CHECK(tok512.normalizer_spec.remove_extra_whitespaces);  // not set in the file: the proto default

    // Llama 2's tokenizer (the vocabulary of ggml-vocab-llama-spm.gguf).
    const spm::ModelProto llama = spm::parse(slurp(kData + "/tokenizer.model"));
    CHECK(llama.pieces.size() == 32000);
    CHECK(llama.trainer_spec.pad_id == -1);  // a negative int32 varint
    CHECK(llama.trainer_spec.unk_surface == " \xE2\x81\x87 ");
    CHECK_FALSE(llama.normalizer_spec.remove_extra_whitespaces);
    CHECK(llama.normalizer_spec.add_dummy_prefix);
}

TEST_CASE("tokenizer proto: serialize and parse round-trip every field") {
    spm::ModelProto m;
    m.pieces = {{"<unk>", 0, spm::PieceType::UNKNOWN}, {"<s>", 0, spm::PieceType::CONTROL},
                {"x", -1.5f, spm::PieceType::NORMAL}, {"u", 3.25f, spm::PieceType::USER_DEFINED},
                {"z", -1e9f, spm::PieceType::UNUSED}};
    m.trainer_spec.model_type = spm::ModelType::UNIGRAM;
    m.trainer_spec.vocab_size = 5;
    m.trainer_spec.byte_fallback = true;
    m.trainer_spec.unk_id = 0;
    m.trainer_spec.bos_id = 1;
    m.trainer_spec.eos_id = -1;
    m.trainer_spec.pad_id = -7;
    m.trainer_spec.unk_piece = "<unk>";
    m.trainer_spec.bos_piece = "<s>";
    m.trainer_spec.eos_piece = "</s>";
    m.trainer_spec.pad_piece = "<pad>";
    m.trainer_spec.unk_surface = "??";
    m.trainer_spec.has_unk_surface = true;
    m.normalizer_spec.add_dummy_prefix = false;
    m.normalizer_spec.remove_extra_whitespaces = false;
    m.normalizer_spec.escape_whitespaces = false;

    const spm::ModelProto r = spm::parse(spm::serialize(m));
    REQUIRE(r.pieces.size() == m.pieces.size());
    for (size_t i = 0; i < m.pieces.size(); ++i) {
        CHECK(r.pieces[i].piece == m.pieces[i].piece);
        CHECK(r.pieces[i].score == m.pieces[i].score);
        CHECK(r.pieces[i].type == m.pieces[i].type);
    }
    CHECK(r.trainer_spec.model_type == spm::ModelType::UNIGRAM);
    CHECK(r.trainer_spec.vocab_size == 5);
    CHECK(r.trainer_spec.byte_fallback);
    CHECK(r.trainer_spec.bos_id == 1);
    CHECK(r.trainer_spec.eos_id == -1);
    CHECK(r.trainer_spec.pad_id == -7);
    CHECK(r.trainer_spec.unk_surface == "??");
    CHECK(r.trainer_spec.has_unk_surface);
    CHECK(r.normalizer_spec.name == "identity");
    CHECK_FALSE(r.normalizer_spec.add_dummy_prefix);
    CHECK_FALSE(r.normalizer_spec.remove_extra_whitespaces);
    CHECK_FALSE(r.normalizer_spec.escape_whitespaces);
}

TEST_CASE("tokenizer proto: re-serialized tok512.model tokenizes like the original") {
    const std::string original = slurp(kData + "/tok512.model");
    sentencepiece::SentencePieceProcessor a, b;
    REQUIRE(a.LoadFromSerializedProto(original).ok());
    REQUIRE(b.LoadFromSerializedProto(spm::serialize(spm::parse(original))).ok());
    for (const char* text : {"Once upon a time", "Lily and Tom went to the park", "x\n\ny  z",
                             "h\xC3\xA9llo \xF0\x9F\x98\x80", "", " "}) {
        std::vector<int> x, y;
        REQUIRE(a.Encode(text, &x).ok());
        REQUIRE(b.Encode(text, &y).ok());
        CHECK(x == y);
    }
}

TEST_CASE("tokenizer proto: malformed bytes are a tandem::Error") {
    CHECK_THROWS_AS(spm::parse(std::string("\x0a\x05" "ab", 4)), Error);   // length past the end
    CHECK_THROWS_AS(spm::parse(std::string("\x08", 1)), Error);             // truncated varint
    CHECK_THROWS_AS(spm::parse(std::string("\x0b", 1)), Error);             // wire type 3 (groups)
    CHECK_NOTHROW(spm::parse(std::string("\x78\x01", 2)));                  // unknown field 15: skipped
}

// ---- encoding -----------------------------------------------------------------------------------------------

TEST_CASE("tokenizer llama-spm vocabulary: llama.cpp's 46 test cases encode exactly") {
    const Tokenizer& tok = llama_vocab();
    CHECK(tok.n_vocab() == 32000);
    CHECK(tok.bos() == 1);
    CHECK(tok.eos() == 2);
    CHECK(tok.unk() == 0);
    CHECK(tok.add_bos());
    CHECK(tok.model_type() == "llama");

    const auto cases = read_vocab_cases(kData + "/ggml-vocab-llama-spm.gguf");
    CHECK(cases.size() == 46);
    int round_trips = 0;
    for (const VocabCase& c : cases) {
        CAPTURE(c.text);
        CHECK(tok.encode(c.text, false) == c.ids);
        std::vector<int> with_bos = c.ids;
        with_bos.insert(with_bos.begin(), 1);
        CHECK(tok.encode(c.text, true) == with_bos);
        // Identity normalization, kept whitespace and byte fallback make decoding lossless.
        CHECK(tok.decode(c.ids) == c.text);
        round_trips += tok.decode(c.ids) == c.text;
        CHECK(join(stream(tok, c.ids)) == tok.decode(c.ids));
    }
    CHECK(round_trips == 46);
}

TEST_CASE("tokenizer phi-3 vocabulary: llama.cpp's 46 test cases encode exactly, without its architecture") {
    // The file declares architecture "phi3", which tandem has no forward pass for: from_gguf reads only the
    // tokenizer metadata.
    CHECK(GgufFile::open(kData + "/ggml-vocab-phi-3.gguf")->get_string("general.architecture") == "phi3");
    const Tokenizer& tok = phi3_vocab();
    CHECK(tok.n_vocab() == 32064);
    CHECK(tok.bos() == 1);
    CHECK(tok.eos() == 32000);  // <|endoftext|>
    CHECK(tok.unk() == 0);      // "<unk>", which Phi-3's file types as a control token
    CHECK(tok.is_control(0));
    CHECK(tok.add_bos());
    CHECK(tok.model_type() == "llama");
    CHECK(tok.token_id("<|assistant|>") == 32001);
    CHECK(tok.token_types()[32011] == 2);  // one of the 53 padding tokens typed "unknown"

    const auto cases = read_vocab_cases(kData + "/ggml-vocab-phi-3.gguf");
    CHECK(cases.size() == 46);
    int round_trips = 0;
    for (const VocabCase& c : cases) {
        CAPTURE(c.text);
        CHECK(tok.encode(c.text, false) == c.ids);
        std::vector<int> with_bos = c.ids;
        with_bos.insert(with_bos.begin(), 1);
        CHECK(tok.encode(c.text, true) == with_bos);
        CHECK(tok.encode(c.text, false, true) == c.ids);  // no special-token text in these inputs
        CHECK(tok.decode(c.ids) == c.text);
        round_trips += tok.decode(c.ids) == c.text;
        CHECK(join(stream(tok, c.ids)) == c.text);
    }
    CHECK(round_trips == 46);
}

TEST_CASE("tokenizer phi-3: special tokens take the whitespace after them, as llama.cpp sets for Phi-3") {
    // llama.cpp gives every special token of a model named "phi3"/"phi-3" the RSTRIP attribute except <unk>, <s>
    // and <|endoftext|>, so Phi-3's chat markup "<|user|>\n...<|end|>\n<|assistant|>\n" loses its newlines.
    const Tokenizer& tok = phi3_vocab();
    const int user = tok.token_id("<|user|>"), end = tok.token_id("<|end|>"), assistant = tok.token_id("<|assistant|>");
    REQUIRE(user == 32010);
    std::vector<int> expected = {user};
    for (int id : tok.encode("Hello there", false)) expected.push_back(id);
    expected.push_back(end);
    expected.push_back(assistant);
    CHECK(tok.encode("<|user|>\n Hello there<|end|>\n\t <|assistant|>\n", false, true) == expected);
    CHECK(tok.encode("<|user|>\n", false, true) == std::vector<int>{user});

    // <s> keeps the whitespace after it, and so does every token of a vocabulary by another name (Llama 2's).
    const auto after = [](const Tokenizer& t, int id, const std::string& text) {
        std::vector<int> ids = {id};
        for (int x : t.encode(text, false)) ids.push_back(x);
        return ids;
    };
    CHECK(tok.encode("<s>\nHi", false, true) == after(tok, 1, "\nHi"));
    CHECK(llama_vocab().encode("</s>\nHi", false, true) == after(llama_vocab(), 2, "\nHi"));
    // Without parse_special, control tokens are text and nothing is stripped.
    const std::vector<int> plain = tok.encode("<|user|>\nHi", false);
    CHECK(std::find(plain.begin(), plain.end(), user) == plain.end());
    CHECK(tok.decode(plain) == "<|user|>\nHi");
}

TEST_CASE("tokenizer: the longest special token that may be matched wins") {
    // "hh" is user-defined (split off always, as llama.cpp does), "hhi" a control token (only with parse_special):
    // without parse_special the match must fall back from "hhi" to "hh".
    VocabSpec v;
    v.tokens.push_back("hh");
    v.scores.push_back(0);
    v.types.push_back(4);
    v.tokens.push_back("hhi");
    v.scores.push_back(0);
    v.types.push_back(3);
    const auto tok = Tokenizer::from_gguf(*GgufFile::open(write_vocab_gguf("specials", v)));
    const std::vector<int> plain = tok->encode("hhih", false);
    CHECK(plain == std::vector<int>{264, 259, 261, 260});  // "hh", then "▁ih" (the space prefix follows it)
    CHECK(tok->encode("hhih", false, true) == std::vector<int>{265, 262});  // "hhi", then "▁h"
    CHECK(tok->encode("hxhh", false) == std::vector<int>{262, 3 + 'x', 264});
    CHECK(tok->decode(plain) == "hh ih");  // user-defined text as stored; the prefix space is not the first text
}

TEST_CASE("tokenizer stories260K: GGUF vocabulary and tok512.model give llama2.c's prompt ids") {
    const auto cases = test::read_greedy_reference(kData + "/stories260K-greedy.txt");
    REQUIRE(cases.size() >= 5);
    const auto from_file = Tokenizer::from_model_file(kData + "/tok512.model");
    const Tokenizer& tok = stories_vocab();
    CHECK(tok.n_vocab() == 512);
    CHECK(from_file->n_vocab() == 512);
    CHECK(from_file->bos() == 1);
    CHECK(from_file->eos() == 2);
    CHECK(from_file->unk() == 0);
    CHECK(tok.token_texts() == from_file->token_texts());
    CHECK(tok.token_types() == from_file->token_types());
    CHECK(tok.encode("Once upon a time", true) == std::vector<int>{1, 403, 407, 261, 378});
    for (const auto& c : cases) {
        CAPTURE(c.prompt);
        CHECK(tok.encode(c.prompt, true) == c.prompt_ids);
        CHECK(from_file->encode(c.prompt, true) == c.prompt_ids);
    }
}

TEST_CASE("tokenizer stories260K: generated ids decode to llama2.c's texts, whole and streamed") {
    const auto cases = test::read_greedy_reference(kData + "/stories260K-greedy.txt");
    const Tokenizer& tok = stories_vocab();
    for (const auto& c : cases) {
        CAPTURE(c.prompt);
        // The reference text is the generated ids decoded on their own: the first piece's leading space is
        // dropped ("The little dog" -> "was a little ...", where the first generated piece is "▁was").
        CHECK(tok.decode(c.generated_ids) == c.text);
        const auto parts = stream(tok, c.generated_ids, /*at_start=*/true);
        CHECK(join(parts) == c.text);
        // As a continuation of the prompt, that space stays.
        const bool leading_space = tok.piece(c.generated_ids[0]).rfind("\xE2\x96\x81", 0) == 0;
        CHECK(join(stream(tok, c.generated_ids, /*at_start=*/false)) == (leading_space ? " " : "") + c.text);
        // ...which is the decode of prompt + generated minus the decode of the prompt.
        std::vector<int> all = c.prompt_ids;
        all.insert(all.end(), c.generated_ids.begin(), c.generated_ids.end());
        const std::string prompt_text = tok.decode(c.prompt_ids);
        CHECK(tok.decode(all).substr(prompt_text.size()) == (leading_space ? " " : "") + c.text);
    }
}

TEST_CASE("tokenizer: vocabulary accessors") {
    const Tokenizer& tok = llama_vocab();
    CHECK(tok.piece(1) == "<s>");
    CHECK(tok.piece(13) == "<0x0A>");
    CHECK(tok.piece(15043) == "\xE2\x96\x81" "Hello");
    CHECK(tok.is_control(1));
    CHECK(tok.is_control(2));
    CHECK_FALSE(tok.is_control(0));
    CHECK_FALSE(tok.is_control(15043));
    CHECK(tok.is_byte(13));
    CHECK(tok.byte_value(13) == 0x0A);
    CHECK(tok.byte_value(15043) == -1);
    CHECK(tok.token_texts().size() == 32000);
    CHECK(tok.token_types()[0] == 2);
    CHECK(tok.token_types()[1] == 3);
    CHECK(tok.token_types()[3] == 6);
    CHECK(tok.token_types()[15043] == 1);
    CHECK(tok.encode("", false).empty());
    CHECK(tok.encode("", true) == std::vector<int>{1});
    CHECK(tok.decode({}) == "");
    CHECK(tok.decode({1, 15043, 2}) == "Hello");
    CHECK_THROWS_AS(tok.decode({32000}), Error);
    CHECK_THROWS_AS(tok.decode({-1}), Error);
    CHECK_THROWS_AS(tok.piece(32000), Error);
}

// ---- streaming ----------------------------------------------------------------------------------------------

TEST_CASE("tokenizer stream: multi-byte characters from byte pieces come out whole") {
    const Tokenizer& tok = llama_vocab();
    // An emoji and CJK that Llama's vocabulary spells with byte pieces (<0xF0><0x9F>...).
    const std::string text = "Hi \xF0\x9F\x98\x80 and \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\xA6\x99!";
    const std::vector<int> ids = tok.encode(text, true);
    int byte_pieces = 0;
    for (int id : ids) byte_pieces += tok.is_byte(id);
    CHECK(byte_pieces >= 8);
    const auto parts = stream(tok, ids);
    CHECK(join(parts) == text);
    for (const auto& p : parts) {
        CHECK(valid_utf8(p));
        CHECK(p.find(kReplacement) == std::string::npos);
    }

    // The four bytes of one character: nothing until the last.
    TokenStreamDecoder dec(tok, false);
    CHECK(dec.push(byte_id(tok, 0xF0)) == "");
    CHECK(dec.push(byte_id(tok, 0x9F)) == "");
    CHECK(dec.push(byte_id(tok, 0x98)) == "");
    CHECK(dec.push(byte_id(tok, 0x80)) == "\xF0\x9F\x98\x80");
    CHECK(dec.flush() == "");
}

TEST_CASE("tokenizer stream: invalid byte sequences render as decode() renders them") {
    const Tokenizer& tok = llama_vocab();
    const int hello = 15043, world = 3186, bos = 1, eos = 2;
    const std::vector<std::vector<int>> sequences = {
        {byte_id(tok, 0x80)},                                          // a lone continuation byte
        {byte_id(tok, 0xE2), byte_id(tok, 0x96)},                      // truncated at the end
        {byte_id(tok, 0xE2), byte_id(tok, 0x96), hello},               // truncated by a piece
        {byte_id(tok, 0xE2), eos, byte_id(tok, 0x96), byte_id(tok, 0x81)},  // split by a control token
        {byte_id(tok, 0xC3), byte_id(tok, 0x41)},                      // a lead byte followed by ASCII
        {byte_id(tok, 0xF0), byte_id(tok, 0x80), byte_id(tok, 0x80), byte_id(tok, 0x80)},  // overlong
        {byte_id(tok, 0xED), byte_id(tok, 0xA0), byte_id(tok, 0x80)},  // a surrogate
        {byte_id(tok, 0xFF), byte_id(tok, 0xFE), world},               // never valid
        {hello, byte_id(tok, 0xF0), byte_id(tok, 0x9F), byte_id(tok, 0x98)},  // unfinished emoji at the end
        {byte_id(tok, 0xEF), byte_id(tok, 0xBF), byte_id(tok, 0xBD), hello},  // a real U+FFFD
        {bos, byte_id(tok, 0x20), hello},                               // a space byte at the start is kept
        {byte_id(tok, 0xC3), byte_id(tok, 0xA9), byte_id(tok, 0xC3)},  // é then a dangling lead
    };
    for (const auto& ids : sequences) {
        CAPTURE(ids);
        const std::string whole = tok.decode(ids);
        const auto parts = stream(tok, ids);
        CHECK(join(parts) == whole);
        for (const auto& p : parts) CHECK(valid_utf8(p));
    }
    // The unfinished emoji is held back, then flushed as one U+FFFD per byte.
    TokenStreamDecoder dec(tok);
    CHECK(dec.push(hello) == "Hello");
    CHECK(dec.push(byte_id(tok, 0xF0)) == "");
    CHECK(dec.push(byte_id(tok, 0x9F)) == "");
    CHECK(dec.flush() == kReplacement + kReplacement);
}

TEST_CASE("tokenizer stream: control tokens and the leading-space rule") {
    const Tokenizer& tok = llama_vocab();
    const int hello = 15043, world = 3186, bos = 1, eos = 2, space = id_of(tok, "\xE2\x96\x81");
    auto check_both = [&](const std::vector<int>& ids, const std::string& expected) {
        CAPTURE(ids);
        CHECK(tok.decode(ids) == expected);
        CHECK(join(stream(tok, ids)) == expected);
    };
    check_both({bos, hello, world}, "Hello world");
    check_both({hello, eos, world}, "Hello world");  // a control token in the middle is invisible
    check_both({bos, bos, eos, hello}, "Hello");
    check_both({hello, eos, eos, eos, eos, world}, "Hello world");
    check_both({space, hello}, " Hello");  // only the first leading space is dropped
    check_both({bos, space, space, hello}, "  Hello");
    check_both({0, hello}, "Hello");  // <unk> renders as nothing, as in llama.cpp, so "▁Hello" still comes first
    check_both({hello, 0, world}, "Hello world");

    TokenStreamDecoder start(tok, true);
    CHECK(start.push(bos) == "");
    CHECK(start.push(hello) == "Hello");
    CHECK(start.push(world) == " world");
    CHECK(start.push(eos) == "");
    CHECK(start.flush() == "");
    // flush() starts a new stream.
    CHECK(start.push(hello) == "Hello");

    TokenStreamDecoder cont(tok, false);
    CHECK(cont.push(hello) == " Hello");
    CHECK(cont.push(eos) == "");
    CHECK(cont.push(world) == " world");

    const Tokenizer& stories = stories_vocab();
    TokenStreamDecoder after_prompt(stories, false);  // after "Once upon a time"
    CHECK(after_prompt.push(383) == " there");
}

TEST_CASE("tokenizer stream: random id sequences match whole decoding") {
    const auto tok512 = Tokenizer::from_model_file(kData + "/tok512.model");  // remove_extra_whitespaces on
    for (const Tokenizer* tok : std::vector<const Tokenizer*>{&llama_vocab(), &stories_vocab(), tok512.get()}) {
        // Draw mostly from the tokens that make streaming hard: bytes (lead, continuation, ASCII, invalid),
        // control tokens, <unk>, the lone "▁" piece; plus ordinary pieces.
        std::vector<int> pool = {0, tok->bos(), tok->eos(), id_of(*tok, "\xE2\x96\x81")};
        for (int b : {0x0A, 0x20, 0x41, 0x80, 0x96, 0x9F, 0xA9, 0xBF, 0xC3, 0xE2, 0xE6, 0xED, 0xEF, 0xF0, 0xF4, 0xFF})
            pool.push_back(byte_id(*tok, b));
        std::mt19937 rng(1234);
        std::uniform_int_distribution<int> any(0, tok->n_vocab() - 1);
        const int continuation_context = tok->encode("the", false).back();
        for (int trial = 0; trial < 3000; ++trial) {
            std::vector<int> ids(rng() % 24);
            for (int& id : ids) id = rng() % 3 ? pool[rng() % pool.size()] : any(rng);
            CAPTURE(ids);
            const auto parts = stream(*tok, ids, true);
            CHECK(join(parts) == tok->decode(ids));
            for (const auto& p : parts) CHECK(valid_utf8(p));

            std::vector<int> with_context = ids;
            with_context.insert(with_context.begin(), continuation_context);
            const std::string context_text = tok->decode({continuation_context});
            CHECK(join(stream(*tok, ids, false)) == tok->decode(with_context).substr(context_text.size()));
        }
    }
}

// ---- errors -------------------------------------------------------------------------------------------------

TEST_CASE("tokenizer errors: a byte-level BPE (gpt2) vocabulary is not supported yet") {
    VocabSpec v;
    v.model = "gpt2";
    const std::string message = load_error("gpt2", v);
    CHECK(message.find("gpt2") != std::string::npos);
    CHECK(message.find("not supported") != std::string::npos);
}

TEST_CASE("tokenizer errors: inconsistent GGUF vocabularies") {
    SUBCASE("a minimal valid vocabulary loads") {
        const std::string path = write_vocab_gguf("minimal", VocabSpec(), [](GgufWriter& w) {
            w.add_u32("tokenizer.ggml.bos_token_id", 1);
            w.add_u32("tokenizer.ggml.eos_token_id", 2);
            w.add_u32("tokenizer.ggml.unknown_token_id", 0);
            w.add_u32("tokenizer.ggml.padding_token_id", UINT32_MAX);  // "none"
            w.add_bool("tokenizer.ggml.add_bos_token", false);
        });
        auto tok = Tokenizer::from_gguf(*GgufFile::open(path));
        CHECK(tok->n_vocab() == 3 + 256 + 5);
        CHECK_FALSE(tok->add_bos());
        CHECK(tok->encode("hi hih", true) == std::vector<int>{1, 263, 263, 260});
        CHECK(tok->decode(tok->encode("hi hih", false)) == "hi hih");
        CHECK(tok->encode("\xC3\xA9", false) == std::vector<int>{259, 3 + 0xC3, 3 + 0xA9});
    }
    SUBCASE("no space prefix") {
        const std::string path = write_vocab_gguf("no_prefix", VocabSpec(), [](GgufWriter& w) {
            w.add_bool("tokenizer.ggml.add_space_prefix", false);
            w.add_i32("tokenizer.ggml.eos_token_id", -1);  // "none", written as a signed integer
        });
        auto tok = Tokenizer::from_gguf(*GgufFile::open(path));
        CHECK(tok->encode("hi", false) == std::vector<int>{260, 261});
        CHECK(tok->bos() == -1);  // no bos_token_id in the metadata
        CHECK(tok->eos() == -1);
        CHECK_FALSE(tok->add_bos());
        CHECK(tok->encode("hi", true) == std::vector<int>{260, 261});
    }
    SUBCASE("arrays of different lengths") {
        VocabSpec v;
        v.scores.pop_back();
        const std::string message = load_error("short", v);
        CHECK(message.find("differ in length") != std::string::npos);
    }
    SUBCASE("token ids outside the vocabulary") {
        const std::string path = write_vocab_gguf("bad_bos", VocabSpec(), [](GgufWriter& w) {
            w.add_u32("tokenizer.ggml.bos_token_id", 5000);
        });
        const std::string message = error_of([&] { Tokenizer::from_gguf(*GgufFile::open(path)); });
        CHECK(message.find("bos_token_id") != std::string::npos);
        CHECK(message.find("outside the vocabulary") != std::string::npos);
    }
    SUBCASE("an unknown token type") {
        VocabSpec v;
        v.types[262] = 9;
        const std::string message = load_error("type", v);
        CAPTURE(message);
        CHECK(message.find("unknown token type 9") != std::string::npos);
    }
    SUBCASE("a byte token that is not <0xNN>") {
        VocabSpec v;
        v.types[260] = 6;
        const std::string message = load_error("byte", v);
        CHECK(message.find("<0xNN>") != std::string::npos);
    }
    SUBCASE("no unknown token: not needed while byte pieces cover every byte") {
        VocabSpec v;
        v.types[0] = 3;
        auto tok = Tokenizer::from_gguf(*GgufFile::open(write_vocab_gguf("nounk", v)));
        CHECK(tok->unk() == -1);
        CHECK(tok->encode("h\xC3\xA9", false) == std::vector<int>{262, 3 + 0xC3, 3 + 0xA9});
        // Without byte pieces either, a character the vocabulary lacks cannot be encoded: an error, not a crash.
        for (int b = 0; b < 256; ++b) v.types[3 + b] = 1;
        tok = Tokenizer::from_gguf(*GgufFile::open(write_vocab_gguf("nounk_nobytes", v)));
        CHECK(tok->encode("hi", false) == std::vector<int>{263});
        const std::string message = error_of([&] { tok->encode("h\xC3\xA9", false); });
        CHECK(message.find("cannot encode byte 0xC3") != std::string::npos);
    }
    SUBCASE("without byte pieces, a character falls back to <unk>") {
        VocabSpec v;
        for (int b = 0; b < 256; ++b) v.types[3 + b] = 1;
        auto tok = Tokenizer::from_gguf(*GgufFile::open(write_vocab_gguf("unk_fallback", v)));
        CHECK(tok->unk() == 0);
        CHECK(tok->encode("\xC3\xA9h", false) == std::vector<int>{259, 0, 0, 260});
    }
    SUBCASE("duplicate pieces, with the file named") {
        VocabSpec v;
        v.tokens[261] = "h";
        const std::string path = write_vocab_gguf("dup", v);
        const std::string message = error_of([&] { Tokenizer::from_gguf(*GgufFile::open(path)); });
        CHECK(message.find(path) != std::string::npos);
        CHECK(message.find("duplicate token in the vocabulary: \"h\" has ids 260 and 261") != std::string::npos);
    }
    SUBCASE("a NaN score") {
        VocabSpec v;
        v.scores[262] = std::nanf("");
        CHECK(load_error("nan", v).find("token 262 has a NaN score") != std::string::npos);
    }
    SUBCASE("an empty token") {
        VocabSpec v;
        v.tokens[262] = "";
        CHECK(load_error("empty", v).find("token 262 is an empty string") != std::string::npos);
    }
    SUBCASE("a .model file whose piece is empty or holds a NUL byte") {
        // A unigram model's trie aborted the process on either (found by tests/fuzz/fuzz_spm_model.cpp).
        spm::ModelProto proto = spm::parse(slurp(kData + "/tok512.model"));
        proto.trainer_spec.model_type = spm::ModelType::UNIGRAM;
        const std::string path = std::string(TANDEM_BUILD_DIR) + "/test_tokenizer_bad_piece.model";
        for (const std::string& text : {std::string("\0a", 2), std::string()}) {
            spm::ModelProto bad = proto;
            bad.pieces[300].piece = text;
            std::ofstream(path, std::ios::binary) << spm::serialize(bad);
            const std::string message = error_of([&] { Tokenizer::from_model_file(path); });
            CAPTURE(message);
            CHECK(message.find(path + ": token 300 ") != std::string::npos);
            CHECK(message.find(text.empty() ? "is an empty string" : "contains a NUL byte") != std::string::npos);
        }
    }
    SUBCASE("a .model file whose normalization trie is corrupt") {
        // nfkc512.model (sentencepiece's own trainer, nmt_nfkc rules) loads and normalizes; corrupt copies of its
        // precompiled charsmap are refused before libsentencepiece walks them (a fuzzed one made it read wild
        // memory: tests/fuzz/corpus/spm_model/denormalizer-charsmap-wild-read).
        const std::string bytes = slurp(kData + "/nfkc512.model");
        const spm::ModelProto proto = spm::parse(bytes);
        REQUIRE(proto.charsmaps.size() == 1);
        const std::string& charsmap = proto.charsmaps[0];
        const size_t at = bytes.find(charsmap);
        REQUIRE(at != std::string::npos);
        const auto good = Tokenizer::from_model_file(kData + "/nfkc512.model");
        CHECK(good->encode("\xef\xbd\x97\xef\xbd\x8f\xef\xbd\x92\xef\xbd\x8c\xef\xbd\x84", false) ==
              good->encode("world", false));  // full-width letters NFKC-normalized
        const std::string path = std::string(TANDEM_BUILD_DIR) + "/test_tokenizer_bad_charsmap.model";
        const auto patched_error = [&](size_t offset, uint32_t value) {
            std::string bad = bytes;
            std::memcpy(bad.data() + at + offset, &value, 4);
            std::ofstream(path, std::ios::binary) << bad;
            return error_of([&] { Tokenizer::from_model_file(path); });
        };
        uint32_t trie_bytes, root;
        std::memcpy(&trie_bytes, charsmap.data(), 4);
        std::memcpy(&root, charsmap.data() + 4, 4);
        CHECK(patched_error(0, static_cast<uint32_t>(charsmap.size())).find("longer than the rules") !=
              std::string::npos);
        CHECK(patched_error(0, 0).find("the trie is empty") != std::string::npos);
        // The root's offset moved past the trie (bits 10-30; bit 9 clear: not shifted).
        CHECK(patched_error(4, (root & 0x1FF) | ((trie_bytes / 4) << 10)).find("outside the trie") !=
              std::string::npos);
    }
    SUBCASE("a missing or invalid .model file") {
        CHECK(error_of([] { Tokenizer::from_model_file(kData + "/no-such.model"); }).find("cannot open") !=
              std::string::npos);
        CHECK_THROWS_AS(Tokenizer::from_model_file(kData + "/stories260K-greedy.txt"), Error);
    }
}
