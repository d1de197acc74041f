// Tests of the device sampling helpers (kernels/sampling.cu) on the CPU emulation against the CPU sampler
// (src/sample/sampler.cpp) and plain references: argmax, softmax with temperature, top-k, and the gathers of speculative
// verification. Vocabulary sizes 1, 31, 32000 and 151,936 (Qwen2's), NaN / inf / signed-zero inputs and ties, in two
// or three thread orders; outputs start as NaN / -7 so that an element the kernels forgot shows up.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "emu/cuda_emu.h"
#include "kernels.h"
#include "sample/sampler.h"

using namespace tandem;
using tandem::emu::LaunchOptions;
using tandem::emu::ScopedLaunchOptions;
using tandem::emu::ThreadOrder;

namespace {

const std::vector<LaunchOptions> kOrders = {{ThreadOrder::Forward, 0}, {ThreadOrder::Reverse, 0}, {ThreadOrder::Shuffled, 5}};
const std::vector<LaunchOptions> kTwoOrders = {{ThreadOrder::Reverse, 0}, {ThreadOrder::Shuffled, 13}};

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

const char* order_name(const LaunchOptions& o) {
    return o.order == ThreadOrder::Forward ? "Forward" : o.order == ThreadOrder::Reverse ? "Reverse" : "Shuffled";
}

// The heavy shapes (151,936) run in one order, the others in several.
const std::vector<LaunchOptions>& orders_for(int n_vocab) {
    static const std::vector<LaunchOptions> one = {{ThreadOrder::Shuffled, 3}};
    return n_vocab > 100000 ? one : n_vocab > 1000 ? kTwoOrders : kOrders;
}

// Rows of logits: normal noise, some rows coarsely rounded so that ties are everywhere, plus the special values
// the sampler must handle placed at random.
std::vector<float> make_logits(int n_rows, int n_vocab, std::mt19937& rng, bool specials) {
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<float> v(static_cast<size_t>(n_rows) * n_vocab);
    for (int r = 0; r < n_rows; ++r)
        for (int i = 0; i < n_vocab; ++i) {
            float x = normal(rng);
            if (r % 2 == 1) x = std::round(x);  // many equal logits: the lower id must win
            v[static_cast<size_t>(r) * n_vocab + i] = x;
        }
    if (specials && n_vocab > 8) {
        std::uniform_int_distribution<int> pick(0, n_vocab - 1);
        for (int r = 0; r < n_rows; ++r) {
            float* row = &v[static_cast<size_t>(r) * n_vocab];
            for (int j = 0; j < 5; ++j) row[pick(rng)] = kNaN;
            for (int j = 0; j < 3; ++j) row[pick(rng)] = -kInf;
            row[pick(rng)] = -0.0f;
            row[pick(rng)] = 0.0f;
        }
    }
    return v;
}

float cleaned(float x) { return std::isnan(x) ? -kInf : x; }

// Sampler::argmax on a cleaned row; -1 where it throws.
int ref_argmax(const float* row, int n) {
    float mx = -kInf;
    for (int i = 0; i < n; ++i) mx = std::max(mx, cleaned(row[i]));
    if (mx == -kInf) return -1;
    for (int i = 0; i < n; ++i)
        if (cleaned(row[i]) == mx) return i;
    return -1;
}

// Sampler::softmax, operation for operation, on a cleaned row (the kernels' specification).
std::vector<float> ref_softmax(const float* row, int n, float temperature) {
    std::vector<float> l(n), p(n);
    for (int i = 0; i < n; ++i) l[i] = cleaned(row[i]);
    float mx = -kInf;
    for (float x : l) mx = x > mx ? x : mx;
    double sum = 0.0;
    for (int i = 0; i < n; ++i) {
        p[i] = l[i] == mx ? 1.0f : std::exp((l[i] - mx) / temperature);
        sum += p[i];
    }
    const double inv = 1.0 / sum;
    for (float& x : p) x = static_cast<float>(x * inv);
    return p;
}

// Sampler's top-k order (ByLogit): logit descending, then id ascending, on cleaned logits.
std::vector<int> ref_top_k(const float* row, int n, int k) {
    std::vector<int> ids(n);
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int a, int b) {
        const float la = cleaned(row[a]), lb = cleaned(row[b]);
        return la > lb || (la == lb && a < b);
    });
    ids.resize(k);
    return ids;
}

