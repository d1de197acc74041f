// write_synthetic_model: shapes, random weights and a made-up vocabulary.
#include "common/synthetic_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "cpu/fp16.h"
#include "cpu/quant.h"
#include "common/splitmix.h"
#include "error.h"
#include "gguf/gguf_writer.h"

namespace tandem {
namespace {

using Rng = SplitMix64;

// A matrix of `rows` rows × `cols` columns with uniform values of standard deviation 1/sqrt(cols), so that
// activations keep their scale through the layers.
// Types that tandem reads but cannot write (the k-quants) get random codes instead: random bytes, every fp16 scale
// field of every block set to one value s, chosen so that the matrix's RMS is the wanted 1/sqrt(cols) (a block's
// values are linear in s when d and dmin are both s; the codes' mean makes them far from zero-mean, which RMSNorm
// absorbs). Enough for speed and for comparing backends, which is what synthetic models are for.
std::vector<uint8_t> random_codes_matrix(Rng& rng, GgmlType type, int64_t cols, int64_t rows) {
    const GgmlTypeInfo info = ggml_type_info(type);
    const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(cols));
    std::vector<uint8_t> out(row_bytes * static_cast<size_t>(rows));
    for (size_t i = 0; i + 8 <= out.size(); i += 8) {
        const uint64_t r = rng.next();
        std::memcpy(out.data() + i, &r, 8);
    }
    const std::vector<size_t> scales = ggml_fp16_scale_offsets(type);
    auto set_scales = [&](float s) {
        const uint16_t h = cpu::fp32_to_fp16(s);
        for (size_t b = 0; b < out.size() / info.type_size; ++b)
            for (size_t off : scales) std::memcpy(out.data() + b * info.type_size + off, &h, 2);
    };
    set_scales(1.0f);
    std::vector<float> row(static_cast<size_t>(cols));
    cpu::dequantize_row(type, out.data(), row.data(), cols);
    double ss = 0;
    for (float v : row) ss += static_cast<double>(v) * v;
    const double rms = std::sqrt(ss / static_cast<double>(cols));
    set_scales(static_cast<float>(1.0 / std::sqrt(static_cast<double>(cols)) / std::max(rms, 1e-3)));
    return out;
}

std::vector<uint8_t> random_matrix(Rng& rng, GgmlType type, int64_t cols, int64_t rows) {
    const bool bf16 = type == GgmlType::BF16;  // written by truncating binary32 values (no NaN patterns)
    if (!bf16 && !cpu::cpu_can_quantize(type)) return random_codes_matrix(rng, type, cols, rows);
    const float amp = std::sqrt(3.0f / static_cast<float>(cols));
    const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(cols));
    std::vector<uint8_t> out(row_bytes * static_cast<size_t>(rows));
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
        for (float& v : row) v = amp * rng.uniform_pm1();
        uint8_t* dst = out.data() + row_bytes * static_cast<size_t>(r);
        if (bf16) {
            for (int64_t i = 0; i < cols; ++i) {
                uint32_t bits;
                std::memcpy(&bits, &row[static_cast<size_t>(i)], 4);
                const uint16_t h = static_cast<uint16_t>(bits >> 16);
                std::memcpy(dst + 2 * i, &h, 2);
            }
        } else {
            cpu::quantize_row(type, row.data(), dst, cols);
        }
    }
    return out;
}

// An F32 tensor's bytes.
std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
    std::vector<uint8_t> out(v.size() * sizeof(float));
    std::memcpy(out.data(), v.data(), out.size());
    return out;
}

std::vector<uint8_t> ones_f32(int64_t n) { return f32_bytes(std::vector<float>(static_cast<size_t>(n), 1.0f)); }

