// Philox4x32-10 and the Gumbel-max sampler built on it (noise.h).
#include "sample/noise.h"

#include <cmath>

#include "error.h"
#include "sample/sampler.h"

namespace tandem {

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
    // The multipliers and Weyl increments of the Philox paper (Salmon et al. 2011, table 2 / section 5).
    constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
    constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
    for (int round = 0; round < 10; ++round) {
        const uint64_t p0 = static_cast<uint64_t>(kM0) * c[0];
        const uint64_t p1 = static_cast<uint64_t>(kM1) * c[2];
        const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
        const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
        c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
        k[0] += kW0;
        k[1] += kW1;
    }
    return c;
}

double PositionNoise::uniform(int64_t position, NoiseUse use, uint32_t id) const {
    // Counter: (id, position low, position high, use); key: the seed. Distinct (position, use, id) are distinct
    // counters, and Philox's outputs for distinct counters under one key are independent for every statistical
    // test its authors ran (BigCrush), which is what the Gumbel-max argument needs.
    const uint64_t pos = static_cast<uint64_t>(position);
    const std::array<uint32_t, 4> r =
        philox4x32_10({id, static_cast<uint32_t>(pos), static_cast<uint32_t>(pos >> 32), static_cast<uint32_t>(use)},
                      {static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32)});
    const uint64_t bits = (static_cast<uint64_t>(r[0]) << 32 | r[1]) >> 11;  // 53 bits
    return (static_cast<double>(bits) + 0.5) * 0x1.0p-53;                    // the midpoint of a 2^-53 cell: in (0, 1)
}

double PositionNoise::gumbel(int64_t position, NoiseUse use, uint32_t id) const {
    return -std::log(-std::log(uniform(position, use, id)));
}

void GumbelArgmax::offer(int id, float p) {
    if (!(p > 0.0f)) return;
    const double s = std::log(static_cast<double>(p)) + noise_.gumbel(position_, use_, static_cast<uint32_t>(id));
    if (best_ < 0 || s > best_score_ || (s == best_score_ && id < best_)) {
        if (track_share_) sum_ = best_ < 0 ? 1.0 : sum_ * std::exp(best_score_ - s) + 1.0;
        best_ = id, best_score_ = s;
    } else if (track_share_) {
        sum_ += std::exp(s - best_score_);
    }
}

int GumbelArgmax::pick() const {
    if (best_ < 0) throw Error("sampler: cannot sample from a distribution without a positive probability");
    return best_;
}

double GumbelArgmax::share() const { return 1.0 / sum_; }

int gumbel_max(const SparseDistribution& d, const PositionNoise& noise, int64_t position, NoiseUse use,
               double* pick_share) {
    GumbelArgmax argmax(noise, position, use, pick_share != nullptr);
    for (size_t j = 0; j < d.ids.size(); ++j) argmax.offer(d.ids[j], d.probs[j]);
    const int pick = argmax.pick();
    if (pick_share) *pick_share = argmax.share();
    return pick;
}

}  // namespace tandem