int64_t ulps(float a, float b) {
    auto ordered = [](float f) {
        const int32_t i = std::bit_cast<int32_t>(f);
        return i < 0 ? static_cast<int64_t>(INT32_MIN) - i : static_cast<int64_t>(i);
    };
    return std::abs(ordered(a) - ordered(b));
}

struct Shape {
    int n_rows, n_vocab;
};
const Shape kShapes[] = {{1, 1}, {4, 31}, {3, 32000}, {2, 151936}};

std::vector<uint64_t> workspace_for(int n_rows, int n_vocab) {
    return std::vector<uint64_t>((cuda::sampling_workspace_bytes(n_rows, n_vocab) + 7) / 8, ~uint64_t{0});
}

}  // namespace

TEST_CASE("cuda sampling: argmax picks the CPU sampler's greedy token") {
    std::mt19937 rng(21);
    for (const Shape& s : kShapes) {
        CAPTURE(s.n_vocab);
        for (bool specials : {false, true}) {
            CAPTURE(specials);
            const std::vector<float> logits = make_logits(s.n_rows, s.n_vocab, rng, specials);
            std::vector<int> want(s.n_rows);
            for (int r = 0; r < s.n_rows; ++r) {
                const float* row = &logits[static_cast<size_t>(r) * s.n_vocab];
                want[r] = ref_argmax(row, s.n_vocab);
                SamplerParams greedy;
                greedy.temperature = 0.0f;
                Sampler sampler(greedy, s.n_vocab);
                REQUIRE(sampler.sample(row, {}, 0) == want[r]);  // the reference is the sampler's rule
            }
            std::vector<uint64_t> ws = workspace_for(s.n_rows, s.n_vocab);
            std::vector<unsigned> counters(cuda::argmax_counters(s.n_rows), 0u);
            for (const LaunchOptions& o : orders_for(s.n_vocab)) {
                ScopedLaunchOptions scope(o);
                INFO("thread order " << std::string(order_name(o)));
                for (bool one_launch : {false, true}) {  // the splits combined by a second kernel, or by a last block
                    CAPTURE(one_launch);
                    std::vector<int> got(s.n_rows, -7);
                    cuda::argmax(logits.data(), s.n_rows, s.n_vocab, got.data(), ws.data(), nullptr,
                                 one_launch ? counters.data() : nullptr);
                    CHECK(got == want);
                    CHECK(std::all_of(counters.begin(), counters.end(), [](unsigned c) { return c == 0u; }));
                }
            }
        }
    }
}

