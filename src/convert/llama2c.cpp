// llama2.c checkpoint reader, sentencepiece vocabulary loader and the llama2.c → GGUF mapping (llama2c.h).
// The layouts follow karpathy/llama2.c export.py (legacy_export, version1_export, version2_export) and the
// readers in run.c / runq.c.
#include "convert/llama2c.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sentencepiece_processor.h>
#include <sstream>

#include "convert/quantize_model.h"
#include "error.h"
#include "text/sentencepiece_proto.h"

namespace tandem {
namespace {

constexpr uint32_t kMagic = 0x616b3432;  // "ak42" read as a little-endian uint32
constexpr size_t kHeaderBytes = 256;     // versioned header, zero-padded
// Bounds that no real llama2.c model comes near; they keep the size arithmetic far from overflow and turn a
// garbage header into a clear message instead of a huge allocation.
constexpr int64_t kMaxDim = 1 << 16, kMaxLayers = 1 << 10, kMaxVocab = 1 << 22, kMaxSeq = 1 << 24;

// Sequential reader over the checkpoint bytes; every read is bounds-checked.
class Cursor {
public:
    Cursor(std::span<const uint8_t> bytes, const std::string& name) : bytes_(bytes), name_(name) {}
    size_t pos() const { return pos_; }
    void seek(size_t pos) { pos_ = pos; }
    template <class T>
    T read() {
        T v;
        std::memcpy(&v, take(sizeof(T), "header"), sizeof(T));
        return v;
    }
    const uint8_t* take(size_t n, const char* what) {
        if (n > bytes_.size() - pos_) fail(std::string("truncated while reading ") + what);
        const uint8_t* p = bytes_.data() + pos_;
        pos_ += n;
        return p;
    }
    // n fp32 values; checked to be finite so a misread (wrong layout, garbage) is not passed on silently.
    std::vector<float> floats(size_t n, const char* what) {
        std::vector<float> v(n);
        std::memcpy(v.data(), take(n * sizeof(float), what), n * sizeof(float));
        for (float x : v)
            if (!std::isfinite(x)) fail(std::string("non-finite value in ") + what);
        return v;
    }
    [[noreturn]] void fail(const std::string& problem) const { throw Error(name_ + ": " + problem); }

private:
    std::span<const uint8_t> bytes_;
    const std::string& name_;
    size_t pos_ = 0;
};

void check_config(const Llama2cConfig& c, Cursor& cur) {
    auto in_range = [&](const char* what, int64_t v, int64_t max) {
        if (v <= 0 || v > max)
            cur.fail(std::string("not a llama2.c checkpoint: ") + what + " = " + std::to_string(v) +
                     " is out of range (1.." + std::to_string(max) + ")");
    };
    in_range("dim", c.dim, kMaxDim);
    in_range("hidden_dim", c.hidden_dim, kMaxDim * 8);
    in_range("n_layers", c.n_layers, kMaxLayers);
    in_range("n_heads", c.n_heads, kMaxDim);
    in_range("n_kv_heads", c.n_kv_heads, kMaxDim);
    in_range("vocab_size", c.vocab_size, kMaxVocab);
    in_range("seq_len", c.seq_len, kMaxSeq);
    if (c.dim % c.n_heads != 0)
        cur.fail("dim " + std::to_string(c.dim) + " is not a multiple of n_heads " + std::to_string(c.n_heads));
    if (c.n_heads % c.n_kv_heads != 0)
        cur.fail("n_heads " + std::to_string(c.n_heads) + " is not a multiple of n_kv_heads " +
                 std::to_string(c.n_kv_heads));
    if (c.head_size() % 2 != 0)  // RoPE rotates pairs
        cur.fail("head size " + std::to_string(c.head_size()) + " is odd");
}

// Element counts of the weights, in the checkpoint's own units.
struct Sizes {
    uint64_t embed, att_norms, wq, wk, wv, wo, ffn_norms, w1, w2, w3, final_norm, freq, cls;
};
Sizes sizes_of(const Llama2cConfig& c) {
    const uint64_t L = c.n_layers, d = c.dim, h = c.hidden_dim, kv = c.kv_dim(), V = c.vocab_size;
    return Sizes{V * d,
                 L * d,
                 L * d * d,
                 L * kv * d,
                 L * kv * d,
                 L * d * d,
                 L * d,
                 L * h * d,
                 L * d * h,
                 L * h * d,
                 d,
                 static_cast<uint64_t>(c.seq_len) * (c.head_size() / 2),  // legacy freq_cis_real (and imag)
                 c.shared_classifier ? 0 : V * d};
}

uint64_t fp32_bytes(const Sizes& s, bool with_freq) {
    uint64_t n = s.embed + s.att_norms + s.wq + s.wk + s.wv + s.wo + s.ffn_norms + s.w1 + s.w2 + s.w3 + s.final_norm +
                 s.cls + (with_freq ? 2 * s.freq : 0);
    return n * sizeof(float);
}

void check_size(Cursor& cur, uint64_t expected, uint64_t actual, const char* layout) {
    if (expected != actual)
        cur.fail(std::string(actual < expected ? "truncated" : "has trailing bytes") + ": a " + layout +
                 " checkpoint with these dimensions is " + std::to_string(expected) + " bytes, the file has " +
                 std::to_string(actual));
}

// One layer-stacked tensor of a version 2 file: per layer, int8 values then fp32 scales (export.py quantizes
// each layer's matrix separately, in groups of group_size consecutive values of its flattened row-major data).
std::vector<float> read_q8_layers(Cursor& cur, int n_layers, uint64_t per_layer, int group_size, const char* what) {
    std::vector<float> out(per_layer * n_layers);
    const uint64_t n_groups = per_layer / group_size;
    for (int l = 0; l < n_layers; ++l) {
        const int8_t* q = reinterpret_cast<const int8_t*>(cur.take(per_layer, what));
        std::vector<float> s = cur.floats(n_groups, what);
        float* dst = out.data() + l * per_layer;
        for (uint64_t i = 0; i < per_layer; ++i) dst[i] = static_cast<float>(q[i]) * s[i / group_size];
    }
    return out;
}

std::vector<uint8_t> f32_bytes(const float* p, size_t n) {
    std::vector<uint8_t> b(n * sizeof(float));
    std::memcpy(b.data(), p, b.size());
    return b;
}

}  // namespace

Llama2cCheckpoint parse_llama2c(std::span<const uint8_t> bytes, const std::string& name) {
    Cursor cur(bytes, name);
    Llama2cCheckpoint ck;
    Llama2cConfig& c = ck.config;
    if (bytes.size() < 28) cur.fail("too small for a llama2.c checkpoint (" + std::to_string(bytes.size()) + " bytes)");

    const uint32_t magic = cur.read<uint32_t>();
    if (magic == kMagic) {
        c.version = cur.read<int32_t>();
        if (c.version != 1 && c.version != 2)
            cur.fail("llama2.c checkpoint version " + std::to_string(c.version) + " is not supported (1 and 2 are)");
    } else {
        cur.seek(0);
        c.version = 0;
    }
    c.dim = cur.read<int32_t>();
    c.hidden_dim = cur.read<int32_t>();
    c.n_layers = cur.read<int32_t>();
    c.n_heads = cur.read<int32_t>();
    c.n_kv_heads = cur.read<int32_t>();
    const int32_t raw_vocab = cur.read<int32_t>();
    c.seq_len = cur.read<int32_t>();
    if (c.version == 0) {
        // Legacy: a negative vocab_size says the classifier is stored separately (after freq_cis).
        c.shared_classifier = raw_vocab > 0;
        c.vocab_size = raw_vocab == INT32_MIN ? 0 : std::abs(raw_vocab);
    } else {
        c.vocab_size = raw_vocab;
        // struct.pack writes the flag byte and then group_size with no alignment padding (offsets 36 and 37).
        const uint8_t flag = cur.read<uint8_t>();
        if (flag > 1) cur.fail("shared_classifier flag is " + std::to_string(flag) + ", expected 0 or 1");
        c.shared_classifier = flag == 1;
        if (c.version == 2) c.group_size = cur.read<int32_t>();
    }
    check_config(c, cur);
    const Sizes s = sizes_of(c);
    const int L = c.n_layers;

    if (c.version == 0) {
        check_size(cur, 28 + fp32_bytes(s, true), bytes.size(), "legacy fp32");
        ck.token_embedding = cur.floats(s.embed, "token_embedding_table");
        ck.rms_att = cur.floats(s.att_norms, "rms_att_weight");
        ck.wq = cur.floats(s.wq, "wq");
        ck.wk = cur.floats(s.wk, "wk");
        ck.wv = cur.floats(s.wv, "wv");
        ck.wo = cur.floats(s.wo, "wo");
        ck.rms_ffn = cur.floats(s.ffn_norms, "rms_ffn_weight");
        ck.w1 = cur.floats(s.w1, "w1");
        ck.w2 = cur.floats(s.w2, "w2");
        ck.w3 = cur.floats(s.w3, "w3");
        ck.rms_final = cur.floats(s.final_norm, "rms_final_weight");
        cur.take(2 * s.freq * sizeof(float), "freq_cis");  // precomputed RoPE tables: tandem computes its own
        if (!c.shared_classifier) ck.wcls = cur.floats(s.cls, "wcls");
    } else if (c.version == 1) {
        check_size(cur, kHeaderBytes + fp32_bytes(s, false), bytes.size(), "version 1 fp32");
        cur.seek(kHeaderBytes);
        ck.rms_att = cur.floats(s.att_norms, "rms_att_weight");
        ck.rms_ffn = cur.floats(s.ffn_norms, "rms_ffn_weight");
        ck.rms_final = cur.floats(s.final_norm, "rms_final_weight");
        ck.token_embedding = cur.floats(s.embed, "token_embedding_table");
        ck.wq = cur.floats(s.wq, "wq");
        ck.wk = cur.floats(s.wk, "wk");
        ck.wv = cur.floats(s.wv, "wv");
        ck.wo = cur.floats(s.wo, "wo");
        ck.w1 = cur.floats(s.w1, "w1");
        ck.w2 = cur.floats(s.w2, "w2");
        ck.w3 = cur.floats(s.w3, "w3");
        if (!c.shared_classifier) ck.wcls = cur.floats(s.cls, "wcls");
    } else {
        const int64_t g = c.group_size;
        if (g <= 0 || g > kMaxDim) cur.fail("group_size " + std::to_string(g) + " is out of range");
        const uint64_t per_layer[] = {s.wq / L, s.wk / L, s.wv / L, s.wo / L, s.w1 / L, s.w2 / L, s.w3 / L};
        for (uint64_t n : per_layer)
            if (n % g != 0)
                cur.fail("a weight of " + std::to_string(n) +
                         " values is not a whole number of "
                         "groups of " +
                         std::to_string(g));
        if (s.embed % g != 0) cur.fail("the token embedding is not a whole number of groups of " + std::to_string(g));
        // int8 values plus one fp32 scale per group, for every quantized tensor.
        const uint64_t q_values = s.embed + s.wq + s.wk + s.wv + s.wo + s.w1 + s.w2 + s.w3 + s.cls;
        const uint64_t expected = kHeaderBytes + (s.att_norms + s.ffn_norms + s.final_norm) * sizeof(float) + q_values +
                                  q_values / g * sizeof(float);
        check_size(cur, expected, bytes.size(), "version 2 int8");
        cur.seek(kHeaderBytes);
        ck.rms_att = cur.floats(s.att_norms, "rms_att_weight");
        ck.rms_ffn = cur.floats(s.ffn_norms, "rms_ffn_weight");
        ck.rms_final = cur.floats(s.final_norm, "rms_final_weight");
        ck.token_embedding = read_q8_layers(cur, 1, s.embed, c.group_size, "token_embedding_table");
        ck.wq = read_q8_layers(cur, L, per_layer[0], c.group_size, "wq");
        ck.wk = read_q8_layers(cur, L, per_layer[1], c.group_size, "wk");
        ck.wv = read_q8_layers(cur, L, per_layer[2], c.group_size, "wv");
        ck.wo = read_q8_layers(cur, L, per_layer[3], c.group_size, "wo");
        ck.w1 = read_q8_layers(cur, L, per_layer[4], c.group_size, "w1");
        ck.w2 = read_q8_layers(cur, L, per_layer[5], c.group_size, "w2");
        ck.w3 = read_q8_layers(cur, L, per_layer[6], c.group_size, "w3");
        if (!c.shared_classifier) ck.wcls = read_q8_layers(cur, 1, s.cls, c.group_size, "wcls");
    }
    if (cur.pos() != bytes.size()) cur.fail("internal: layout does not cover the file");  // sizes checked above
    return ck;
}

Llama2cCheckpoint read_llama2c(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(path + ": cannot open: " + std::strerror(errno));
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) throw Error(path + ": read failed");
    return parse_llama2c(bytes, path);
}

