// Unit tests for src/sample/sampler.*: each transform on crafted distributions, the whole chain against a naive
// full-sort reference, sample() == gumbel_max(distribution()), seeds and positions, frequencies, validation. The
// noise itself (Philox, Gumbel-max) is test_noise.cpp's.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <vector>

#include "error.h"
#include "sample/sampler.h"

using tandem::NoiseUse;
using tandem::PositionNoise;
using tandem::Sampler;
using tandem::SamplerParams;

namespace {

// Only the transforms a test names; everything else off.
SamplerParams plain(float temperature = 1.0f) {
    SamplerParams p;
    p.temperature = temperature;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 64;
    p.seed = 1234;
    return p;
}

std::vector<float> logits_of(const std::vector<double>& probs) {
    std::vector<float> l;
    for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
    return l;
}

std::vector<float> dist(Sampler& s, const std::vector<float>& logits, std::span<const int> history = {}) {
    std::vector<float> out(logits.size(), -1.0f);
    s.distribution(logits.data(), history, out.data());
    return out;
}

int count_nonzero(const std::vector<float>& v) {
    return static_cast<int>(std::count_if(v.begin(), v.end(), [](float x) { return x != 0.0f; }));
}

double sum(const std::vector<float>& v) { return std::accumulate(v.begin(), v.end(), 0.0); }

std::vector<float> random_logits(int n, uint64_t seed, float scale = 4.0f) {
    const PositionNoise noise(seed);
    std::vector<float> l(n);
    for (int i = 0; i < n; ++i)
        l[static_cast<size_t>(i)] = static_cast<float>(noise.uniform(i, NoiseUse::Token) * 2.0 - 1.0) * scale;
    return l;
}

// A deliberately naive re-statement of the chain (full sort, double arithmetic throughout) to check the optimised
// one against: partial sorts, incremental top-p and the unsorted min-p path must keep the same set.
std::vector<double> reference(const SamplerParams& p, std::vector<float> l, std::span<const int> history) {
    const int n = static_cast<int>(l.size());
    if (p.repeat_penalty != 1.0f && p.repeat_last_n > 0) {
        const size_t w = std::min(history.size(), static_cast<size_t>(p.repeat_last_n));
        std::vector<int> recent(history.end() - static_cast<long>(w), history.end());
        std::sort(recent.begin(), recent.end());
        recent.erase(std::unique(recent.begin(), recent.end()), recent.end());
        for (int t : recent) l[t] = l[t] > 0 ? l[t] / p.repeat_penalty : l[t] * p.repeat_penalty;
    }
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    std::vector<double> out(n, 0.0);
    if (p.temperature == 0.0f) {
        out[order[0]] = 1.0;
        return out;
    }
    int kept = (p.top_k > 0 && p.top_k < n) ? p.top_k : n;
    std::vector<double> q(kept);
    double z = 0;
    for (int j = 0; j < kept; ++j) z += q[j] = std::exp((double(l[order[j]]) - l[order[0]]) / p.temperature);
    for (double& x : q) x /= z;
    if (p.top_p < 1.0f) {
        double cum = 0;
        int j = 0;
        while (j < kept) {
            cum += q[j++];
            if (cum >= p.top_p - 1e-6) break;
        }
        kept = j;
    }
    if (p.min_p > 0.0f) {
        int j = 1;
        while (j < kept && q[j] >= p.min_p * q[0] * (1 - 1e-6)) ++j;
        kept = j;
    }
    z = 0;
    for (int j = 0; j < kept; ++j) z += q[j];
    for (int j = 0; j < kept; ++j) out[order[j]] = q[j] / z;
    return out;
}

}  // namespace