TEST_CASE("cuda sampling: argmax_top_probability gives the argmax and 1 / sum(exp(l - max))") {
    std::mt19937 rng(26);
    for (const Shape& s : kShapes) {
        CAPTURE(s.n_vocab);
        for (bool specials : {false, true}) {
            CAPTURE(specials);
            std::vector<float> logits = make_logits(s.n_rows, s.n_vocab, rng, specials);
            std::vector<int> want_ids(s.n_rows);
            std::vector<double> want_top(s.n_rows);
            for (int r = 0; r < s.n_rows; ++r) {
                const float* row = &logits[static_cast<size_t>(r) * s.n_vocab];
                want_ids[r] = ref_argmax(row, s.n_vocab);
                double sum = 0.0;
                if (want_ids[r] >= 0)
                    for (int i = 0; i < s.n_vocab; ++i)
                        if (!std::isnan(row[i]))
                            sum += row[i] == row[want_ids[r]] ? 1.0 : std::exp(double(row[i]) - row[want_ids[r]]);
                want_top[r] = 1.0 / sum;
            }
            std::vector<uint64_t> ws = workspace_for(s.n_rows, s.n_vocab);
            std::vector<unsigned> counters(cuda::argmax_counters(s.n_rows), 0u);
            for (const LaunchOptions& o : kTwoOrders) {
                ScopedLaunchOptions scope(o);
                for (bool one_launch : {false, true}) {  // three kernels, or one whose last blocks combine the splits
                    CAPTURE(one_launch);
                    std::vector<int> ids(s.n_rows, -7);
                    std::vector<float> top(s.n_rows, -7.0f);
                    cuda::argmax_top_probability(logits.data(), s.n_rows, s.n_vocab, ids.data(), top.data(),
                                                 ws.data(), nullptr, one_launch ? counters.data() : nullptr);
                    CHECK(ids == want_ids);
                    for (int r = 0; r < s.n_rows; ++r) {
                        CAPTURE(r);
                        if (want_ids[r] < 0)
                            CHECK(std::isnan(top[r]));
                        else
                            CHECK(std::abs(top[r] - want_top[r]) <= 1e-6 * want_top[r]);
                    }
                    CHECK(std::all_of(counters.begin(), counters.end(), [](unsigned c) { return c == 0u; }));
                }
            }
        }
    }
    // A row of NaN and -inf only: no id, no probability; a row of one +inf among finite logits: 1.
    std::vector<float> rows(2 * 40, -kInf);
    rows[3] = kNaN;
    for (int i = 40; i < 80; ++i) rows[i] = 0.5f;
    rows[57] = kInf;
    std::vector<uint64_t> ws = workspace_for(2, 40);
    std::vector<unsigned> counters(cuda::argmax_counters(2), 0u);
    for (unsigned* c : {static_cast<unsigned*>(nullptr), counters.data()}) {
        std::vector<int> ids(2, -7);
        std::vector<float> top(2, -7.0f);
        cuda::argmax_top_probability(rows.data(), 2, 40, ids.data(), top.data(), ws.data(), nullptr, c);
        CHECK(ids == std::vector<int>{-1, 17});
        CHECK(std::isnan(top[0]));
        CHECK(top[1] == 1.0f);
    }
    // Launches, read from captured ones: three (argmax: two) without counters, one with them.
    const auto launches = [&](bool confidence, unsigned* c) {
        std::vector<int> ids(2);
        std::vector<float> top(2);
        void* stream = tandem::emu::stream_create();
        tandem::emu::begin_capture(stream);
        if (confidence)
            cuda::argmax_top_probability(rows.data(), 2, 40, ids.data(), top.data(), ws.data(), stream, c);
        else
            cuda::argmax(rows.data(), 2, 40, ids.data(), ws.data(), stream, c);
        const size_t n = tandem::emu::end_capture(stream).nodes.size();
        tandem::emu::stream_destroy(stream);
        return n;
    };
    CHECK(launches(true, nullptr) == 3u);
    CHECK(launches(true, counters.data()) == 1u);
    CHECK(launches(false, nullptr) == 2u);
    CHECK(launches(false, counters.data()) == 1u);
}

TEST_CASE("cuda sampling: argmax edge cases: ties, +inf, NaN and all -inf rows") {
    const int n = 300;
    std::vector<float> rows(6 * n, 1.0f);
    float* r0 = &rows[0 * n];  // all equal: id 0
    float* r1 = &rows[1 * n];  // the max appears twice: the lower id
    r1[250] = 5.0f, r1[77] = 5.0f;
    float* r2 = &rows[2 * n];  // +inf twice beats everything, lower id wins
    r2[290] = kInf, r2[123] = kInf, r2[5] = 1e30f;
    float* r3 = &rows[3 * n];  // all NaN: no token
    std::fill(r3, r3 + n, kNaN);
    float* r4 = &rows[4 * n];  // -inf and NaN only
    for (int i = 0; i < n; ++i) r4[i] = i % 2 ? -kInf : kNaN;
    float* r5 = &rows[5 * n];  // negative zero equals zero: the lower id
    std::fill(r5, r5 + n, -1.0f);
    r5[200] = 0.0f, r5[100] = -0.0f;
    (void)r0;
    std::vector<uint64_t> ws = workspace_for(6, n);
    for (const LaunchOptions& o : kOrders) {
        ScopedLaunchOptions scope(o);
        std::vector<int> got(6, -7);
        cuda::argmax(rows.data(), 6, n, got.data(), ws.data(), nullptr);
        CHECK(got == std::vector<int>{0, 77, 123, -1, -1, 100});
    }
}