SpmVocab load_spm_vocab(const std::string& path) {
    sentencepiece::SentencePieceProcessor sp;
    const auto status = sp.Load(path);
    if (!status.ok()) throw Error(path + ": cannot load the sentencepiece model: " + status.ToString());

    // The processor API has no IsUserDefined, so USER_DEFINED comes from the model proto itself; everything
    // else is asked of the processor, the reference for what the pieces mean.
    std::ifstream in(path, std::ios::binary);
    std::ostringstream raw;
    raw << in.rdbuf();
    const spm::ModelProto proto = spm::parse(raw.str());

    SpmVocab v;
    const int n = sp.GetPieceSize();
    if (static_cast<int>(proto.pieces.size()) != n)
        throw Error(path + ": the model proto lists " + std::to_string(proto.pieces.size()) +
                    " pieces but sentencepiece loaded " + std::to_string(n));
    for (int id = 0; id < n; ++id) {
        v.tokens.push_back(sp.IdToPiece(id));
        v.scores.push_back(sp.GetScore(id));
        spm::PieceType t = spm::PieceType::NORMAL;
        if (sp.IsUnknown(id))
            t = spm::PieceType::UNKNOWN;
        else if (sp.IsControl(id))
            t = spm::PieceType::CONTROL;
        else if (sp.IsUnused(id))
            t = spm::PieceType::UNUSED;
        else if (sp.IsByte(id))
            t = spm::PieceType::BYTE;
        else if (proto.pieces[id].type == spm::PieceType::USER_DEFINED)
            t = spm::PieceType::USER_DEFINED;
        v.types.push_back(static_cast<int32_t>(t));
    }
    v.bos_id = sp.bos_id();
    v.eos_id = sp.eos_id();
    v.unk_id = sp.unk_id();
    v.pad_id = sp.pad_id();
    return v;
}

