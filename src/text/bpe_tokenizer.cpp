// Byte-level BPE tokenization (pre-tokenizer regexes, GPT-2 byte mapping, merges, word cache) and the UTF-8
// helpers shared with Tokenizer. See bpe_tokenizer.h.
#include "text/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <algorithm>
#include <pcre2.h>

#include "error.h"
#include "gguf/gguf.h"
#include "text/utf8.h"

namespace tandem {

// ---- UTF-8 ----------------------------------------------------------------------------------------------------

namespace utf8 {

std::string sanitize(std::string_view text) {
    const auto* s = reinterpret_cast<const unsigned char*>(text.data());
    const size_t n = text.size();
    std::string out;
    size_t copied = 0;  // text[0, copied) is already in `out` (only used once a bad byte was seen)
    bool bad = false;
    for (size_t i = 0; i < n;) {
        if (s[i] < 0x80) {
            ++i;
            continue;
        }
        const int len = sequence_length(s + i, n - i);
        if (len > 0) {
            i += static_cast<size_t>(len);
            continue;
        }
        if (!bad) {
            out.reserve(n + 16);
            bad = true;
        }
        out.append(text.data() + copied, i - copied);
        out += "\xEF\xBF\xBD";
        copied = ++i;
    }
    if (!bad) return std::string(text);
    out.append(text.data() + copied, n - copied);
    return out;
}

}  // namespace utf8

namespace {

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes (controls, space,
// DEL, NBSP, soft hyphen...) take the code points 256, 257, ... in byte order, so every byte is one visible
// character and merges never see whitespace.
void bytes_to_unicode(uint32_t (&map)[256]) {
    bool direct[256] = {};
    for (int b = 0x21; b <= 0x7E; ++b) direct[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) map[b] = direct[b] ? static_cast<uint32_t>(b) : next++;
}

// The regexes of llama.cpp's llm_tokenizer_bpe, per pre-tokenizer type. PCRE2 (with UTF and UCP) takes them as
// they are. llama.cpp runs GPT-2's and Llama 3's through hand-written matchers; the GPT-2 one also takes a
// whitespace run that `\s+(?!\S)` leaves over, hence the trailing `|\s+` here (the text it covers would be a
// piece of its own anyway). Contractions are spelled `'[sS]` rather than `(?i:'s)` as llama.cpp does, so that
// case folding cannot match U+017F (long s) as 's'.
constexpr const char* kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2: as Llama 3 but every digit is a word of its own.
constexpr const char* kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Qwen3.5: as Qwen2, but combining marks (\p{M}) count as part of a word, so "e" + U+0301 stays one word
// (llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN35).
constexpr const char* kQwen35 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct PreSpec {
    std::vector<const char*> names;  // tokenizer.ggml.pre values (llama.cpp's spellings)
    std::vector<const char*> regexes;
    bool ignore_merges = false;
    bool add_bos = false;
};

const std::vector<PreSpec>& pre_specs() {
    static const std::vector<PreSpec> specs = {
        // llama.cpp's LLAMA_VOCAB_PRE_TYPE_DEFAULT (also what it uses when tokenizer.ggml.pre is absent).
        {{"default"}, {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"}},
        {{"gpt-2", "phi-2"}, {kGpt2}},
        {{"llama-bpe", "llama3", "llama-v3"}, {kLlama3}, true, true},
        {{"dbrx", "smaug-bpe"}, {kLlama3}},
        {{"qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"}, {kQwen2}},
        {{"qwen35"}, {kQwen35}},
        // SmolLM (LLAMA_VOCAB_PRE_TYPE_SMOLLM, shared with StarCoder): digits split off one by one, then GPT-2.
        {{"smollm", "starcoder", "refact", "codeshell", "command-r"}, {R"(\p{N})", kGpt2}},
    };
    return specs;
}

uint64_t pair_key(int left, int right) {
    return static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32 | static_cast<uint32_t>(right);
}

constexpr size_t kMaxCachedWord = 64;      // longer words are rare and cheap to keep out
constexpr size_t kCacheEntries = 1 << 16;  // cleared when full: simple, and text keeps re-filling the hot words

}  // namespace

struct BpeTokenizer::Regex {
    pcre2_code* code = nullptr;
    bool jit = false;
    ~Regex() {
        if (code) pcre2_code_free(code);
    }
};

BpeTokenizer::BpeTokenizer() = default;
BpeTokenizer::~BpeTokenizer() = default;

std::string BpeTokenizer::supported_pre() {
    std::string s;
    for (const PreSpec& spec : pre_specs())
        for (const char* name : spec.names) s += (s.empty() ? "" : ", ") + std::string(name);
    return s;
}

std::unique_ptr<BpeTokenizer> BpeTokenizer::from_gguf(const GgufFile& gguf, const std::vector<std::string>& texts,
                                                      const std::vector<int>& types) {
    const std::string& path = gguf.path();
    auto bpe = std::unique_ptr<BpeTokenizer>(new BpeTokenizer());
    bpe->pre_ = gguf.get_string_or("tokenizer.ggml.pre", "default");
    const PreSpec* spec = nullptr;
    for (const PreSpec& s : pre_specs())
        for (const char* name : s.names)
            if (bpe->pre_ == name) spec = &s;
    if (!spec)
        throw Error(path + ": unknown pre-tokenizer tokenizer.ggml.pre = \"" + bpe->pre_ +
                    "\" (supported: " + supported_pre() + ")");
    bpe->ignore_merges_ = spec->ignore_merges;
    bpe->default_add_bos_ = spec->add_bos;
    for (const char* pattern : spec->regexes) {
        auto re = std::make_unique<Regex>();
        int err = 0;
        PCRE2_SIZE err_offset = 0;
        re->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                 &err, &err_offset, nullptr);
        if (!re->code) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            throw Error("tokenizer: PCRE2 rejected the pre-tokenizer regex of \"" + bpe->pre_ + "\" at offset " +
                        std::to_string(err_offset) + ": " + reinterpret_cast<const char*>(msg));
        }
        // Without JIT (a PCRE2 built without it) the interpreter gives the same matches, only slower.
        re->jit = pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE) == 0;
        bpe->regexes_.push_back(std::move(re));
    }

