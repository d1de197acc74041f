// Position-keyed noise: every random number sampling uses is a pure function of (seed, position, use, token id),
// computed by a counter-based generator (Philox4x32-10, Salmon et al., "Parallel random numbers: as easy as 1, 2,
// 3", SC 2011) instead of drawn from a stream. No scheduling decision (how many tokens a speculative round drafts, a
// plain step instead of a drafted round, prefill chunks, threads, the backend) can then move a draw to another
// token, so a seed gives the same text however the work was scheduled.
//
// Sampling from a distribution p with this noise is Gumbel-max: argmax over ids of log p(id) + g(id), g(id) standard
// Gumbel noise keyed by (position, id), is an exact sample of p (the Gumbel-max trick; e.g. Maddison et al., "A*
// Sampling", NeurIPS 2014). Its point here: a draft model that proposes argmax log q(id) + g(id) with the same g
// proposes the target's own sample wherever it can, so speculative decoding accepts a draft iff it equals the token
// plain decoding would have sampled there, and the output is plain decoding's, token for token (coupled speculative
// sampling, generate/speculative.h; Daliri, Musco and Suresh, "Coupling without communication and drafter-invariant
// speculative decoding", arXiv:2408.07978, 2024, study this scheme and its acceptance bound).
#pragma once
#include <array>
#include <cstdint>

namespace tandem {

struct SparseDistribution;

// Philox4x32-10: the 128-bit counter `ctr` under the 64-bit key `key`, as Random123's reference (its known-answer
// vectors pin it in test_noise).
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key);

// What a number is for. Each use at a position has its own numbers, so one never stands in for another.
enum class NoiseUse : uint32_t {
    Token = 0,       // the token sampled at a position (plain decoding; the coupled draft's proposal)
    Proposal = 1,    // a draft's proposal under rejection sampling (drawn independently of the target's)
    Acceptance = 2,  // rejection sampling's accept test
    Residual = 3,    // rejection sampling's correction, drawn from the residual distribution
};

class PositionNoise {
public:
    explicit PositionNoise(uint64_t seed) : seed_(seed) {}
    uint64_t seed() const { return seed_; }
    // A uniform in the open interval (0, 1) with 53 random bits: never 0 or 1, so both logs of gumbel() are finite.
    double uniform(int64_t position, NoiseUse use, uint32_t id = 0) const;
    // Standard Gumbel noise, -log(-log(u)).
    double gumbel(int64_t position, NoiseUse use, uint32_t id) const;

private:
    uint64_t seed_;
};

// Gumbel-max over d's ids with positive probability: the id maximising log(p) + noise.gumbel(position, use, id),
// the lower id on an (astronomically unlikely) tie. An exact sample of d (its weights need not sum to 1).
// Throws tandem::Error if no probability is positive. With `pick_share`, also the pick's share of the perturbed
// distribution, exp(score) / sum of exp(scores): near 1 when its score stands far above every other, near 1/2 when
// another comes close (a draft's confidence under coupled sampling, which is greedy decoding of the perturbed scores).
int gumbel_max(const SparseDistribution& d, const PositionNoise& noise, int64_t position, NoiseUse use,
               double* pick_share = nullptr);

// gumbel_max's running maximum, for callers that walk their own candidate lists (Sampler's kept ids) and must pick
// exactly what gumbel_max would from the same probabilities: offer every (id, probability), in any order (the
// maximum, the lower id on a tie, does not depend on it); ids of probability <= 0 are skipped.
class GumbelArgmax {
public:
    GumbelArgmax(const PositionNoise& noise, int64_t position, NoiseUse use, bool track_share = false)
        : noise_(noise), position_(position), use_(use), track_share_(track_share) {}
    void offer(int id, float p);
    int pick() const;      // throws tandem::Error if no probability offered was positive
    double share() const;  // the pick's share of the perturbed distribution (constructed with track_share)

private:
    const PositionNoise& noise_;
    const int64_t position_;
    const NoiseUse use_;
    const bool track_share_;
    int best_ = -1;
    double best_score_ = 0;
    double sum_ = 0;  // of exp(score - best_score_), rescaled as the maximum moves (an online log-sum-exp)
};

}  // namespace tandem
