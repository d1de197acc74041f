// Unit tests for src/sample/noise.*: Philox4x32-10 against Random123's known-answer vectors, the uniform's range and
// moments, that every part of the key (seed, position, use, id) changes the numbers, and Gumbel-max as an exact
// sampler (frequencies over positions and over seeds, zero weights never picked).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "error.h"
#include "sample/noise.h"
#include "sample/sampler.h"

using namespace tandem;

namespace {

// Pearson's chi-square of `counts` against probabilities `p` (n draws), and the 1e-6 upper-tail critical value for
// its degrees of freedom (Wilson-Hilferty, z = 4.753): a correct sampler fails with probability ~1e-6, and the seeds
// are fixed, so the test is deterministic.
std::pair<double, double> chi_square(const std::vector<int>& counts, const std::vector<double>& p, int n) {
    double stat = 0;
    int bins = 0;
    for (size_t i = 0; i < p.size(); ++i) {
        if (p[i] <= 0) continue;
        const double e = p[i] * n;
        stat += (counts[i] - e) * (counts[i] - e) / e;
        ++bins;
    }
    const double df = bins - 1, z = 4.753, h = 2.0 / (9.0 * df);
    return {stat, df * std::pow(1.0 - h + z * std::sqrt(h), 3.0)};
}

SparseDistribution weights(const std::vector<float>& w) {
    SparseDistribution d;
    for (size_t i = 0; i < w.size(); ++i) {
        d.ids.push_back(static_cast<int>(i));
        d.probs.push_back(w[i]);
    }
    return d;
}

}  // namespace