// RMSNorm weights uniform in [0.75, 1.25]. Not all ones: a norm of unit weights keeps a quantized embedding's values
// on its block's grid (a Q4_0 block's k * d, scaled by one factor), so the 8-bit activations made from them land on
// exact rounding ties (the block's max 8 d becomes code 127, and 4 d becomes 63.5), and the last bit of a sum, which
// differs between any two correct implementations, decides their codes. Real models' norms are not ones either.
std::vector<uint8_t> norm_weights(Rng& rng, int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& f : v) f = 1.0f + 0.25f * rng.uniform_pm1();
    return f32_bytes(v);
}

}  // namespace

void add_synthetic_vocabulary(GgufWriter& w, int n_vocab) {
    std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
    std::vector<int32_t> types = {2, 3, 3};
    char buf[16];
    for (int b = 0; b < 256; ++b) {
        std::snprintf(buf, sizeof buf, "<0x%02X>", b);
        tokens.push_back(buf);
        types.push_back(6);
    }
    const std::string letters = "abcdefghijklmnopqrstuvwxyz";
    for (int i = 0; static_cast<int>(tokens.size()) < n_vocab; ++i) {
        // "▁" + a base-26 spelling of i: unique, and a plausible piece.
        std::string piece = "\xe2\x96\x81";
        for (int v = i;; v = v / 26 - 1) {
            piece.insert(3, 1, letters[static_cast<size_t>(v % 26)]);
            if (v < 26) break;
        }
        tokens.push_back(piece);
        types.push_back(1);
    }
    std::vector<float> scores(tokens.size());
    for (size_t i = 0; i < scores.size(); ++i) scores[i] = types[i] == 1 ? -static_cast<float>(i) : 0.0f;
    w.add_string("tokenizer.ggml.model", "llama");
    w.add_string_array("tokenizer.ggml.tokens", tokens);
    w.add_f32_array("tokenizer.ggml.scores", scores);
    w.add_i32_array("tokenizer.ggml.token_type", types);
    w.add_u32("tokenizer.ggml.unknown_token_id", 0);
    w.add_u32("tokenizer.ggml.bos_token_id", 1);
    w.add_u32("tokenizer.ggml.eos_token_id", 2);
    w.add_bool("tokenizer.ggml.add_bos_token", true);
}

