// A random problem for the integer (8-bit activation) kernels, shared by their tests: `rows` x `cols` weights of a
// type with valid random blocks, `tokens` activation rows quantized as matmul does, the scalar kernel's result
// (the definition every SIMD kernel must match bit for bit), and a bitwise comparison that names the first
// difference.
#pragma once
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/quant_q8.h"
#include "gguf/ggml_types.h"
#include "random_blocks.h"

namespace tandem::test {

struct Q8Problem {
    GgmlType type;
    int64_t rows, cols, tokens;
    std::vector<uint8_t> w, xq;
    size_t row_bytes, xs;  // bytes of a weight row, of a quantized activation row
};

inline Q8Problem make_q8_problem(GgmlType type, int64_t rows, int64_t cols, int64_t tokens, std::mt19937& rng) {
    Q8Problem p{type, rows, cols, tokens, random_blocks(type, cols, rows, rng), {}, 0, 0};
    const cpu::Q8TypeKernels* k = cpu::find_q8_kernels(type);
    p.row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(cols));
    p.xs = cpu::act_row_bytes(k->act, cols);
    p.xq.resize(p.xs * static_cast<size_t>(tokens));
    for (int64_t t = 0; t < tokens; ++t) {
        std::vector<float> x = random_floats(cols, rng);
        cpu::quantize_activations(k->act, x.data(), p.xq.data() + t * p.xs, cols);
    }
    return p;
}

// y[t * rows + r] for the whole problem, by the scalar kernel.
inline std::vector<float> scalar_q8_result(const Q8Problem& p) {
    std::vector<float> y(static_cast<size_t>(p.rows * p.tokens));
    cpu::find_q8_kernels(p.type)->dot_rows_scalar(p.w.data(), p.row_bytes, p.cols, 0, p.rows, p.xq.data(), p.xs,
                                                  p.tokens, y.data(), p.rows);
    return y;
}

// A kernel run in pieces: `call(a, b, x, n, y, ys)` for every cell of unit_cuts x token_cuts (a..b: the kernel's
// units, rows or row groups; x and y: the activations and output of the cell's first token, n tokens, y rows ys
// floats apart), into token rows padded by `pad` floats that must stay untouched. Empty cells are skipped. Returns
// y[t * rows + r].
template <class Call>
std::vector<float> padded_split_result(const Q8Problem& p, const std::vector<int64_t>& unit_cuts,
                                       const std::vector<int64_t>& token_cuts, int64_t pad, Call call) {
    const int64_t ys = p.rows + pad;
    std::vector<float> y(static_cast<size_t>(ys * p.tokens), -7.0f);
    for (size_t i = 0; i + 1 < unit_cuts.size(); ++i)
        for (size_t j = 0; j + 1 < token_cuts.size(); ++j) {
            const int64_t t0 = token_cuts[j], t1 = token_cuts[j + 1];
            if (t1 > t0 && unit_cuts[i + 1] > unit_cuts[i])
                call(unit_cuts[i], unit_cuts[i + 1], p.xq.data() + t0 * p.xs, t1 - t0, y.data() + t0 * ys, ys);
        }
    std::vector<float> out(static_cast<size_t>(p.rows * p.tokens));
    for (int64_t t = 0; t < p.tokens; ++t)
        for (int64_t r = 0; r < ys; ++r) {
            if (r < p.rows)
                out[t * p.rows + r] = y[t * ys + r];
            else
                CHECK(y[t * ys + r] == -7.0f);  // the padding: never written
        }
    return out;
}

// Bitwise equality (so -0 / +0 and NaN payloads count); reports the first difference.
inline void check_q8_bitwise(const std::vector<float>& got, const std::vector<float>& want, const Q8Problem& p,
                             const char* what) {
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i)
        if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
            FAIL_CHECK(what << " " << ggml_type_name(p.type) << " rows " << p.rows << " cols " << p.cols
                            << ": token " << i / p.rows << " row " << i % p.rows << " got " << got[i] << " want "
                            << want[i]);
            return;
        }
}

}  // namespace tandem::test