TEST_CASE("sampler seed reproducibility") {
    const auto logits = random_logits(500, 99, 2.0f);
    SamplerParams p;  // the defaults: top-k, top-p and min-p all active
    p.seed = 2024;
    auto run = [&](uint64_t seed) {
        SamplerParams q = p;
        q.seed = seed;
        Sampler s(q, 500);
        std::vector<int> out;
        for (int i = 0; i < 1000; ++i) out.push_back(s.sample(logits.data(), out, i));
        return out;
    };
    const auto first = run(2024);
    CHECK(first == run(2024));
    CHECK(first != run(2025));
    CHECK(run(0) == run(0));
    CHECK(run(0) != run(1));
    // More than one token was actually drawn, so the comparisons above are not trivially equal.
    CHECK(std::set<int>(first.begin(), first.end()).size() > 5);
    // The pick is a function of the position, not of how many picks came before: a fresh sampler asked for position
    // 500 alone gives what the run's 501st pick was, and the same position twice gives the same token.
    SamplerParams q = p;
    q.seed = 2024;
    Sampler fresh(q, 500);
    const std::vector<int> before(first.begin(), first.begin() + 500);
    CHECK(fresh.sample(logits.data(), before, 500) == first[500]);
    CHECK(fresh.sample(logits.data(), before, 500) == first[500]);
}

TEST_CASE("sampler top-k keeps exactly k") {
    const auto logits = random_logits(1000, 5);
    for (int k : {1, 2, 10, 40, 300, 999}) {
        SamplerParams p = plain();
        p.top_k = k;
        Sampler s(p, 1000);
        const auto d = dist(s, logits);
        CHECK(count_nonzero(d) == k);
        CHECK(sum(d) == doctest::Approx(1.0).epsilon(1e-6));
        // The kept ones are the k largest logits.
        std::vector<float> sorted = logits;
        std::sort(sorted.begin(), sorted.end(), std::greater<>());
        for (int i = 0; i < 1000; ++i) CHECK((d[i] != 0.0f) == (logits[i] >= sorted[k - 1]));
    }
    SUBCASE("ties at the cut go to the lowest ids") {
        SamplerParams p = plain();
        p.top_k = 3;
        Sampler s(p, 6);
        const std::vector<float> flat = {0.5f, 1.0f, 1.0f, 1.0f, 1.0f, 0.0f};
        const auto d = dist(s, flat);
        CHECK(d == std::vector<float>{0.0f, 1.0f / 3, 1.0f / 3, 1.0f / 3, 0.0f, 0.0f});
    }
    SUBCASE("all tied: the lowest ids, on both the partial_sort and the nth_element paths") {
        const std::vector<float> tied(1000, 0.25f);
        for (int k : {10, 300}) {
            SamplerParams p = plain();
            p.top_k = k;
            Sampler s(p, 1000);
            const auto d = dist(s, tied);
            for (int i = 0; i < 1000; ++i) CHECK((d[i] != 0.0f) == (i < k));
        }
    }
    SUBCASE("k >= n_vocab is the same as off") {
        SamplerParams p = plain();
        p.top_k = 5000;
        Sampler s(p, 1000);
        CHECK(count_nonzero(dist(s, logits)) == 1000);
    }
}

TEST_CASE("sampler top-p keeps the smallest set reaching p") {
    const auto logits = logits_of({0.5, 0.3, 0.15, 0.05});
    for (int top_k : {0, 4}) {  // unsorted (incremental sort) and sorted-by-top-k paths
        CAPTURE(top_k);
        SamplerParams p = plain();
        p.top_k = top_k;
        p.top_p = 0.8f;
        Sampler s8(p, 4);
        auto d = dist(s8, logits);
        CHECK(count_nonzero(d) == 2);
        CHECK(d[0] == doctest::Approx(0.5 / 0.8));
        CHECK(d[1] == doctest::Approx(0.3 / 0.8));
        p.top_p = 0.81f;
        Sampler s81(p, 4);
        d = dist(s81, logits);
        CHECK(count_nonzero(d) == 3);
        CHECK(d[2] == doctest::Approx(0.15 / 0.95));
        p.top_p = 0.01f;  // always at least one token
        Sampler s01(p, 4);
        CHECK(dist(s01, logits) == std::vector<float>{1.0f, 0.0f, 0.0f, 0.0f});
    }
    SUBCASE("shuffled ids") {
        SamplerParams p = plain();
        p.top_p = 0.8f;
        Sampler s(p, 4);
        const auto d = dist(s, logits_of({0.15, 0.05, 0.3, 0.5}));
        CHECK(d[0] == 0.0f);
        CHECK(d[1] == 0.0f);
        CHECK(d[2] == doctest::Approx(0.3 / 0.8));
        CHECK(d[3] == doctest::Approx(0.5 / 0.8));
    }
}

