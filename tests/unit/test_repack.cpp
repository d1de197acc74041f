// Tests of RepackedMatrix (cpu/repack.h): the row-lane kernels over the repacked layout are bitwise the scalar
// kernel of the type (dot_rows_scalar) for every (row, token), over shapes with partial row groups, any token count
// (tiles and their remainders), group ranges, extreme codes, and whatever the batch; and matmul with a repacked
// matrix equals matmul with the original; RepackedWeights' background thread pauses during prefill and releases every
// matrix. Skipped (with a message) on a CPU without the kernels.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cpu/matmul.h"
#include "cpu/quant.h"
#include "cpu/quant_q8.h"
#include "cpu/repack.h"
#include "cpu/thread_pool.h"
#include "error.h"
#include "q8_problem.h"
#include "random_blocks.h"
#include "model/weights.h"

using namespace tandem;
using namespace tandem::cpu;
using namespace tandem::test;

namespace {

const GgmlType kRepackTypes[] = {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0};

using Problem = Q8Problem;

// The repacked kernel over the given group cuts x token cuts (separate calls), into a y with padding after each
// token's rows that must stay untouched.
std::vector<float> repacked_result(const Problem& p, const RepackedMatrix& m, const std::vector<int64_t>& group_cuts,
                                   const std::vector<int64_t>& token_cuts) {
    return padded_split_result(p, group_cuts, token_cuts, 5,
                               [&](int64_t g0, int64_t g1, const uint8_t* x, int64_t n, float* y, int64_t ys) {
                                   m.dot_groups(g0, g1, x, p.xs, n, y, ys);
                               });
}

void check_bitwise(const std::vector<float>& got, const std::vector<float>& want, const Problem& p) {
    check_q8_bitwise(got, want, p, "repacked");
}

}  // namespace

TEST_CASE("repack: row-lane kernels are bitwise the scalar kernel, any shape, token count and group range") {
    std::mt19937 rng(77);
    ThreadPool pool(2);
    int checked = 0;
    for (GgmlType type : kRepackTypes) {
        if (!RepackedMatrix::available(type)) {
            MESSAGE(ggml_type_name(type) << ": no repacked kernel on this build or CPU, not checked");
            continue;
        }
        ++checked;
        // Legacy types also at 896 columns (the Qwen2.5 0.5B's width: 14 pairs of blocks, not whole super-blocks).
        const bool legacy = RepackedMatrix::record_elements(type) == 64;
        for (auto [rows, cols] : {std::pair<int64_t, int64_t>{16, 256}, {1, 512}, {37, 768}, {64, 1536}, {19, 256},
                                  {legacy ? 23 : 16, legacy ? 896 : 256}, {legacy ? 17 : 16, legacy ? 64 : 256}}) {
            for (int64_t tokens : {int64_t{1}, int64_t{2}, int64_t{7}, int64_t{8}, int64_t{9}, int64_t{19}}) {
                CAPTURE(rows);
                CAPTURE(cols);
                CAPTURE(tokens);
                const Problem p = make_q8_problem(type, rows, cols, tokens, rng);
                const RepackedMatrix m(type, p.w.data(), cols, rows, pool);
                const std::vector<float> want = scalar_q8_result(p);
                const int64_t G = m.n_groups();
                check_bitwise(repacked_result(p, m, {0, G}, {0, tokens}), want, p);
                // Each group alone, tokens one at a time and in uneven slices: the same bits (batch invariance).
                std::vector<int64_t> gc, tc;
                for (int64_t g = 0; g <= G; ++g) gc.push_back(g);
                for (int64_t t = 0; t <= tokens; ++t) tc.push_back(t);
                check_bitwise(repacked_result(p, m, gc, tc), want, p);
                check_bitwise(repacked_result(p, m, {0, G}, {0, tokens / 3, tokens}), want, p);
            }
        }
    }
    MESSAGE("repacked kernels checked: " << checked << " types");
}