    const size_t n = texts.size();
    bpe->text_to_id_.reserve(n * 2);
    for (size_t i = 0; i < n; ++i) bpe->text_to_id_.emplace(texts[i], static_cast<int>(i));

    uint32_t map[256];
    bytes_to_unicode(map);
    int inverse[512];  // code point -> byte (every mapped code point is below 324)
    std::fill(std::begin(inverse), std::end(inverse), -1);
    for (int b = 0; b < 256; ++b) {
        utf8::append(bpe->byte_to_char_[b], map[b]);
        inverse[map[b]] = b;
        const auto it = bpe->text_to_id_.find(bpe->byte_to_char_[b]);
        bpe->byte_to_id_[b] = it == bpe->text_to_id_.end() ? -1 : it->second;
    }

    const GgufValue* merges_value = gguf.find("tokenizer.ggml.merges");
    if (!merges_value)
        throw Error(path +
                    ": a byte-level BPE vocabulary (tokenizer.ggml.model \"gpt2\") without "
                    "tokenizer.ggml.merges is not supported");
    const std::vector<std::string_view> merges = gguf.get_string_array("tokenizer.ggml.merges");
    bpe->merges_.reserve(merges.size() * 2);
    std::string joined;
    for (size_t rank = 0; rank < merges.size(); ++rank) {
        const std::string_view m = merges[rank];
        const size_t space = m.size() > 1 ? m.find(' ', 1) : std::string_view::npos;  // as llama.cpp splits it
        if (space == std::string_view::npos)
            throw Error(path + ": tokenizer.ggml.merges[" + std::to_string(rank) + "] \"" + std::string(m) +
                        "\" is not two tokens separated by a space");
        const std::string_view left = m.substr(0, space), right = m.substr(space + 1);
        joined.assign(left);
        joined += right;
        const auto l = bpe->text_to_id_.find(std::string(left));
        const auto r = bpe->text_to_id_.find(std::string(right));
        const auto j = bpe->text_to_id_.find(joined);
        // A merge whose parts or result are not tokens can never produce a token; llama.cpp would apply it and
        // then fall back to single characters, which real vocabularies never need.
        if (l == bpe->text_to_id_.end() || r == bpe->text_to_id_.end() || j == bpe->text_to_id_.end()) continue;
        bpe->merges_.emplace(pair_key(l->second, r->second),
                             Merge{static_cast<int>(rank), j->second});  // first (lowest) rank wins
    }