namespace {

// The ids 3..end-1 in the cycle's order, fixed by the vocabulary size alone (Fisher-Yates, fixed seed): order[i]
// leads to order[i + 1].
std::vector<int> cycle_order(int n_vocab, int end) {
    std::vector<int> order;
    for (int t = 3; t < end; ++t) order.push_back(t);
    Rng cycle_rng{0x5eed0000ull + static_cast<uint64_t>(n_vocab)};
    for (size_t i = order.size() - 1; i > 0; --i) std::swap(order[i], order[cycle_rng.next() % (i + 1)]);
    return order;
}

// A replayed draft's pick at one id that is not sure of itself: its embedding is the pick's row plus `beta` times
// each runner-up's, so that their logits come near the pick's and its softmax probability falls to the step's.
struct MixedPick {
    int runner_ups[3] = {0, 0, 0};
    float confidence = 1.0f;
};

// Output row r dequantized and centred per 32 columns (k-quant rows have per-sub-block offsets that would
// otherwise favour some rows over the one the embedding points at).
std::vector<float> centred_row(const std::vector<uint8_t>& output, GgmlType type, int64_t dim, int r) {
    std::vector<float> row(static_cast<size_t>(dim));
    cpu::dequantize_row(type, output.data() + ggml_row_bytes(type, static_cast<uint64_t>(dim)) * static_cast<size_t>(r),
                        row.data(), dim);
    for (int64_t g = 0; g < dim; g += 32) {
        const int64_t end = std::min<int64_t>(dim, g + 32);
        double mean = 0;
        for (int64_t i = g; i < end; ++i) mean += row[static_cast<size_t>(i)];
        mean /= static_cast<double>(end - g);
        for (int64_t i = g; i < end; ++i) row[static_cast<size_t>(i)] -= static_cast<float>(mean);
    }
    return row;
}

// The weight of the runner-ups for which the model's top probability comes nearest `p`. The model computes
// logits = W normalize(e) (its layers add nothing, its norms' weights are 1); over the pick, its runner-ups and the
// rest of the vocabulary, whose mass `rest` (the sum of exp of the other rows' logits) is estimated once from the
// rows' norms. Bisection over [0, 0.9] on the f16 embedding the file will hold: at 0.9 the pick is still ahead
// of its runner-ups by a margin that rounding of the activations does not undo.
float runner_up_weight(const std::vector<std::vector<float>>& rows, const std::vector<std::vector<float>>& centred,
                       double rest, float eps, float p) {
    const size_t dim = rows[0].size();
    std::vector<float> e(dim);
    const auto top_probability = [&](double beta) {
        double ss = 0;
        for (size_t i = 0; i < dim; ++i) {
            float v = centred[0][i];
            for (size_t k = 1; k < centred.size(); ++k) v += static_cast<float>(beta) * centred[k][i];
            e[i] = cpu::fp16_to_fp32(cpu::fp32_to_fp16(v));
            ss += static_cast<double>(e[i]) * e[i];
        }
        const double scale = 1.0 / std::sqrt(ss / static_cast<double>(dim) + eps);
        std::vector<double> logits;
        for (const std::vector<float>& r : rows) {
            double l = 0;
            for (size_t i = 0; i < dim; ++i) l += static_cast<double>(r[i]) * e[i];
            logits.push_back(l * scale);
        }
        double sum = rest * std::exp(-logits[0]);
        for (double l : logits) sum += std::exp(l - logits[0]);
        return 1.0 / sum;
    };
    double lo = 0.0, hi = 0.9;
    if (top_probability(lo) <= p) return 0.0f;
    if (top_probability(hi) >= p) return static_cast<float>(hi);
    for (int it = 0; it < 30; ++it) {
        const double mid = 0.5 * (lo + hi);
        (top_probability(mid) > p ? lo : hi) = mid;
    }
    return static_cast<float>(0.5 * (lo + hi));
}

// The embedding of a next-token model (synthetic_model.h): row t is output row successor[t], dequantized, centred
// per 32 columns, in f16: its logit is that row's squared norm over its RMS, far above any other row's. Where
// `mixed` names runner-ups for t (a replayed draft unsure there), their rows are added with the weight that gives
// the pick the step's probability.
std::vector<uint8_t> successor_embedding(const std::vector<uint8_t>& output, GgmlType output_type, int64_t dim,
                                         const std::vector<int>& successor,
                                         const std::vector<std::optional<MixedPick>>& mixed, float eps) {
    const size_t n_vocab = successor.size();
    std::vector<uint8_t> out(n_vocab * static_cast<size_t>(dim) * 2);
    // The vocabulary's mass outside the pick and its runner-ups, for a normalized activation of norm sqrt(dim) at
    // random to row j: a logit of variance |row j|^2, so E exp(logit) = exp(|row j|^2 / 2).
    double rest = 0;
    if (!mixed.empty()) {
        std::vector<float> row(static_cast<size_t>(dim));
        const size_t row_bytes = ggml_row_bytes(output_type, static_cast<uint64_t>(dim));
        for (size_t r = 0; r < n_vocab; ++r) {
            cpu::dequantize_row(output_type, output.data() + row_bytes * r, row.data(), dim);
            double ss = 0;
            for (float v : row) ss += static_cast<double>(v) * v;
            rest += std::exp(ss / 2);
        }
    }
    for (size_t t = 0; t < n_vocab; ++t) {
        std::vector<float> e = centred_row(output, output_type, dim, successor[t]);
        if (t < mixed.size() && mixed[t]) {
            std::vector<std::vector<float>> rows, centred = {e};
            std::vector<float> plain(static_cast<size_t>(dim));
            const size_t row_bytes = ggml_row_bytes(output_type, static_cast<uint64_t>(dim));
            for (int r : {successor[t], mixed[t]->runner_ups[0], mixed[t]->runner_ups[1], mixed[t]->runner_ups[2]}) {
                cpu::dequantize_row(output_type, output.data() + row_bytes * static_cast<size_t>(r), plain.data(), dim);
                rows.push_back(plain);
                if (r != successor[t]) centred.push_back(centred_row(output, output_type, dim, r));
            }
            const float beta = runner_up_weight(rows, centred, rest, eps, mixed[t]->confidence);
            for (size_t k = 1; k < centred.size(); ++k)
                for (size_t i = 0; i < e.size(); ++i) e[i] += beta * centred[k][i];
        }
        for (int64_t i = 0; i < dim; ++i) {
            const uint16_t h = cpu::fp32_to_fp16(e[static_cast<size_t>(i)]);
            std::memcpy(out.data() + 2 * (t * static_cast<size_t>(dim) + static_cast<size_t>(i)), &h, 2);
        }
    }
    return out;
}

// The replayed draft's uncertain picks (rule.pattern's steps below the plain pick's confidence): at the cycle's
// j-th id, the runner-ups are the ids 3, 4 and 5 steps on (neither the target's next id nor the draft's pick).
std::vector<std::optional<MixedPick>> mixed_picks(int n_vocab, const SyntheticNextToken& rule) {
    std::vector<std::optional<MixedPick>> mixed;
    if (rule.pattern.empty()) return mixed;
    const std::vector<int> order = cycle_order(n_vocab, std::min(n_vocab, rule.cycle_ids));
    mixed.resize(static_cast<size_t>(n_vocab));
    const size_t n = order.size();
    for (size_t j = 0; j < n; ++j) {
        const float p = replayed_confidence(rule.pattern[j % rule.pattern.size()]);
        if (p >= 0.99f) continue;
        MixedPick m;
        for (int k = 0; k < 3; ++k) m.runner_ups[k] = order[(j + 3 + static_cast<size_t>(k)) % n];
        m.confidence = p;
        mixed[static_cast<size_t>(order[j])] = m;
    }
    return mixed;
}

// llama.cpp's rule for the tensors of a mixture that get more bits (src/llama-quant.cpp, use_more_bits): the first
// and last eighth of them and every third in between.
bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// The count llama.cpp's quantizer gives layer `layer`'s attn_v (or ffn_down): it counts them in the order the file
// lists them, which its converter sorts by name (blk.0, blk.1, blk.10, blk.11, ...): the rank of the layer's name.
int name_rank(int layer, int n_layers) {
    int rank = 0;
    for (int j = 0; j < n_layers; ++j) rank += std::to_string(j) < std::to_string(layer);
    return rank;
}

}  // namespace