TEST_CASE("repack: extreme codes and activations stay exact") {
    std::mt19937 rng(78);
    ThreadPool pool(1);
    for (GgmlType type : kRepackTypes) {
        if (!RepackedMatrix::available(type)) continue;
        const int64_t rows = 21, cols = 1024, tokens = 9;
        Problem p = make_q8_problem(type, rows, cols, tokens, rng);
        // Every code at its largest (Q4_K: nibbles 15, 6-bit scales and mins 63; Q6_K: codes 63, int8 scales -128;
        // Q4_0, Q5_0 nibbles and fifth bits all set; Q8_0: 127, unsigned 255), the fp16 scales left as they are, activations +-127:
        // the bounds of the integer sums.
        const size_t block = ggml_type_info(type).type_size;
        const std::vector<size_t> keep = scale_offsets(type);
        for (size_t b = 0; b < p.w.size() / block; ++b)
            for (size_t i = 0; i < block; ++i) {
                bool is_scale = false;
                for (size_t off : keep) is_scale |= i == off || i == off + 1;
                if (is_scale) continue;
                const bool q6_scale = type == GgmlType::Q6_K && i >= offsetof(BlockQ6_K, scales) &&
                                      i < offsetof(BlockQ6_K, scales) + 16;
                p.w[b * block + i] = q6_scale ? 0x80 : type == GgmlType::Q8_0 ? 0x7F : 0xFF;
            }
        std::vector<float> x(static_cast<size_t>(cols));
        for (int64_t t = 0; t < tokens; ++t) {
            for (int64_t i = 0; i < cols; ++i) x[i] = ((i + t) % 3 == 0) ? -1.0f : 1.0f;
            quantize_activations(find_q8_kernels(type)->act, x.data(), p.xq.data() + t * p.xs, cols);
        }
        const RepackedMatrix m(type, p.w.data(), cols, rows, pool);
        check_bitwise(repacked_result(p, m, {0, m.n_groups()}, {0, tokens}), scalar_q8_result(p), p);
    }
}