TEST_CASE("cuda sampling: softmax matches the CPU sampler's softmax") {
    std::mt19937 rng(22);
    for (const Shape& s : kShapes) {
        CAPTURE(s.n_vocab);
        for (float temperature : {1.0f, 0.7f}) {
            CAPTURE(temperature);
            const bool specials = temperature != 1.0f;
            const std::vector<float> logits = make_logits(s.n_rows, s.n_vocab, rng, specials);
            std::vector<float> want(logits.size()), dist(logits.size());
            for (int r = 0; r < s.n_rows; ++r) {
                const size_t off = static_cast<size_t>(r) * s.n_vocab;
                const std::vector<float> p = ref_softmax(&logits[off], s.n_vocab, temperature);
                std::copy(p.begin(), p.end(), want.begin() + static_cast<std::ptrdiff_t>(off));
                // The full sampler with its cuts off: softmax, then a renormalisation that moves values by ~1 ulp.
                SamplerParams sp;
                sp.temperature = temperature, sp.top_k = 0, sp.top_p = 1.0f, sp.min_p = 0.0f;
                Sampler sampler(sp, s.n_vocab);
                sampler.distribution(&logits[off], {}, &dist[off]);
            }
            std::vector<uint64_t> ws = workspace_for(s.n_rows, s.n_vocab);
            for (const LaunchOptions& o : orders_for(s.n_vocab)) {
                ScopedLaunchOptions scope(o);
                INFO("thread order " << std::string(order_name(o)));
                std::vector<float> got(logits.size(), kNaN);
                cuda::softmax(logits.data(), s.n_rows, s.n_vocab, temperature, got.data(), ws.data(), nullptr);
                // Same terms, same double sum up to its order: at most one rounding apart, usually identical.
                int64_t worst = 0;
                size_t identical = 0;
                for (size_t i = 0; i < got.size(); ++i) {
                    REQUIRE(!std::isnan(got[i]));
                    worst = std::max(worst, ulps(got[i], want[i]));
                    identical += got[i] == want[i];
                    REQUIRE(std::abs(got[i] - dist[i]) <= 4e-7f * std::max(dist[i], 1e-30f) + 1e-45f);
                }
                CHECK(worst <= 1);
                CHECK(identical >= got.size() * 99 / 100);
            }
        }
    }
}

TEST_CASE("cuda sampling: softmax at temperature 0, with +inf, and of a row without a finite logit") {
    const int n = 100;
    std::vector<float> rows(3 * n);
    for (int i = 0; i < n; ++i) rows[i] = static_cast<float>(i % 7);  // max 6 first at id 6
    for (int i = 0; i < n; ++i) rows[n + i] = i == 40 || i == 60 ? kInf : static_cast<float>(i);
    for (int i = 0; i < n; ++i) rows[2 * n + i] = i % 3 ? -kInf : kNaN;
    std::vector<uint64_t> ws = workspace_for(3, n);
    for (const LaunchOptions& o : kOrders) {
        ScopedLaunchOptions scope(o);
        std::vector<float> greedy(3 * n, kNaN), soft(3 * n, kNaN);
        cuda::softmax(rows.data(), 3, n, 0.0f, greedy.data(), ws.data(), nullptr);
        cuda::softmax(rows.data(), 3, n, 1.0f, soft.data(), ws.data(), nullptr);
        for (int i = 0; i < n; ++i) {
            CHECK(greedy[i] == (i == 6 ? 1.0f : 0.0f));
            CHECK(greedy[n + i] == (i == 40 ? 1.0f : 0.0f));
            CHECK(std::isnan(greedy[2 * n + i]));
            // Two +inf logits share the mass, everything else is exp(-inf) = 0.
            CHECK(soft[n + i] == (i == 40 || i == 60 ? 0.5f : 0.0f));
            CHECK(std::isnan(soft[2 * n + i]));
        }
        const std::vector<float> want = ref_softmax(rows.data(), n, 1.0f);
        for (int i = 0; i < n; ++i) CHECK(ulps(soft[i], want[i]) <= 1);
    }
    std::vector<float> out(n);
    CHECK_THROWS_AS(cuda::softmax(rows.data(), 1, n, -1.0f, out.data(), ws.data(), nullptr), std::invalid_argument);
    CHECK_THROWS_AS(cuda::softmax(rows.data(), 1, n, kNaN, out.data(), ws.data(), nullptr), std::invalid_argument);
}