SyntheticTypes SyntheticTypes::Q4_K_M() {
    SyntheticTypes t(GgmlType::Q4_K);
    t.k_m = true;
    return t;
}

SyntheticTypes SyntheticTypes::Q5_K_M() {
    SyntheticTypes t(GgmlType::Q5_K);
    t.k_m = true;
    return t;
}

std::string SyntheticTypes::name() const {
    if (k_m) return type == GgmlType::Q5_K ? "q5_k_m" : "q4_k_m";
    return ggml_type_name(type);
}

std::optional<SyntheticTypes> synthetic_types_from_name(const std::string& name) {
    std::string lower = name;
    for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (lower == "q4_k_m") return SyntheticTypes::Q4_K_M();
    if (lower == "q5_k_m") return SyntheticTypes::Q5_K_M();
    if (auto type = ggml_type_from_name(name)) return SyntheticTypes(*type);
    return std::nullopt;
}

GgmlType synthetic_matrix_type(const SyntheticShape& shape, const SyntheticTypes& types, const std::string& tensor,
                               int layer, int64_t cols) {
    GgmlType t = types.type;
    if (types.k_m) {
        // llama.cpp's Q4_K_M and Q5_K_M (llama_tensor_get_type): the base type, but the output in Q6_K, and attn_v
        // and ffn_down in Q6_K where use_more_bits picks their count; rows that are not whole super-blocks take its
        // fallbacks (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0). Q4_K_M checked against the two Qwen2.5-Coder files
        // (test_real_models.cpp).
        const bool more = (tensor == "attn_v" || tensor == "ffn_down") &&
                          use_more_bits(name_rank(layer, shape.n_layers), shape.n_layers);
        t = tensor == "output" || more ? GgmlType::Q6_K : types.type;
        if (cols % 256 != 0)
            t = t == GgmlType::Q6_K ? GgmlType::Q8_0 : t == GgmlType::Q5_K ? GgmlType::Q5_1 : GgmlType::Q5_0;
    }
    return cols % static_cast<int64_t>(ggml_type_info(t).block_size) == 0 ? t : GgmlType::F16;
}

