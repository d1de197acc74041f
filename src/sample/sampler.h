// Sampler: turns one row of logits into the token at a position (greedy, repetition penalty, top-k, temperature,
// top-p, min-p, then Gumbel-max with the seed's noise for that position: sample/noise.h), and exposes the final
// distribution so speculative decoding can compare the target's p and the draft's q after exactly the same
// transforms.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "sample/candidates.h"
#include "sample/noise.h"

namespace tandem {

struct SamplerParams {
    float temperature = 0.8f;     // 0 = greedy
    int top_k = 40;               // 0 = off
    float top_p = 0.95f;          // 1 = off
    float min_p = 0.05f;          // 0 = off
    float repeat_penalty = 1.0f;  // 1 = off (llama.cpp/CTRL style: logit>0 ? logit/penalty : logit*penalty)
    int repeat_last_n = 64;       // how many recent tokens the penalty looks at
    uint64_t seed = 0;
};

// A distribution over a few ids, as speculative verification reads it: (id, probability) pairs in ascending id
// order; every other id has probability 0.
struct SparseDistribution {
    std::vector<int> ids;
    std::vector<float> probs;
    float at(int id) const;    // the probability of `id` (0 when absent)
    void assign_one(int id) {  // certainty: a deterministic proposal (prompt lookup)
        ids.assign(1, id);
        probs.assign(1, 1.0f);
    }
};

class Sampler {
public:
    explicit Sampler(SamplerParams params, int n_vocab);

    // Throws tandem::Error naming the first bad field.
    static void validate(const SamplerParams& params);

    // Picks the token at `position` (its index in the context: the positions a plain decode and a speculative round
    // give the same token are the same numbers) from `logits` (n_vocab floats). `history` is the token sequence so
    // far (prompt + output), used by the repetition penalty. Greedy when temperature == 0: argmax, ties broken by the
    // lowest id. For temperature > 0, gumbel_max(distribution(...), noise(), position, NoiseUse::Token), bit for
    // bit: the pick is a pure function of the seed, the position and the logits.
    int sample(const float* logits, std::span<const int> history, int64_t position);

    // The final probability distribution the sampler draws from (after penalty, top-k, temperature, top-p, min-p,
    // renormalisation), written densely into `probs` (n_vocab floats, zeros outside the kept set; one-hot for
    // greedy).
    void distribution(const float* logits, std::span<const int> history, float* probs);

    // The same two from a row given by its candidates (candidates.h; plan_candidates says what they must hold for
    // these params and this history): the same token, the same probabilities, bit for bit.
    // Throws tandem::Error where the candidates lack an id of the penalty window or hold fewer than top-k ids.
    int sample(const CandidateRow& row, std::span<const int> history, int64_t position);
    void distribution(const CandidateRow& row, std::span<const int> history, float* probs);

    // The same distributions as sparse ones: the kept ids with their probabilities, O(kept) beyond the transforms
    // instead of a dense row's O(n_vocab) (the ids whose probability rounds to 0 may be left out).
    void distribution(const float* logits, std::span<const int> history, SparseDistribution& out);
    void distribution(const CandidateRow& row, std::span<const int> history, SparseDistribution& out);

    // The seed's noise (SamplerParams::seed).
    const PositionNoise& noise() const { return noise_; }

    const SamplerParams& params() const { return params_; }
    int n_vocab() const { return n_vocab_; }

private:
    // Runs the transform chain on `logits`; leaves the kept ids in ids_[0, n_kept_) and their final (renormalised)
    // probabilities in prob_[id]. Greedy leaves just the argmax, with probability 1.
    void prepare(const float* logits, std::span<const int> history);
    void prepare(const CandidateRow& row, std::span<const int> history);
    void load_logits(const float* logits, std::span<const int> history);
    // Candidates into logit_ by id and ids_[0, returned count), the penalty applied to the window's ids.
    int load_candidates(const CandidateRow& row, std::span<const int> history);
    // After the top-k cut or the greedy pick: softmax, top-p, min-p, renormalisation (none for greedy).
    void transform();
    int pick(int64_t position) const;          // sample()'s Gumbel-max over the prepared distribution
    void write_kept(float* probs) const;       // distribution()'s dense row
    void write_kept(SparseDistribution& out);  // and its sparse one (sorts the kept ids by id)
    int argmax() const;
    void top_k();
    void softmax();
    void top_p();
    void min_p();
    void renormalise();

    SamplerParams params_;
    int n_vocab_;
    PositionNoise noise_;

    // Scratch, sized n_vocab once so that the per-token path never allocates.
    std::vector<float> logit_;   // by id: logits after NaN clean-up and penalty
    std::vector<float> prob_;    // by id: probability, valid only for the ids in ids_[0, n_kept_)
    std::vector<int> ids_;       // candidate ids; a prefix [0, n_kept_) is the kept set
    std::vector<uint8_t> seen_;  // by id: marks for the penalty's distinct-token pass and the candidates' dedup,
                                 // all zero between calls
    std::vector<float> dense_;   // by id: a large kept set's probabilities, to list them in id order
    int n_kept_ = 0;
    // How ids_[0, n_kept_) is ordered: ascending id (no sort was needed), by (logit desc, id asc) (top-k), or
    // neither (top-p's quickselect). Each transform picks its cheapest path from this.
    enum class Order { ById, ByLogit, None };
    Order order_ = Order::ById;
};

}  // namespace tandem