TEST_CASE("noise: Philox4x32-10 gives Random123's known answers") {
    // Random123 1.14, tests/kat_vectors, "philox4x32 10" lines (Salmon et al. 2011's reference implementation).
    using W = std::array<uint32_t, 4>;
    CHECK(philox4x32_10({0, 0, 0, 0}, {0, 0}) == W{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
    CHECK(philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}) ==
          W{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
    CHECK(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}) ==
          W{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
}

TEST_CASE("noise: uniforms lie in (0, 1) with the moments of a uniform, and every key part moves them") {
    const PositionNoise noise(42);
    const int n = 200000;
    double sum = 0, sum_sq = 0, g_sum = 0;
    for (int i = 0; i < n; ++i) {
        const double u = noise.uniform(i, NoiseUse::Token, 7);
        REQUIRE((u > 0.0 && u < 1.0));
        sum += u;
        sum_sq += u * u;
        const double g = noise.gumbel(i, NoiseUse::Token, 7);
        REQUIRE(std::isfinite(g));
        g_sum += g;
    }
    // Mean 1/2 (sd of the mean 0.29 / sqrt(n) = 6.5e-4), variance 1/12; Gumbel mean: the Euler-Mascheroni constant
    // (sd pi / sqrt(6 n) = 2.9e-3). Bands of about 6 standard deviations.
    CHECK(std::abs(sum / n - 0.5) < 4e-3);
    CHECK(std::abs(sum_sq / n - (sum / n) * (sum / n) - 1.0 / 12.0) < 2e-3);
    CHECK(std::abs(g_sum / n - 0.5772156649) < 0.018);

    // A pure function: the same key twice is the same number, and each of the four parts of the key changes it.
    const double base = noise.uniform(5, NoiseUse::Token, 9);
    CHECK(noise.uniform(5, NoiseUse::Token, 9) == base);
    CHECK(PositionNoise(42).uniform(5, NoiseUse::Token, 9) == base);
    CHECK(PositionNoise(43).uniform(5, NoiseUse::Token, 9) != base);
    CHECK(PositionNoise(42ull | 1ull << 40).uniform(5, NoiseUse::Token, 9) != base);  // the seed's high half counts
    CHECK(noise.uniform(6, NoiseUse::Token, 9) != base);
    CHECK(noise.uniform(5 + (int64_t{1} << 32), NoiseUse::Token, 9) != base);  // so does the position's
    CHECK(noise.uniform(5, NoiseUse::Proposal, 9) != base);
    CHECK(noise.uniform(5, NoiseUse::Acceptance, 9) != base);
    CHECK(noise.uniform(5, NoiseUse::Residual, 9) != base);
    CHECK(noise.uniform(5, NoiseUse::Token, 10) != base);
}

TEST_CASE("noise: Gumbel-max samples its weights exactly, over positions and over seeds") {
    // Unnormalised weights with zeros between them: the zeros are never picked.
    const std::vector<float> w = {0.0f, 3.0f, 0.0f, 1.0f, 0.5f, 0.0f, 2.5f, 0.0f};
    const SparseDistribution d = weights(w);
    std::vector<double> p(w.size());
    for (size_t i = 0; i < w.size(); ++i) p[i] = w[i] / 7.0;
    const int n = 40000;
    std::vector<int> by_position(w.size(), 0), by_seed(w.size(), 0);
    const PositionNoise noise(7);
    for (int i = 0; i < n; ++i) {
        ++by_position[static_cast<size_t>(gumbel_max(d, noise, i, NoiseUse::Token))];
        ++by_seed[static_cast<size_t>(gumbel_max(d, PositionNoise(static_cast<uint64_t>(i)), 3, NoiseUse::Token))];
    }
    for (size_t i : {0, 2, 5, 7}) {
        CHECK(by_position[i] == 0);
        CHECK(by_seed[i] == 0);
    }
    const auto [s1, c1] = chi_square(by_position, p, n);
    const auto [s2, c2] = chi_square(by_seed, p, n);
    INFO("over positions: " << s1 << " (critical " << c1 << "), over seeds: " << s2 << " (" << c2 << ")");
    CHECK(s1 < c1);
    CHECK(s2 < c2);

    // The negative control: the same test rejects a sampler that is not exact (the weights' square roots, a flatter
    // distribution, as a mis-scaled noise would give).
    std::vector<float> flatter(w.size());
    for (size_t i = 0; i < w.size(); ++i) flatter[i] = std::sqrt(w[i]);
    std::vector<int> wrong(w.size(), 0);
    for (int i = 0; i < n; ++i) ++wrong[static_cast<size_t>(gumbel_max(weights(flatter), noise, i, NoiseUse::Token))];
    CHECK(chi_square(wrong, p, n).first > chi_square(wrong, p, n).second);

    // Two uses at one position are independent draws: they disagree about as often as two independent samples do
    // (1 - sum p^2 = 0.694 here; sd of the rate 0.0023).
    int differ = 0;
    for (int i = 0; i < n; ++i)
        differ += gumbel_max(d, noise, i, NoiseUse::Token) != gumbel_max(d, noise, i, NoiseUse::Proposal);
    double same = 0;
    for (double x : p) same += x * x;
    CHECK(std::abs(static_cast<double>(differ) / n - (1.0 - same)) < 0.015);

    CHECK_THROWS_AS(gumbel_max(weights({0.0f, 0.0f}), noise, 0, NoiseUse::Token), Error);
    CHECK_THROWS_AS(gumbel_max(SparseDistribution{}, noise, 0, NoiseUse::Token), Error);
}

TEST_CASE("noise: gumbel_max's pick share is the pick's softmax share of the perturbed scores") {
    const std::vector<float> w = {0.05f, 0.4f, 0.0f, 0.3f, 0.25f};
    const SparseDistribution d = weights(w);
    const PositionNoise noise(99);
    double low = 1, high = 0;
    for (int pos = 0; pos < 200; ++pos) {
        double share = -1;
        const int pick = gumbel_max(d, noise, pos, NoiseUse::Token, &share);
        REQUIRE(pick == gumbel_max(d, noise, pos, NoiseUse::Token));  // asking for the share changes nothing
        double sum = 0, best = 0;
        for (size_t i = 0; i < w.size(); ++i) {
            if (w[i] <= 0) continue;
            const double e = w[i] * std::exp(noise.gumbel(pos, NoiseUse::Token, static_cast<uint32_t>(i)));
            sum += e;
            if (static_cast<int>(i) == pick) best = e;
        }
        REQUIRE(share == doctest::Approx(best / sum).epsilon(1e-12));
        low = std::min(low, share), high = std::max(high, share);
    }
    // The noise makes it vary: sometimes a close call, sometimes a clear winner.
    CHECK(low < 0.5);
    CHECK(high > 0.9);
    double one = 0;
    SparseDistribution single;
    single.assign_one(3);
    CHECK(gumbel_max(single, noise, 0, NoiseUse::Token, &one) == 3);
    CHECK(one == 1.0);
}