TEST_CASE("cuda sampling: top_k gives the sampler's candidates in its order") {
    std::mt19937 rng(23);
    for (const Shape& s : kShapes) {
        CAPTURE(s.n_vocab);
        std::vector<int> ks = {1, std::min(s.n_vocab, 5), std::min(s.n_vocab, 40)};
        if (s.n_vocab >= 64) ks.push_back(64);
        if (s.n_vocab >= cuda::kTopKMax) ks.push_back(cuda::kTopKMax);
        for (int k : ks) {
            CAPTURE(k);
            const std::vector<float> logits = make_logits(s.n_rows, s.n_vocab, rng, k != 1);
            std::vector<uint64_t> ws = workspace_for(s.n_rows, s.n_vocab);
            for (const LaunchOptions& o : orders_for(s.n_vocab)) {
                ScopedLaunchOptions scope(o);
                INFO("thread order " << std::string(order_name(o)));
                std::vector<float> vals(static_cast<size_t>(s.n_rows) * k, kNaN);
                std::vector<int> ids(vals.size(), -7);
                cuda::top_k(logits.data(), s.n_rows, s.n_vocab, k, vals.data(), ids.data(), ws.data(), nullptr);
                for (int r = 0; r < s.n_rows; ++r) {
                    const float* row = &logits[static_cast<size_t>(r) * s.n_vocab];
                    const std::vector<int> want = ref_top_k(row, s.n_vocab, k);
                    const std::vector<int> got(ids.begin() + r * k, ids.begin() + (r + 1) * k);
                    CHECK(got == want);
                    for (int j = 0; j < k; ++j) {
                        const float w = cleaned(row[want[j]]), g = vals[static_cast<size_t>(r) * k + j];
                        CHECK((g == w && std::signbit(g) == std::signbit(w == 0.0f ? 0.0f : w)));
                    }
                }
            }
        }
    }
}

TEST_CASE("cuda sampling: top_k with NaN, infinities and fewer finite logits than k") {
    const int n = 70, k = 64;
    std::vector<float> row(n, kNaN);
    row[3] = kInf, row[50] = 2.0f, row[9] = 2.0f, row[60] = -kInf, row[61] = -1.0f;
    // Ranking: +inf(3), 2(9), 2(50), -1(61), then every NaN / -inf as -inf by id.
    std::vector<int> want = {3, 9, 50, 61};
    for (int i = 0; i < n && static_cast<int>(want.size()) < k; ++i)
        if (std::find(want.begin(), want.end(), i) == want.end()) want.push_back(i);
    std::vector<uint64_t> ws = workspace_for(1, n);
    for (const LaunchOptions& o : kOrders) {
        ScopedLaunchOptions scope(o);
        std::vector<float> vals(k, kNaN);
        std::vector<int> ids(k, -7);
        cuda::top_k(row.data(), 1, n, k, vals.data(), ids.data(), ws.data(), nullptr);
        CHECK(ids == want);
        CHECK(vals[0] == kInf);
        CHECK(vals[1] == 2.0f);
        CHECK(vals[3] == -1.0f);
        for (int j = 4; j < k; ++j) CHECK(vals[j] == -kInf);
    }
    // Every logit equal: the radix select must walk down into the id bits, across splits.
    const int big = 9000;
    std::vector<float> flat(big, 0.5f);
    std::vector<uint64_t> ws_big = workspace_for(1, big);
    std::vector<int> first_ids(k);
    std::iota(first_ids.begin(), first_ids.end(), 0);
    for (const LaunchOptions& o : kTwoOrders) {
        ScopedLaunchOptions scope(o);
        std::vector<float> vals(k, kNaN);
        std::vector<int> ids(k, -7);
        cuda::top_k(flat.data(), 1, big, k, vals.data(), ids.data(), ws_big.data(), nullptr);
        CHECK(ids == first_ids);
        CHECK(vals == std::vector<float>(k, 0.5f));
    }

    std::vector<float> v(cuda::kTopKMax + 1);
    std::vector<int> ids(v.size());
    std::vector<float> wide(cuda::kTopKMax + 10, 1.0f);
    std::vector<uint64_t> ws_wide = workspace_for(1, static_cast<int>(wide.size()));
    CHECK_THROWS_AS(cuda::top_k(wide.data(), 1, static_cast<int>(wide.size()), cuda::kTopKMax + 1, v.data(), ids.data(),
                                ws_wide.data(), nullptr),
                    std::invalid_argument);
    CHECK_THROWS_AS(cuda::top_k(row.data(), 1, 10, 11, v.data(), ids.data(), ws.data(), nullptr), std::invalid_argument);
    CHECK_THROWS_AS(cuda::top_k(row.data(), 1, n, 0, v.data(), ids.data(), ws.data(), nullptr), std::invalid_argument);
}