std::vector<int> synthetic_successors(int n_vocab, const SyntheticNextToken& rule) {
    if (n_vocab < 5) throw Error("synthetic next-token rule: the vocabulary needs at least 5 tokens");
    if (!(rule.agreement >= 0.0 && rule.agreement <= 1.0))
        throw Error("synthetic next-token rule: agreement must be in [0, 1]");
    const int end = std::min(n_vocab, rule.cycle_ids);
    if (end < 5) throw Error("synthetic next-token rule: the cycle needs at least 2 ids");
    if (!rule.pattern.empty() && end < 9)
        throw Error("synthetic next-token rule: a replayed pattern needs a cycle of at least 6 ids");
    const std::vector<int> order = cycle_order(n_vocab, end);
    std::vector<int> cycle(static_cast<size_t>(n_vocab), order[0]);  // ids outside the cycle lead into it
    for (size_t i = 0; i < order.size(); ++i) cycle[static_cast<size_t>(order[i])] = order[(i + 1) % order.size()];
    if (!rule.pattern.empty()) {  // the j-th id of the cycle takes step j of the recording, round and round
        std::vector<int> successor = cycle;
        for (size_t j = 0; j < order.size(); ++j)
            if (!rule.pattern[j % rule.pattern.size()].agrees)
                successor[static_cast<size_t>(order[j])] = order[(j + 2) % order.size()];
        return successor;
    }
    if (rule.agreement >= 1.0) return cycle;
    std::vector<int> successor(cycle.size());
    Rng rng{rule.seed};
    for (size_t t = 0; t < cycle.size(); ++t) {
        const double u = static_cast<double>(rng.next() >> 11) * (1.0 / 9007199254740992.0);
        const int next = cycle[t];
        successor[t] = u < rule.agreement ? next : cycle[static_cast<size_t>(next)];
    }
    return successor;
}

float replayed_confidence(const AgreementStep& step) { return std::clamp(step.confidence, 0.3f, 0.99f); }

std::string format_agreement_steps(const std::vector<AgreementStep>& steps) {
    std::string line;
    char buf[32];
    for (const AgreementStep& st : steps) {
        std::snprintf(buf, sizeof buf, "%s%d:%.3f", line.empty() ? "" : " ", st.agrees ? 1 : 0,
                      static_cast<double>(st.confidence));
        line += buf;
    }
    return line;
}

std::vector<AgreementStep> read_agreement_pattern(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw Error(path + ": cannot open the agreement pattern");
    std::vector<AgreementStep> steps;
    std::string line;
    for (int line_no = 1; std::getline(in, line); ++line_no) {
        if (!line.empty() && line[0] == '#') continue;
        std::istringstream words(line);
        for (std::string w; words >> w;) {
            char* end = nullptr;
            const float p =
                w.size() > 2 && (w[0] == '0' || w[0] == '1') && w[1] == ':' ? std::strtof(w.c_str() + 2, &end) : -1.0f;
            if (!end || *end != '\0' || !(p >= 0.0f && p <= 1.0f))
                throw Error(path + ":" + std::to_string(line_no) + ": '" + w +
                            "' is not a step A:P (A 0 or 1, P a probability)");
            steps.push_back({w[0] == '1', p});
        }
    }
    if (steps.empty()) throw Error(path + ": the agreement pattern has no steps");
    return steps;
}