TEST_CASE("sampler min-p keeps tokens with p >= min_p * p_max") {
    // p_max = 0.5, min_p = 0.2: the threshold is 0.1, met exactly by id 3.
    const auto logits = logits_of({0.09, 0.25, 0.5, 0.1, 0.06});
    for (int top_k : {0, 5}) {  // id-order compaction and by-logit prefix paths
        CAPTURE(top_k);
        SamplerParams p = plain();
        p.top_k = top_k;
        p.min_p = 0.2f;
        Sampler s(p, 5);
        const auto d = dist(s, logits);
        CHECK(count_nonzero(d) == 3);
        CHECK(d[0] == 0.0f);
        CHECK(d[4] == 0.0f);
        CHECK(d[2] == doctest::Approx(0.5 / 0.85));
        CHECK(d[1] == doctest::Approx(0.25 / 0.85));
        CHECK(d[3] == doctest::Approx(0.1 / 0.85));
    }
    SUBCASE("min_p = 1 keeps only the top") {
        SamplerParams p = plain();
        p.min_p = 1.0f;
        Sampler s(p, 5);
        CHECK(count_nonzero(dist(s, logits)) == 1);
    }
}

TEST_CASE("sampler repetition penalty") {
    // ids:                       0     1     2     3     4     5
    const std::vector<float> l = {2.0f, -2.0f, 2.0f, -2.0f, 1.0f, 0.0f};
    SamplerParams p = plain();
    p.repeat_penalty = 2.0f;
    p.repeat_last_n = 3;
    Sampler s(p, 6);
    // Only the last 3 tokens (0, 1, 0) count; 4 and 3 are older. 0 appears twice but is penalised once.
    const std::vector<int> history = {4, 3, 0, 1, 0};
    const auto d = dist(s, l, history);
    const std::vector<double> expected_logits = {1.0, -4.0, 2.0, -2.0, 1.0, 0.0};
    double z = 0;
    for (double x : expected_logits) z += std::exp(x);
    for (int i = 0; i < 6; ++i) CHECK(d[i] == doctest::Approx(std::exp(expected_logits[i]) / z));

    SUBCASE("repeat_last_n = 0 and penalty 1 are off") {
        SamplerParams off = p;
        off.repeat_last_n = 0;
        Sampler s0(off, 6);
        SamplerParams one = p;
        one.repeat_penalty = 1.0f;
        Sampler s1(one, 6);
        Sampler none(plain(), 6);
        CHECK(dist(s0, l, history) == dist(none, l));
        CHECK(dist(s1, l, history) == dist(none, l));
    }
    SUBCASE("penalty changes the greedy choice") {
        SamplerParams g = p;
        g.temperature = 0.0f;
        Sampler sg(g, 6);
        const std::vector<float> close = {3.0f, 2.9f, 0, 0, 0, 0};
        const std::vector<int> h = {0};
        CHECK(sg.sample(close.data(), {}, 0) == 0);
        CHECK(sg.sample(close.data(), h, 1) == 1);
    }
    SUBCASE("out-of-vocabulary history is an error, and leaves the sampler usable") {
        const std::vector<int> bad = {0, 6};
        CHECK_THROWS_AS(dist(s, l, bad), tandem::Error);
        CHECK(dist(s, l, history) == d);
    }
}

TEST_CASE("sampler greedy") {
    SamplerParams p = plain(0.0f);
    Sampler s(p, 5);
    const std::vector<float> l = {1.0f, 5.0f, -1.0f, 5.0f, 2.0f};
    CHECK(s.sample(l.data(), {}, 0) == 1);  // tie between 1 and 3: lowest id
    CHECK(dist(s, l) == std::vector<float>{0, 1, 0, 0, 0});
    // NaN never wins; all -inf/NaN is an error rather than a silent token 0.
    const std::vector<float> with_nan = {NAN, 0.0f, 1.0f, NAN, -3.0f};
    CHECK(s.sample(with_nan.data(), {}, 0) == 2);
    const std::vector<float> dead = {NAN, -INFINITY, NAN, -INFINITY, NAN};
    CHECK_THROWS_AS(s.sample(dead.data(), {}, 0), tandem::Error);
    Sampler t(plain(), 5);
    CHECK_THROWS_AS(t.sample(dead.data(), {}, 0), tandem::Error);
}

