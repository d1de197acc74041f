// The draft model's side of speculative decoding (Generator's speculative loop): its cache, a prefix of the target's
// context caught up on what it lacks only when drafting first pays; its rows, read as its sampler needs them and
// restricted to a vocabulary where asked; a round's proposals under the p_min rule; drafting ahead while the target
// verifies; and what of all that survives the verification. Under a grammar (GenerationParams::constraint) it
// proposes on a copy of the constraint advanced along its proposals, its rows masked as the target's will be.
#pragma once
#include <cstddef>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "generate/decode_rows.h"
#include "generate/generator.h"
#include "generate/speculative.h"
#include "grammar/constraint.h"
#include "sample/sampler.h"

namespace tandem {

class DraftRunner {
public:
    // Cache positions are absolute: history[i] (the prompt and what was generated) sits at `base + i`, held[p] at
    // p < base (a chat's earlier turns). The draft's cache may hold a prefix of them; what it holds beyond `base`
    // (beyond `base + cached`: the first `cached` tokens of the prompt, which the prompt cache loaded into it) is
    // stale and dropped here. It reads what it lacks in its first proposal: a draft that never drafts never reads
    // the prompt or earlier turns.
    DraftRunner(const DraftModel& draft, const GenerationParams& params, int base, std::span<const int> held,
                int cached = 0);
    DraftRunner(const DraftRunner&) = delete;
    DraftRunner& operator=(const DraftRunner&) = delete;

    Backend& backend() const { return *draft_.backend; }
    // The weight bytes a step of `draft` reads: the model's, less the output rows a restricted vocabulary skips.
    static double bytes_per_step(const Model& draft, const SpeculativeParams& sp);
    // Whether it drafts ahead while `target` verifies (SpeculativeParams::draft_ahead: forced, or auto with a target
    // that computes in the background).
    bool drafts_ahead_of(const Backend& target) const;

    struct Proposal {
        int steps = 0;            // draft forwards behind it (DraftLengthController::record_round)
        double step_seconds = 0;  // their time; 0 where it measures no draft step (a long catch-up, all carried)
        bool caught_up = false;   // the draft first read a long catch-up (the prompt, earlier turns, plain rounds)
        double catch_up_seconds = 0;
        bool holds_last = false;  // the draft's cache holds the last draft too (the p_min rule stopped after it)
    };
    // Up to k tokens continuing `history` into `drafted` (empty on entry): first those drafted ahead for this round,
    // then the draft's own, until k or the p_min rule (from the second on). Sampled drafting picks each by Gumbel-max
    // from the draft's distribution with the seed's noise for its position (coupled: the target's own noise,
    // NoiseUse::Token; rejection: NoiseUse::Proposal) and leaves that distribution in q[i] (q holds at least k), for
    // the rejection test. Adds its time to st.draft_s, the carried tokens to st.ahead_used. Afterwards the draft's cache
    // holds history and every draft but the last (Proposal::holds_last: the last too). Under a grammar, whose state
    // (GenerationParams::constraint) must then be the one after `history`, every proposal is one it allows, and
    // proposing stops where none of the ids the draft computes (its restricted vocabulary) is allowed.
    Proposal propose(int k, const std::vector<int>& history, std::vector<int>& drafted,
                     std::vector<SparseDistribution>& q, SpeculativeStats& st);

    // While the target verifies `drafted` (just proposed after `history`, see propose): the draft reads the last
    // draft unless it has, and drafts on as if every draft is accepted. Its first token is its guess of the target's
    // next one; the rest could open the next round (settle). At most a guess and draft_max proposals, within its
    // cache and `tokens_left` (what may still be generated after the drafts), the p_min rule from the second
    // proposal on. Auto (SpeculativeParams::draft_ahead -1): a step starts only while `target_done` says the
    // verification is still running; forced (n > 0): up to n steps whatever it says. A draft whose backend computes
    // in the background steps with its outputs deferred, `target_done` polled meanwhile.
    void draft_ahead(const std::vector<int>& history, std::span<const int> drafted, bool holds_last, int tokens_left,
                     const std::function<bool()>& target_done, SpeculativeStats& st);