TEST_CASE("cuda sampling: gather_columns reads the same ids from every row") {
    const int n_rows = 3, n_vocab = 700;
    std::mt19937 rng(25);
    std::uniform_real_distribution<float> unit(-5.0f, 5.0f);
    std::vector<float> rows(static_cast<size_t>(n_rows) * n_vocab);
    for (float& x : rows) x = unit(rng);
    rows[5] = kNaN;
    // More ids than a block's threads (two blocks per row), repeats, an id of NaN, and two out of range.
    std::vector<int> ids;
    for (int j = 0; j < 300; ++j) ids.push_back((j * 37) % n_vocab);
    ids.push_back(5), ids.push_back(-1), ids.push_back(n_vocab), ids.push_back(0);
    const int n_ids = static_cast<int>(ids.size());
    for (const LaunchOptions& o : kTwoOrders) {
        ScopedLaunchOptions scope(o);
        std::vector<float> out(static_cast<size_t>(n_rows) * n_ids, -7.0f);
        cuda::gather_columns(rows.data(), n_rows, n_vocab, ids.data(), n_ids, out.data(), nullptr);
        for (int r = 0; r < n_rows; ++r)
            for (int j = 0; j < n_ids; ++j) {
                const float got = out[static_cast<size_t>(r) * n_ids + j];
                const int id = ids[static_cast<size_t>(j)];
                if (id < 0 || id >= n_vocab || (r == 0 && id == 5))
                    REQUIRE(std::isnan(got));
                else
                    REQUIRE(got == rows[static_cast<size_t>(r) * n_vocab + id]);
            }
        std::vector<float> untouched(4, -7.0f);
        cuda::gather_columns(rows.data(), n_rows, n_vocab, ids.data(), 0, untouched.data(), nullptr);
        CHECK(untouched == std::vector<float>(4, -7.0f));
    }
    std::vector<float> out(4);
    CHECK_THROWS_AS(cuda::gather_columns(rows.data(), n_rows, n_vocab, ids.data(), -1, out.data(), nullptr),
                    std::invalid_argument);
}

TEST_CASE("cuda sampling: gathers for speculative verification") {
    const int n_rows = 3, n_vocab = 1000;
    std::mt19937 rng(24);
    std::uniform_real_distribution<float> unit(0.0f, 1e-3f);
    std::vector<float> p(n_rows * n_vocab), q(p.size());
    for (float& x : p) x = unit(rng);
    for (float& x : q) x = unit(rng);
    const std::vector<int> ids = {17, 999, 1000};  // the last is out of range
    for (const LaunchOptions& o : kTwoOrders) {
        ScopedLaunchOptions scope(o);
        std::vector<float> px(n_rows, -7.0f), res(p.size(), kNaN);
        cuda::gather_rows(p.data(), n_rows, n_vocab, ids.data(), px.data(), nullptr);
        CHECK(px[0] == p[17]);
        CHECK(px[1] == p[n_vocab + 999]);
        CHECK(std::isnan(px[2]));
        cuda::residual(p.data(), q.data(), res.data(), n_rows * n_vocab, nullptr);
        for (size_t i = 0; i < p.size(); ++i) REQUIRE(res[i] == std::max(0.0f, p[i] - q[i]));
    }
}