TEST_CASE("sampler temperature near 0 selects the argmax") {
    const std::vector<float> l = {1.0f, 1.5f, 1.4f, -2.0f, 1.49f};
    Sampler s(plain(1e-4f), 5);
    for (int i = 0; i < 1000; ++i) REQUIRE(s.sample(l.data(), {}, i) == 1);
}

TEST_CASE("sampler temperature 1 matches the distribution empirically") {
    const std::vector<double> probs = {0.1, 0.2, 0.3, 0.4};
    const auto l = logits_of(probs);
    Sampler s(plain(1.0f), 4);
    const int n = 20000;
    std::vector<int> counts(4, 0);
    for (int i = 0; i < n; ++i) ++counts[s.sample(l.data(), {}, i)];  // a fresh position, fresh noise
    // Each count is Binomial(n, p): std = sqrt(n p (1-p)), 35-69 here. A 5-sigma band fails a correct sampler with
    // probability ~5.7e-7 per token (two-sided normal tail), < 2.3e-6 for all four: for a fixed seed the test is
    // deterministic, so that is the chance of having picked an unlucky seed.
    for (int i = 0; i < 4; ++i) {
        const double mean = n * probs[i];
        const double sd = std::sqrt(n * probs[i] * (1 - probs[i]));
        CAPTURE(i);
        CAPTURE(counts[i]);
        CHECK(std::abs(counts[i] - mean) <= 5 * sd);
    }
}

TEST_CASE("sampler distribution sums to 1 and matches a naive reference") {
    const int n = 3000;
    const auto logits = random_logits(n, 11, 6.0f);
    std::vector<int> history;
    for (int i = 0; i < 200; ++i) history.push_back((i * 37) % n);
    int configs = 0;
    for (float t : {0.0f, 0.3f, 1.0f, 2.5f})
        for (int k : {0, 1, 40, 1000})
            for (float tp : {1.0f, 0.95f, 0.5f})
                for (float mp : {0.0f, 0.05f, 0.3f})
                    for (float rp : {1.0f, 1.3f}) {
                        SamplerParams p = plain(t);
                        p.top_k = k;
                        p.top_p = tp;
                        p.min_p = mp;
                        p.repeat_penalty = rp;
                        CAPTURE(t);
                        CAPTURE(k);
                        CAPTURE(tp);
                        CAPTURE(mp);
                        CAPTURE(rp);
                        Sampler s(p, n);
                        const auto d = dist(s, logits, history);
                        const auto ref = reference(p, logits, history);
                        REQUIRE(sum(d) == doctest::Approx(1.0).epsilon(1e-5));
                        int mismatches = 0, first = -1;  // counted, not REQUIREd per token, to keep output short
                        for (int i = 0; i < n; ++i) {
                            const bool same_set = (d[i] == 0.0f) == (ref[i] == 0.0);
                            if (!same_set || std::abs(d[i] - ref[i]) > 1e-4 * ref[i] + 1e-9) {
                                if (first < 0) first = i;
                                ++mismatches;
                            }
                        }
                        CAPTURE(first);
                        REQUIRE(mismatches == 0);
                        ++configs;
                    }
    CHECK(configs == 288);
}

