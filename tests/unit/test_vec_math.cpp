// Tests of cpu/vec_math.h: exp against the C library in double precision, the SIMD and scalar paths giving the same
// bits (so a value's result does not depend on where it sits in an array), special values, and the fixed-order sum.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cpu/vec_math.h"

using namespace tandem::cpu;

TEST_CASE("vec_math: exp is within 2 ulp of the exact value over the whole finite range") {
    double worst = 0;
    for (float x = -87.0f; x <= 88.3f; x += 0.000731f) {
        const double exact = std::exp(static_cast<double>(x));
        const double ulp = std::ldexp(1.0, std::ilogb(exact) - 23);
        worst = std::max(worst, std::fabs(exp_scalar(x) - exact) / ulp);
    }
    MESSAGE("largest exp error: " << worst << " ulp");
    CHECK(worst <= 2.0);
    CHECK(exp_scalar(0.0f) == 1.0f);
    CHECK(exp_scalar(-100.0f) == 0.0f);
    CHECK(exp_scalar(100.0f) == INFINITY);
    CHECK(exp_scalar(-INFINITY) == 0.0f);
    CHECK(std::isnan(exp_scalar(NAN)));
}

TEST_CASE("vec_math: every element gets the same bits in the SIMD body and in the scalar tail") {
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> dist(-95.0f, 95.0f);
    std::vector<float> values(203);
    for (float& v : values) v = dist(rng);
    values[7] = NAN;
    values[9] = -INFINITY;
    values[11] = INFINITY;
    // swiglu over the whole array (body + a 3-element tail) against one element at a time (all tail).
    std::vector<float> up(values.size());
    for (float& u : up) u = dist(rng) / 10;
    std::vector<float> whole = values;
    swiglu(whole.data(), up.data(), static_cast<int64_t>(whole.size()));
    int mismatches = 0;
    for (size_t i = 0; i < values.size(); ++i) {
        float one = values[i];
        swiglu(&one, &up[i], 1);
        mismatches += std::memcmp(&one, &whole[i], sizeof one) != 0;
    }
    CHECK(mismatches == 0);
    // exp_shifted_sum: elementwise results equal exp_scalar, whatever the position.
    std::vector<float> e = values;
    exp_shifted_sum(e.data(), static_cast<int>(e.size()), 1.5f);
    mismatches = 0;
    for (size_t i = 0; i < values.size(); ++i) {
        const float expect = exp_scalar(values[i] - 1.5f);
        mismatches += std::memcmp(&expect, &e[i], sizeof expect) != 0;
    }
    CHECK(mismatches == 0);
}

TEST_CASE("vec_math: softmax sums are accurate and repeatable") {
    std::vector<float> v(1001);
    for (size_t i = 0; i < v.size(); ++i) v[i] = -static_cast<float>(i) * 0.01f;
    std::vector<float> a = v, b = v;
    const float sa = exp_shifted_sum(a.data(), static_cast<int>(a.size()), 0.0f);
    const float sb = exp_shifted_sum(b.data(), static_cast<int>(b.size()), 0.0f);
    CHECK(std::memcmp(&sa, &sb, sizeof sa) == 0);
    double exact = 0;
    for (float x : v) exact += std::exp(static_cast<double>(x));
    CHECK(std::fabs(sa - exact) / exact < 1e-5);
    // silu at a few points
    float g[3] = {0.0f, 1.0f, -2.0f};
    const float u[3] = {1.0f, 1.0f, 2.0f};
    swiglu(g, u, 3);
    CHECK(g[0] == 0.0f);
    CHECK(g[1] == doctest::Approx(1.0 / (1.0 + std::exp(-1.0))).epsilon(1e-6));
    CHECK(g[2] == doctest::Approx(2.0 * -2.0 / (1.0 + std::exp(2.0))).epsilon(1e-6));
}

TEST_CASE("vec_math: soft_cap is cap * tanh(x / cap) to a few ulp of the cap, the same bits anywhere, -inf kept") {
    std::mt19937 rng(9);
    std::uniform_real_distribution<float> dist(-400.0f, 400.0f);
    std::vector<float> values(203);
    for (float& v : values) v = dist(rng);
    values[3] = 0.0f;
    values[5] = -INFINITY;
    values[8] = 1e-3f;
    for (const float cap : {2.0f, 30.0f, 50.0f}) {
        CAPTURE(cap);
        std::vector<float> whole = values;
        soft_cap(whole.data(), static_cast<int64_t>(whole.size()), cap);
        double worst = 0;
        int mismatches = 0;
        for (size_t i = 0; i < values.size(); ++i) {
            float one = values[i];
            soft_cap(&one, 1, cap);  // the scalar tail
            mismatches += std::memcmp(&one, &whole[i], sizeof one) != 0;
            if (values[i] == -INFINITY) continue;
            const double exact = cap * std::tanh(static_cast<double>(values[i]) / cap);
            worst = std::max(worst, std::fabs(whole[i] - exact) / cap);
        }
        CHECK(mismatches == 0);
        MESSAGE("largest soft_cap error: " << worst << " of the cap");
        CHECK(worst < 4e-7);
        CHECK(whole[5] == -INFINITY);
        CHECK(whole[3] == 0.0f);
    }
}