uint64_t SyntheticShape::n_params() const {
    const uint64_t head_dim = static_cast<uint64_t>(dim) / n_heads;
    const uint64_t kv = head_dim * n_kv_heads;
    const uint64_t biases = arch == "qwen2" ? dim + 2 * kv : 0;
    const uint64_t per_layer = 2ull * dim + 2ull * dim * dim + 2ull * dim * kv + 3ull * dim * hidden_dim + biases;
    return per_layer * n_layers + static_cast<uint64_t>(dim) * n_vocab * (tied_output ? 1 : 2) + dim;
}

std::optional<SyntheticShape> synthetic_preset(const std::string& name) {
    if (name == "tiny") return SyntheticShape{"tiny", 256, 768, 4, 8, 2, 1024, 512, false};
    if (name == "1b") return SyntheticShape{"1b", 2048, 5632, 22, 32, 4, 32000, 2048, false};
    if (name == "7b") return SyntheticShape{"7b", 4096, 11008, 32, 32, 32, 32000, 4096, false};
    if (name == "qwen1.5b") return SyntheticShape{"qwen1.5b", 1536, 8960, 28, 12, 2, 151936, 4096, false, "qwen2"};
    if (name == "qwen0.5b") return SyntheticShape{"qwen0.5b", 896, 4864, 24, 14, 2, 151936, 4096, false, "qwen2"};
    return std::nullopt;
}