TEST_CASE("repack: a requantized copy is the Q4_0 kernel on the rows decoded and encoded again") {
    if (!RepackedMatrix::available(GgmlType::Q4_0)) {
        MESSAGE("Q4_0: no repacked kernel on this build or CPU, not checked");
        return;
    }
    // Which types a draft's copies are requantized to Q4_0 from: those with more bytes per element, at widths
    // that are whole pairs of blocks.
    CHECK(RepackedMatrix::requantized_type(GgmlType::Q5_0, 896, GgmlType::Q4_0) == GgmlType::Q4_0);
    CHECK(RepackedMatrix::requantized_type(GgmlType::Q8_0, 896, GgmlType::Q4_0) == GgmlType::Q4_0);
    CHECK(RepackedMatrix::requantized_type(GgmlType::Q6_K, 4864, GgmlType::Q4_0) == GgmlType::Q4_0);
    CHECK(RepackedMatrix::requantized_type(GgmlType::F16, 64, GgmlType::Q4_0) == GgmlType::Q4_0);
    CHECK(RepackedMatrix::requantized_type(GgmlType::Q4_K, 1536, GgmlType::Q4_0) == GgmlType::Q4_K);  // as small
    CHECK(RepackedMatrix::requantized_type(GgmlType::Q3_K, 1536, GgmlType::Q4_0) == GgmlType::Q3_K);  // smaller
    CHECK(RepackedMatrix::requantized_type(GgmlType::Q8_0, 96, GgmlType::Q4_0) == GgmlType::Q8_0);    // 3 blocks
    CHECK(RepackedMatrix::requantized_type(GgmlType::Q4_0, 896, GgmlType::Q4_0) == GgmlType::Q4_0);

    std::mt19937 rng(79);
    ThreadPool pool(2);
    for (GgmlType from : {GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q6_K, GgmlType::F16, GgmlType::F32}) {
        // The 0.5B's width (896) where the type allows it; Q6_K rows are whole super-blocks.
        const int64_t wide = from == GgmlType::Q6_K ? 768 : 896;
        for (auto [rows, cols] : {std::pair<int64_t, int64_t>{37, 256}, {16, wide}}) {
            CAPTURE(std::string(ggml_type_name(from)));
            CAPTURE(rows);
            CAPTURE(cols);
            const std::vector<uint8_t> w = random_weight_rows(from, static_cast<int>(rows), static_cast<int>(cols), rng);
            const RepackedMatrix m(from, w.data(), cols, rows, pool, nullptr, {}, GgmlType::Q4_0);
            CHECK(m.type() == GgmlType::Q4_0);
            CHECK(m.bytes() == RepackedMatrix::storage_bytes(GgmlType::Q4_0, cols, rows));
            // The expected copy: every row decoded to floats and encoded as Q4_0 by the reference quantizer.
            Problem p = make_q8_problem(GgmlType::Q4_0, rows, cols, 7, rng);
            std::vector<float> decoded(static_cast<size_t>(cols));
            const size_t from_row = ggml_row_bytes(from, static_cast<uint64_t>(cols));
            for (int64_t r = 0; r < rows; ++r) {
                dequantize_row(from, w.data() + r * from_row, decoded.data(), cols);
                quantize_row(GgmlType::Q4_0, decoded.data(), p.w.data() + r * p.row_bytes, cols);
            }
            check_bitwise(repacked_result(p, m, {0, m.n_groups()}, {0, p.tokens}), scalar_q8_result(p), p);
        }
    }
    // A type the CPU cannot decode is an error, not a wrong copy.
    std::vector<uint8_t> w(4096);
    CHECK_THROWS_AS(RepackedMatrix(GgmlType::IQ2_XXS, w.data(), 256, 2, pool, nullptr, {}, GgmlType::Q4_0), Error);
}

TEST_CASE("repack: a type without a layout, or a row that is not whole records, is an error") {
    ThreadPool pool(1);
    std::vector<uint8_t> w(4096);
    CHECK_THROWS_AS(RepackedMatrix(GgmlType::Q3_K, w.data(), 256, 2, pool), Error);
    CHECK_FALSE(RepackedMatrix::available(GgmlType::Q3_K, 256));
    CHECK_FALSE(RepackedMatrix::available(GgmlType::Q4_0, 96));  // three blocks: not whole pairs
    if (RepackedMatrix::available(GgmlType::Q4_0)) CHECK_THROWS_AS(RepackedMatrix(GgmlType::Q4_0, w.data(), 96, 2, pool), Error);
}