    // What each token renders as (llama_token_to_piece with special = false).
    bpe->rendered_.resize(n);
    for (size_t i = 0; i < n; ++i) {
        const int type = types[i];
        const std::string& t = texts[i];
        if (type == 4) {  // user-defined: stored as plain text
            bpe->rendered_[i] = t;
        } else if (type == 1) {
            std::string& out = bpe->rendered_[i];
            const auto* s = reinterpret_cast<const unsigned char*>(t.data());
            for (size_t k = 0; k < t.size();) {
                const int len = utf8::sequence_length(s + k, t.size() - k);
                if (len <= 0) {  // not UTF-8: keep the byte (no real vocabulary has this)
                    out += t[k++];
                    continue;
                }
                uint32_t cp = len == 1 ? s[k] : len == 2 ? (s[k] & 0x1Fu) : len == 3 ? (s[k] & 0x0Fu) : (s[k] & 0x07u);
                for (int c = 1; c < len; ++c) cp = cp << 6 | (s[k + c] & 0x3Fu);
                if (cp < 512 && inverse[cp] >= 0)
                    out += static_cast<char>(inverse[cp]);
                else
                    out.append(t, k, static_cast<size_t>(len));  // a character outside the mapping: as is
                k += static_cast<size_t>(len);
            }
        }  // control, unknown, unused, byte: nothing
    }
    return bpe;
}

int BpeTokenizer::token_id(std::string_view text) const {
    const auto it = text_to_id_.find(std::string(text));
    return it == text_to_id_.end() ? -1 : it->second;
}

void BpeTokenizer::encode(std::string_view text, std::vector<int>& out) const {
    if (text.empty()) return;
    const std::string clean = utf8::sanitize(text);
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(clean.data());

    // Pieces as [begin, end) byte ranges; each regex refines the pieces of the previous one.
    std::vector<std::pair<size_t, size_t>> pieces{{0, clean.size()}}, next;
    pcre2_match_data* md = nullptr;
    try {
        for (const auto& re : regexes_) {
            pcre2_match_data_free(md);
            md = pcre2_match_data_create_from_pattern(re->code, nullptr);
            if (!md) throw Error("tokenizer: out of memory for PCRE2 match data");
            next.clear();
            next.reserve(pieces.size() + clean.size() / 4);
            for (const auto& [begin, end] : pieces) {
                // Match inside the piece only (its end is the subject's end), as llama.cpp's per-piece regex
                // iterator does: a lookahead at the piece's end sees the end of text.
                const size_t len = end - begin;
                size_t gap = 0, at = 0;  // unmatched text starts at `gap`; search resumes at `at`
                while (at < len) {
                    const int rc =
                        re->jit ? pcre2_jit_match(re->code, subject + begin, len, at, PCRE2_NO_UTF_CHECK, md, nullptr)
                                : pcre2_match(re->code, subject + begin, len, at, PCRE2_NO_UTF_CHECK, md, nullptr);
                    if (rc == PCRE2_ERROR_NOMATCH) break;
                    if (rc < 0) {
                        PCRE2_UCHAR msg[256];
                        pcre2_get_error_message(rc, msg, sizeof msg);
                        throw Error(std::string("tokenizer: pre-tokenizer regex failed: ") +
                                    reinterpret_cast<const char*>(msg));
                    }
                    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
                    const size_t ms = ov[0], me = ov[1];
                    if (me == ms) {  // no pattern here matches empty text; step over a character to be safe
                        at = ms + 1;
                        while (at < len && (clean[begin + at] & 0xC0) == 0x80) ++at;
                        continue;
                    }
                    if (ms > gap) next.emplace_back(begin + gap, begin + ms);
                    next.emplace_back(begin + ms, begin + me);
                    gap = at = me;
                }
                if (gap < len) next.emplace_back(begin + gap, end);
            }
            pieces.swap(next);
        }
    } catch (...) {
        pcre2_match_data_free(md);
        throw;
    }
    pcre2_match_data_free(md);

    for (const auto& [begin, end] : pieces) encode_word(std::string_view(clean).substr(begin, end - begin), out);
}

void BpeTokenizer::encode_word(std::string_view word, std::vector<int>& out) const {
    if (word.empty()) return;
    const bool cacheable = word.size() <= kMaxCachedWord;
    if (cacheable) {
        std::lock_guard<std::mutex> lock(cache_mutex_);
        const auto it = cache_.find(std::string(word));
        if (it != cache_.end()) {
            out.insert(out.end(), it->second.begin(), it->second.end());
            return;
        }
    }
    const size_t first = out.size();
    merge_word(word, out);
    if (cacheable) {
        std::lock_guard<std::mutex> lock(cache_mutex_);
        if (cache_.size() >= kCacheEntries) cache_.clear();
        cache_.emplace(std::string(word),
                       std::vector<int>(out.begin() + static_cast<std::ptrdiff_t>(first), out.end()));
    }
}

void BpeTokenizer::merge_word(std::string_view word, std::vector<int>& out) const {
    if (ignore_merges_) {
        std::string encoded;
        for (unsigned char b : word) encoded += byte_to_char_[b];
        const auto it = text_to_id_.find(encoded);
        if (it != text_to_id_.end()) {
            out.push_back(it->second);
            return;
        }
    }
    const int n = static_cast<int>(word.size());
    if (n == 1) {
        const int id = byte_to_id_[static_cast<unsigned char>(word[0])];
        if (id >= 0) out.push_back(id);
        return;
    }

    // A doubly linked list of symbols (one per byte to begin with) and a min-heap of candidate merges ordered by
    // rank, then position. Entries go stale when a neighbour merges; they are recognised by their ids no longer
    // being the pair at that position. O(n log n), where rescanning for the best pair would be O(n^2) on a long
    // word (a 1 MB run of one letter is a single word).
    struct Symbol {
        int id;  // -1: a byte without a token (never merges, dropped); -2: merged into its left neighbour
        int prev, next;
    };
    struct Candidate {
        uint64_t order;  // rank << 32 | left position: one comparison orders by rank, then leftmost
        int left_id, right_id;
    };
    const auto later = [](const Candidate& a, const Candidate& b) { return a.order > b.order; };
    std::vector<Symbol> sym(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i)
        sym[i] = {byte_to_id_[static_cast<unsigned char>(word[i])], i - 1, i + 1 < n ? i + 1 : -1};
    std::vector<Candidate> heap;
    heap.reserve(static_cast<size_t>(n));
    const auto candidate = [&](int left, Candidate& out) {
        const int right = sym[left].next;
        if (right < 0 || sym[left].id < 0 || sym[right].id < 0) return false;
        const auto it = merges_.find(pair_key(sym[left].id, sym[right].id));
        if (it == merges_.end()) return false;
        out = {static_cast<uint64_t>(it->second.rank) << 32 | static_cast<uint32_t>(left), sym[left].id, sym[right].id};
        return true;
    };
    const auto consider = [&](int left) {
        Candidate c;
        if (left >= 0 && candidate(left, c)) {
            heap.push_back(c);
            std::push_heap(heap.begin(), heap.end(), later);
        }
    };
    for (int i = 0; i + 1 < n; ++i) {
        Candidate c;
        if (candidate(i, c)) heap.push_back(c);
    }
    std::make_heap(heap.begin(), heap.end(), later);  // O(n), rather than n pushes
    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end(), later);
        const Candidate c = heap.back();
        heap.pop_back();
        const int left_pos = static_cast<int>(c.order & 0xFFFFFFFFu);
        Symbol& left = sym[left_pos];
        if (left.id != c.left_id || left.next < 0 || sym[left.next].id != c.right_id) continue;  // stale
        Symbol& right = sym[left.next];
        left.id = merges_.find(pair_key(c.left_id, c.right_id))->second.id;
        right.id = -2;
        left.next = right.next;
        if (left.next >= 0) sym[left.next].prev = left_pos;
        consider(left.prev);
        consider(left_pos);
    }
    for (int i = 0; i >= 0; i = sym[i].next)
        if (sym[i].id >= 0) out.push_back(sym[i].id);
}

}  // namespace tandem