void write_synthetic_model(const std::string& path, const SyntheticShape& s, const SyntheticTypes& types, uint64_t seed,
                           const std::optional<SyntheticNextToken>& next) {
    if (!cpu::find_kernels(types.type))
        throw Error(std::string("synthetic models of type ") + ggml_type_name(types.type) + " are not supported");
    if (s.dim % s.n_heads || s.n_heads % s.n_kv_heads)
        throw Error("synthetic shape: dim must be a multiple of heads, and heads of kv heads");
    if (s.arch != "llama" && s.arch != "qwen2") throw Error("synthetic shape: architecture '" + s.arch + "' unknown");
    if (next && s.tied_output) throw Error("synthetic next-token models need a separate output matrix");
    const std::vector<int> successor = next ? synthetic_successors(s.n_vocab, *next) : std::vector<int>{};
    const bool qwen2 = s.arch == "qwen2";
    Rng rng{seed};
    // The norms' weights come from their own stream, so that every matrix keeps the values it had when they were ones.
    Rng norm_rng{seed ^ 0x6e6f726d73ull};
    const int64_t kv_dim = static_cast<int64_t>(s.dim) / s.n_heads * s.n_kv_heads;

    GgufWriter w;
    const std::string a = s.arch + ".";
    w.add_string("general.architecture", s.arch);
    w.add_string("general.name", "synthetic-" + s.name + "-" + types.name() + (next ? "-next-token" : ""));
    w.add_u32(a + "context_length", static_cast<uint32_t>(s.context_length));
    w.add_u32(a + "embedding_length", static_cast<uint32_t>(s.dim));
    w.add_u32(a + "feed_forward_length", static_cast<uint32_t>(s.hidden_dim));
    w.add_u32(a + "block_count", static_cast<uint32_t>(s.n_layers));
    w.add_u32(a + "attention.head_count", static_cast<uint32_t>(s.n_heads));
    w.add_u32(a + "attention.head_count_kv", static_cast<uint32_t>(s.n_kv_heads));
    w.add_u32(a + "rope.dimension_count", static_cast<uint32_t>(s.dim / s.n_heads));
    w.add_f32(a + "attention.layer_norm_rms_epsilon", qwen2 ? 1e-6f : 1e-5f);
    w.add_f32(a + "rope.freq_base", qwen2 ? 1e6f : 10000.0f);
    add_synthetic_vocabulary(w, s.n_vocab);

    // Matrix `tensor` ("attn_q", ...) of layer `layer` (-1: a model-wide one, "token_embd" or "output").
    auto matrix_type = [&](const std::string& tensor, int layer, int64_t cols) {
        return synthetic_matrix_type(s, types, tensor, layer, cols);
    };
    auto add_matrix = [&](const std::string& tensor, int layer, int64_t cols, int64_t rows) {
        const GgmlType t = matrix_type(tensor, layer, cols);
        const std::string name = (layer >= 0 ? "blk." + std::to_string(layer) + "." : "") + tensor + ".weight";
        w.add_tensor(name, t, {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)},
                     random_matrix(rng, t, cols, rows));
    };
    // A next-token model's output projections are zero (its layers add nothing to the residual stream), and its
    // embedding is derived from its output matrix.
    auto add_projection = [&](const std::string& tensor, int layer, int64_t cols, int64_t rows) {
        if (!next) return add_matrix(tensor, layer, cols, rows);
        const GgmlType t = matrix_type(tensor, layer, cols);
        w.add_tensor("blk." + std::to_string(layer) + "." + tensor + ".weight", t,
                     {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)},
                     std::vector<uint8_t>(ggml_row_bytes(t, static_cast<uint64_t>(cols)) * static_cast<size_t>(rows)));
    };
    const uint64_t dim = static_cast<uint64_t>(s.dim), n_vocab = static_cast<uint64_t>(s.n_vocab);
    if (next) {
        const GgmlType t = matrix_type("output", -1, s.dim);
        std::vector<uint8_t> output = random_matrix(rng, t, s.dim, s.n_vocab);
        w.add_tensor(
            "token_embd.weight", GgmlType::F16, {dim, n_vocab},
            successor_embedding(output, t, s.dim, successor, mixed_picks(s.n_vocab, *next), qwen2 ? 1e-6f : 1e-5f));
        w.add_tensor("output_norm.weight", GgmlType::F32, {dim}, ones_f32(s.dim));
        w.add_tensor("output.weight", t, {dim, n_vocab}, std::move(output));
    } else {
        add_matrix("token_embd", -1, s.dim, s.n_vocab);
        w.add_tensor("output_norm.weight", GgmlType::F32, {dim}, norm_weights(norm_rng, s.dim));
        if (!s.tied_output) add_matrix("output", -1, s.dim, s.n_vocab);
    }
    // A next-token model's norms stay ones: its construction (successor_embedding) assumes them.
    auto layer_norm = [&] { return next ? ones_f32(s.dim) : norm_weights(norm_rng, s.dim); };
    for (int l = 0; l < s.n_layers; ++l) {
        const std::string p = "blk." + std::to_string(l) + ".";
        w.add_tensor(p + "attn_norm.weight", GgmlType::F32, {static_cast<uint64_t>(s.dim)}, layer_norm());
        add_matrix("attn_q", l, s.dim, s.dim);
        add_matrix("attn_k", l, s.dim, kv_dim);
        add_matrix("attn_v", l, s.dim, kv_dim);
        if (qwen2)
            for (const auto& [name, n] : {std::pair{"attn_q.bias", int64_t{s.dim}}, std::pair{"attn_k.bias", kv_dim},
                                          std::pair{"attn_v.bias", kv_dim}})
                w.add_tensor(p + name, GgmlType::F32, {static_cast<uint64_t>(n)},
                             random_matrix(rng, GgmlType::F32, n, 1));
        add_projection("attn_output", l, s.dim, s.dim);
        w.add_tensor(p + "ffn_norm.weight", GgmlType::F32, {static_cast<uint64_t>(s.dim)}, layer_norm());
        add_matrix("ffn_gate", l, s.dim, s.hidden_dim);
        add_matrix("ffn_up", l, s.dim, s.hidden_dim);
        add_projection("ffn_down", l, s.hidden_dim, s.dim);
    }
    w.write(path);
}

}  // namespace tandem