TEST_CASE("sampler top-p without top-k matches the reference at a 150k vocabulary") {
    // The quickselect path: flat and peaked rows, and rows with heavy ties (logits on a 0.5 grid), where only the id
    // tie-break decides which of the equal tokens at the cut survive.
    const int n = 151936;
    auto smooth = random_logits(n, 21, 3.0f);
    auto tied = random_logits(n, 22, 4.0f);
    for (float& x : tied) x = std::round(x * 2.0f) / 2.0f;
    auto peaked = random_logits(n, 23, 2.0f);
    for (int i = 0; i < 10; ++i) peaked[i * 9973] += 15.0f - i;
    for (const auto* l : {&smooth, &tied, &peaked})
        for (float tp : {0.3f, 0.9f, 0.999f}) {
            SamplerParams p = plain(1.0f);
            p.top_p = tp;
            CAPTURE(tp);
            Sampler s(p, n);
            const auto d = dist(s, *l);
            const auto ref = reference(p, *l, {});
            int mismatches = 0;
            for (int i = 0; i < n; ++i) mismatches += (d[i] == 0.0f) != (ref[i] == 0.0);
            CHECK(mismatches == 0);
            CHECK(sum(d) == doctest::Approx(1.0).epsilon(1e-5));
        }
}

TEST_CASE("sampler sample() equals gumbel_max(distribution()) at every position") {
    // Speculative decoding samples from distribution() rows; sampling must agree with it token for token.
    const int n = 10000;
    const auto logits = random_logits(n, 3, 3.0f);
    // Flat-ish logits with top-p only keep > 4096 tokens, exercising write_kept's dense path.
    const auto flat = random_logits(n, 4, 0.1f);
    for (const auto* l : {&logits, &flat})
        for (int k : {0, 40, 6000})
            for (float tp : {1.0f, 0.9f}) {
                SamplerParams p = plain(0.9f);
                p.top_k = k;
                p.top_p = tp;
                p.min_p = l == &flat ? 0.0f : 0.02f;
                p.seed = 77;
                Sampler a(p, n);
                Sampler b(p, n);
                tandem::SparseDistribution d;
                std::set<int> picks;
                for (int i = 0; i < 30; ++i) {
                    b.distribution(l->data(), {}, d);
                    const int x = a.sample(l->data(), {}, i);
                    REQUIRE(x == gumbel_max(d, b.noise(), i, NoiseUse::Token));
                    picks.insert(x);
                }
                CHECK(picks.size() > 1);  // the positions' noise differs, so the equality is not one token's
            }
}

TEST_CASE("sampler validate rejects bad values") {
    auto bad = [](auto mutate) {
        SamplerParams p;
        mutate(p);
        return p;
    };
    CHECK_NOTHROW(Sampler::validate(SamplerParams{}));
    CHECK_NOTHROW(Sampler::validate(plain(0.0f)));
    CHECK_NOTHROW(Sampler::validate(bad([](SamplerParams& p) { p.min_p = 1.0f; p.top_p = 1.0f; })));
    const std::vector<SamplerParams> rejected = {
        bad([](SamplerParams& p) { p.temperature = -0.1f; }),
        bad([](SamplerParams& p) { p.temperature = NAN; }),
        bad([](SamplerParams& p) { p.temperature = INFINITY; }),
        bad([](SamplerParams& p) { p.top_k = -1; }),
        bad([](SamplerParams& p) { p.top_p = 0.0f; }),
        bad([](SamplerParams& p) { p.top_p = 1.01f; }),
        bad([](SamplerParams& p) { p.top_p = NAN; }),
        bad([](SamplerParams& p) { p.min_p = -0.01f; }),
        bad([](SamplerParams& p) { p.min_p = 1.5f; }),
        bad([](SamplerParams& p) { p.repeat_penalty = 0.0f; }),
        bad([](SamplerParams& p) { p.repeat_penalty = -1.0f; }),
        bad([](SamplerParams& p) { p.repeat_last_n = -1; }),
    };
    for (const auto& p : rejected) {
        CHECK_THROWS_AS(Sampler::validate(p), tandem::Error);
        CHECK_THROWS_AS(Sampler(p, 10), tandem::Error);
    }
    CHECK_THROWS_WITH_AS(Sampler::validate(bad([](SamplerParams& p) { p.top_p = 2.0f; })),
                         "sampler: top_p must be in (0, 1] (1 = off), got 2", tandem::Error);
    CHECK_THROWS_AS(Sampler(SamplerParams{}, 0), tandem::Error);
}