GgufWriter llama2c_to_gguf(const Llama2cCheckpoint& ck, const SpmVocab& vocab, GgmlType type, const std::string& name,
                           std::vector<ConvertNote>* notes) {
    const Llama2cConfig& c = ck.config;
    if (!parse_output_type(ggml_type_name(type)))
        throw Error(std::string("cannot write weights as ") + ggml_type_name(type) + " (can: " + output_type_names() +
                    ")");
    if (static_cast<int>(vocab.tokens.size()) != c.vocab_size)
        throw Error("the tokenizer has " + std::to_string(vocab.tokens.size()) +
                    " pieces but the checkpoint's "
                    "vocab_size is " +
                    std::to_string(c.vocab_size) + ": wrong --tokenizer for this model?");

    GgufWriter w;
    // Metadata: llama.cpp's keys, in the order its converters write them.
    w.add_string("general.architecture", "llama");
    w.add_string("general.name", name);
    w.add_u32("general.file_type", llama_file_type(type));
    w.add_u32("llama.vocab_size", static_cast<uint32_t>(c.vocab_size));
    w.add_u32("llama.context_length", static_cast<uint32_t>(c.seq_len));
    w.add_u32("llama.embedding_length", static_cast<uint32_t>(c.dim));
    w.add_u32("llama.feed_forward_length", static_cast<uint32_t>(c.hidden_dim));
    w.add_u32("llama.block_count", static_cast<uint32_t>(c.n_layers));
    w.add_u32("llama.attention.head_count", static_cast<uint32_t>(c.n_heads));
    w.add_u32("llama.attention.head_count_kv", static_cast<uint32_t>(c.n_kv_heads));
    w.add_u32("llama.rope.dimension_count", static_cast<uint32_t>(c.head_size()));
    // llama2.c's model.py: RMSNorm eps 1e-5 and RoPE theta 10000 are fixed there, not stored in the checkpoint.
    w.add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
    w.add_f32("llama.rope.freq_base", 10000.0f);

    w.add_string("tokenizer.ggml.model", "llama");
    w.add_string_array("tokenizer.ggml.tokens", vocab.tokens);
    w.add_f32_array("tokenizer.ggml.scores", vocab.scores);
    w.add_i32_array("tokenizer.ggml.token_type", vocab.types);
    if (vocab.bos_id >= 0) w.add_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(vocab.bos_id));
    if (vocab.eos_id >= 0) w.add_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(vocab.eos_id));
    if (vocab.unk_id >= 0) w.add_u32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(vocab.unk_id));
    if (vocab.pad_id >= 0) w.add_u32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(vocab.pad_id));
    // llama2.c's run.c prepends BOS to every prompt and never appends EOS.
    w.add_bool("tokenizer.ggml.add_bos_token", true);
    w.add_bool("tokenizer.ggml.add_eos_token", false);

    bool any_quantized = false;
    auto matrix = [&](const std::string& tname, const float* data, uint64_t rows, uint64_t cols) {
        const GgmlType t = matrix_type_for(type, cols);
        any_quantized |= ggml_type_info(t).block_size > 1;
        if (notes) notes->push_back(ConvertNote{tname, t, t != type});
        w.add_tensor(tname, t, {cols, rows}, encode_rows(t, data, cols, rows));
    };
    auto norm = [&](const std::string& tname, const float* data, uint64_t n) {
        w.add_tensor(tname, GgmlType::F32, {n}, f32_bytes(data, n));  // norms stay f32: tiny, and precision-critical
    };

    const uint64_t d = c.dim, h = c.hidden_dim, kv = c.kv_dim(), V = c.vocab_size;
    // Tensor order as llama.cpp's convert-llama2c writes it.
    matrix("token_embd.weight", ck.token_embedding.data(), V, d);
    norm("output_norm.weight", ck.rms_final.data(), d);
    // A shared classifier gets no output.weight: tandem (like llama.cpp) ties the output to token_embd then.
    if (!c.shared_classifier) matrix("output.weight", ck.wcls.data(), V, d);
    for (int l = 0; l < c.n_layers; ++l) {
        const std::string p = "blk." + std::to_string(l) + ".";
        matrix(p + "attn_q.weight", ck.wq.data() + l * d * d, d, d);
        matrix(p + "attn_k.weight", ck.wk.data() + l * kv * d, kv, d);
        matrix(p + "attn_v.weight", ck.wv.data() + l * kv * d, kv, d);
        matrix(p + "attn_output.weight", ck.wo.data() + l * d * d, d, d);
        norm(p + "attn_norm.weight", ck.rms_att.data() + l * d, d);
        matrix(p + "ffn_gate.weight", ck.w1.data() + l * h * d, h, d);
        matrix(p + "ffn_down.weight", ck.w2.data() + l * d * h, d, h);
        matrix(p + "ffn_up.weight", ck.w3.data() + l * h * d, h, d);
        norm(p + "ffn_norm.weight", ck.rms_ffn.data() + l * d, d);
    }
    if (any_quantized) w.add_u32("general.quantization_version", 2);
    return w;
}

}  // namespace tandem