    // After the verification: the target kept `keep` positions (the accepted drafts); `all_accepted` and the
    // target's `next_token` say whether the round went as the draft guessed while drafting ahead. If so, and it
    // drafted past its guess, what followed the guess is carried to the next proposal (its cache keeps it);
    // otherwise its cache is cut back to `keep`.
    void settle(int keep, bool all_accepted, int next_token);
    // A round that proposes nothing from the draft (prompt lookup, plain decoding), `committed` the positions the
    // target's cache holds: anything carried is dropped, the draft's cache cut to committed + 1 (cur, the guess it
    // had drafted after). Nothing to do when nothing is carried.
    void drop_carried(int committed);

    size_t ahead_count() const { return last_ahead_; }  // tokens drafted ahead in the round settled last
    size_t carried() const { return carried_.size(); }  // tokens waiting for the next proposal

private:
    // Reads `tokens`, keeping the last row for read_last (as `context_`'s next-token row).
    void forward(std::span<const int> tokens);
    // The proposal from the last forward: its token and the confidence the p_min rule reads (greedy: the draft's top
    // probability; coupled sampling: its pick's share of the noise-perturbed distribution; rejection sampling: q's
    // top probability). Sampled drafting also fills q. Under a grammar the row is first masked with grammar_'s state;
    // -1 when that leaves nothing to propose.
    int read_last(SparseDistribution& q, float& top);
    // grammar_ at the main constraint's state (after the history) advanced along `tokens`, where there is a grammar.
    void follow_grammar(std::span<const int> tokens);
    // Widens the restricted vocabulary to ids of the context it has not looked at yet.
    void update_vocabulary(const std::vector<int>& history);
    // The context position of the token drafted next: context_[i] sits at base_ + i.
    int64_t next_position() const { return base_ + static_cast<int64_t>(context_.size()); }
    int token_at(int p, const std::vector<int>& history) const {
        return p < base_ ? held_[static_cast<size_t>(p)] : history[static_cast<size_t>(p - base_)];
    }

    DraftModel draft_;
    const SpeculativeParams sp_;
    const SamplerParams sampler_params_;  // the target's transforms and seed
    const NoiseUse proposal_use_;         // the noise its sampled proposals use (SpeculativeParams::sampling)
    const int chunk_;                     // prefill chunk of a catch-up
    const int vocab_;
    const int k_cap_;
    const bool greedy_;
    // The output's grammar, at the state after the history the generator has emitted (not owned), and the copy the
    // proposals advance.
    const grammar::TokenConstraint* const constraint_;
    std::optional<grammar::TokenConstraint> grammar_;
    // Greedy verification without a penalty (and without a grammar, which masks whole rows) reads only the pick and
    // its confidence (forward_argmax_confidence).
    const bool picks_only_;
    const bool restrict_;  // logits of the first sp_.draft_vocab ids and the context's only
    const int base_;
    const std::span<const int> held_;
    int fed_ = 0;  // positions the draft's cache holds, as of the last propose / settle / drop_carried
    Sampler sampler_;
    std::vector<float> logits_, scratch_;
    CandidateRows candidates_;
    bool as_candidates_ = false;  // the last forward's row is in candidates_
    int pick_ = -1;
    float confidence_ = 0.0f;
    std::vector<int> context_, pending_, window_buffer_;
    // The restricted vocabulary's extra ids, which of them are in, and the absolute positions looked at.
    std::vector<int> extra_ids_;
    std::vector<char> extra_seen_;
    int scanned_ = 0;
    // Drafting ahead: ahead_ids_[0] the guess of the target's next token, ahead_ids_[1..] what followed it (ahead_q_:
    // their distributions when sampled); carried_ what a round that went as guessed hands the next one.
    std::vector<int> ahead_ids_, carried_;
    std::vector<SparseDistribution> ahead_q_, carried_q_;
    bool ahead_stopped_ = false, carried_stopped_ = false;  // stopped by p_min: drafting does not go on after them
    size_t last_ahead_ = 0;
};

}  // namespace tandem