// RepackedWeights' background thread (cpu/repack.h): it pauses while a prefill pass runs anywhere in the process
// (between row groups, so at most the matrix in progress is published meanwhile), goes on afterwards, publishes every
// copy, and releases each matrix's file pages once (again after a forward pass that was running when it was
// published). The pause is in place before the copies start (a prefill pass of another RepackedWeights), so what
// is checked does not depend on how fast the background thread got going: once it depended on that, and a loaded
// machine had all 24 copies made before the pass began.
TEST_CASE("repack: background repacking pauses during a prefill pass and releases every matrix") {
    if (!RepackedMatrix::available(GgmlType::Q4_K)) {
        MESSAGE("Q4_K: no repacked kernel on this build or CPU, not checked");
        return;
    }
    std::mt19937 rng(5);
    constexpr int kMatrices = 24, kRows = 64, kCols = 2048;
    std::vector<std::vector<uint8_t>> data;
    std::vector<WeightView> views(kMatrices);
    std::vector<const WeightView*> ptrs;
    for (int i = 0; i < kMatrices; ++i) {
        data.push_back(random_weight_rows(GgmlType::Q4_K, kRows, kCols, rng));
        views[i] = WeightView{data.back().data(), GgmlType::Q4_K, kCols, kRows};
        ptrs.push_back(&views[i]);
    }
    RepackedWeights other_backend({}, [](const WeightView&) {});
    other_backend.begin_forward(/*prefill=*/true);
    std::mutex m;
    std::vector<const void*> released;
    RepackedWeights weights(ptrs, [&](const WeightView& v) {
        std::lock_guard<std::mutex> lock(m);
        released.push_back(v.data);
    });
    REQUIRE(weights.bytes() > 0);
    auto n_ready = [&] {
        int n = 0;
        for (const WeightView& v : views) n += weights.find(v.data) != nullptr;
        return n;
    };
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    CHECK(n_ready() <= 1);  // another backend's prefill: only the matrix in progress may be published
    weights.begin_forward(/*prefill=*/true);
    other_backend.end_forward(/*prefill=*/true);
    const int before = n_ready();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const int after = n_ready();
    CHECK(after <= before + 1);  // still paused by this backend's own pass
    CHECK(after <= 2);
    weights.end_forward(/*prefill=*/true);
    weights.wait();
    CHECK(n_ready() == kMatrices);
    // Each matrix released once, plus once more for those published while the pass above was running.
    std::lock_guard<std::mutex> lock(m);
    for (const WeightView& v : views) {
        const auto n = std::count(released.begin(), released.end(), v.data);
        CHECK(n >= 1);
        CHECK(n <= 2);
    }
    CHECK(static_cast<int>(released.size()) <= kMatrices + after + 1);
}

// RepackedWeights::wait() right after construction: the caller claims matrices beside the background thread; every
// matrix, of every repacked type, is published exactly once and released exactly once (no forward pass ran), and a
// published copy computes the same bits as the file's layout.
TEST_CASE("repack: waiting repacks beside the background thread, each matrix published and released once") {
    std::vector<GgmlType> types;
    for (GgmlType t : kRepackTypes)
        if (RepackedMatrix::available(t)) types.push_back(t);
    if (types.empty()) {
        MESSAGE("no repacked kernel on this build or CPU, not checked");
        return;
    }
    std::mt19937 rng(6);
    constexpr int kPerType = 6, kRows = 40, kCols = 1024;
    std::vector<std::vector<uint8_t>> data;
    std::vector<WeightView> views;
    for (GgmlType t : types)
        for (int i = 0; i < kPerType; ++i) data.push_back(random_weight_rows(t, kRows, kCols, rng));
    for (size_t i = 0; i < data.size(); ++i)
        views.push_back(WeightView{data[i].data(), types[i / kPerType], kCols, kRows});
    std::vector<const WeightView*> ptrs;
    for (const WeightView& v : views) ptrs.push_back(&v);
    std::mutex m;
    std::vector<const void*> released;
    RepackedWeights weights(ptrs, [&](const WeightView& v) {
        std::lock_guard<std::mutex> lock(m);
        released.push_back(v.data);
    });
    weights.wait();
    ThreadPool pool(2);
    std::vector<float> x(static_cast<size_t>(kCols) * 3);
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i));
    for (size_t i = 0; i < views.size(); ++i) {
        const RepackedMatrix* R = weights.find(views[i].data);
        REQUIRE(R != nullptr);
        std::lock_guard<std::mutex> lock(m);
        CHECK(std::count(released.begin(), released.end(), views[i].data) == 1);
        if (i % kPerType != 0) continue;
        CAPTURE(std::string(ggml_type_name(views[i].type)));
        std::vector<float> want(static_cast<size_t>(kRows) * 3), got(want.size());
        matmul(views[i].type, views[i].data, kCols, kRows, x.data(), 3, want.data(), pool, Activations::Int8);
        matmul(*R, x.data(), 3, got.data(), pool);
        CHECK(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0);
    }
    CHECK(released.size() == views.size());
}
