// Speculative decoding: the pieces the Generator's speculative loop is made of.
//   - LookupProposer: prompt-lookup drafting (the continuation of the longest earlier match of the context's end).
//   - DraftLengthController: picks the draft length k each round from the running acceptance rate and the
//     measured costs (a draft step, and a target verification of n tokens), falling back to plain decoding
//     (k = 0) when drafting cannot win on this hardware.
//   - verify_proposal: accepts or rejects drafted tokens against the target's distributions (greedy: while they
//     equal the target's argmax; coupled sampling: while they equal the target's own Gumbel-max sample; rejection
//     sampling, Leviathan et al. 2023 / Chen et al. 2023), so the output distribution is exactly the target's.
//   - SpeculativeStats: what --stats reports.
#pragma once
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace tandem {

class PositionNoise;
struct SparseDistribution;

// How sampled (temperature > 0) speculative decoding verifies a proposal. Both give exactly the target's
// distribution; they differ in what a seed reproduces and in how often a draft is accepted.
enum class SpecSampling {
    // The draft proposes with the target's own noise (sample/noise.h: Gumbel-max keyed by position and token id) and
    // a draft is accepted iff it is the token the target samples there: the output is plain decoding's for the same
    // seed, token for token, whatever was drafted. Accepts with probability P(argmax(log q + g) = argmax(log p + g)),
    // at least (1 - TV) / (1 + TV) for the total variation distance TV of p and q (Daliri, Musco and Suresh 2024,
    // arXiv:2408.07978), and at most rejection's 1 - TV.
    Coupled,
    // Rejection sampling: accept x ~ q with probability min(1, p(x)/q(x)), else a token from norm(max(p - q, 0)).
    // The optimal acceptance, 1 - TV; but which positions take that test and which a plain step depends on the draft
    // lengths the controller picks from timings, so a seed reproduces the text only where those lengths are fixed
    // (--draft-min = --draft-max, no lookup).
    Rejection,
};
const char* spec_sampling_name(SpecSampling s);

struct SpeculativeParams {
    int draft_max = 16;  // k never exceeds this
    int draft_min = 0;   // nor goes below this (0 lets the controller fall back to plain decoding)
    float p_min = 0.6f;  // a draft model stops proposing when its own top probability falls below this
    // A draft model computes the logits of the first draft_vocab ids and of every id in the context only (0: all;
    // Backend::restrict_logits). Proposals outside are never made; the output stays the target's exactly.
    int draft_vocab = 32768;
    bool lookup = false;  // prompt-lookup drafting (with or without a draft model)
    // Matches of the context's last n tokens, n from lookup_ngram_min up to lookup_ngram_max (longer matches are
    // measured up to that length: how long a match is tells how far its continuation will be accepted). Even a
    // one-token match is worth a proposal where verifying one more token costs little (the 1.5B here: 2 tokens 32 ms
    // against 30 for one, and a one-token match's next token is accepted 23% of the time); the controller decides
    // that from the measured costs (DraftLengthController::choose_lookup).
    int lookup_ngram_max = 16;
    int lookup_ngram_min = 1;
    // Drafting ahead: while the target verifies a round's drafts, the draft reads the last of them and drafts on as
    // if all are accepted; when they are and the target's next token is the draft's own guess for it, the tokens
    // drafted after that guess open the next round without draft steps of its own (parallel drafting and
    // verification, as PEARL, Liu et al. 2024). Wasted work otherwise, done while the host would wait. -1 (auto):
    // only where the target computes in the background (Backend::computes_in_background: a GPU), and only while it
    // does; 0: never; n > 0: up to n draft forwards a round whatever the target does (tests, benchmarks).
    int draft_ahead = -1;
    // One stderr line per round (--spec-trace): the controller's k, what was drafted and accepted, the length of the
    // lookup match proposed (0: not a lookup round), the draft's, the verification's and the round's milliseconds;
    // catch=1 when the draft read a long catch-up; the draft steps of its own, the tokens it drafted ahead during
    // the verification and those of them carried to the next round. For diagnosis; the output is the same.
    bool trace = false;
    SpecSampling sampling = SpecSampling::Coupled;  // --spec-sampling (temperature > 0 only)
};

// A prompt-lookup proposal: the tokens that followed an earlier occurrence of the context's last `match_len` tokens.
struct LookupProposal {
    std::vector<int> tokens;
    int match_len = 0;  // 0: nothing matched
    int source = -1;    // the context index of tokens[0]
};

class LookupProposer {
public:
    explicit LookupProposer(const SpeculativeParams& params) : params_(params) {}
    // Up to `k` tokens continuing `context` from the longest earlier occurrence of its end (lookup_ngram_min ..
    // lookup_ngram_max tokens). Among equally long ones, the first that continues at or after the cursor, where
    // the last accepted proposal ended: a rewrite walks through its source in order, and the most recent occurrence
    // of a short match is often a later line of that source (the rewrite task of compare-llamacpp: "    lines"
    // followed by " = []" early in the source and by ".append(" twice after it). Without a cursor, or none after
    // it, the most recent. Empty when nothing matches.
    LookupProposal propose(std::span<const int> context, int k) const;
    // After verification: the first `accepted` tokens of `proposal` were accepted (the cursor moves past them).
    void follow(const LookupProposal& proposal, int accepted);

private:
    SpeculativeParams params_;
    int cursor_ = -1;
};

// The median of the last N samples of a cost (fewer while fewer are in). On this shared host a round now and then
// takes 1.5-2x its usual time; a running average let two such rounds raise the 1.5B's 3-token verification cost
// 33 -> 42 ms, and as the controller then decoded plainly, no drafting round came to correct it (30 plain rounds
// at 96% acceptance). A median ignores a minority of such rounds and follows a lasting change within N / 2 + 1.
template <size_t N>
class RecentMedian {
public:
    void add(double x) { samples_[static_cast<size_t>(count_++) % N] = x; }
    int count() const { return count_; }  // samples ever added
    double median() const {               // 0 when empty
        const size_t n = std::min(N, static_cast<size_t>(count_));
        if (n == 0) return 0.0;
        std::array<double, N> sorted = samples_;
        // Insertion sort of a handful: std::sort's unrolled path on so small an array trips GCC 12's -Warray-bounds
        // (a false positive, in the sanitizer build).
        for (size_t i = 1; i < n; ++i) {
            const double x = sorted[i];
            size_t j = i;
            for (; j > 0 && sorted[j - 1] > x; --j) sorted[j] = sorted[j - 1];
            sorted[j] = x;
        }
        return n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    }

private:
    std::array<double, N> samples_{};
    int count_ = 0;
};

class DraftLengthController {
public:
    DraftLengthController(int draft_min, int draft_max);
    // The k for the next round; `k_limit` caps it (context room, tokens still wanted).
    // A plain choice (k = 0 while drafting could resume) also counts as a plain round for the acceptance
    // estimate (relax_acceptance): call it once per round.
    int choose(int k_limit);
    // Feedback after a round: tokens drafted and accepted, seconds spent drafting them, and the draft forwards
    // those seconds paid for (-1: one per drafted token). A draft that stops at p_min has run one forward more than
    // it drafted (the one whose top probability was too low): counted per drafted token, a round that stopped
    // after 1 token read as a draft step of twice its cost (on a code prompt such rounds are common).
    void record_round(int drafted, int accepted, double draft_seconds, int draft_steps = -1);
    // A target forward of `n_tokens` took `seconds` (n = 1 for plain decode, k + 1 for verification).
    void record_verify(int n_tokens, double seconds);
    // Turns off the cost model: the draft is free (prompt lookup), only acceptance matters.
    void set_free_drafts(bool free) { free_drafts_ = free; }
    // The draft drafts ahead while the target verifies (SpeculativeParams::draft_ahead, where the target computes in
    // the background): a round whose drafts are all accepted and whose next token the draft guessed hands the next
    // round what was drafted ahead, so a round of k drafts expects fewer than k draft steps of its own (round_cost).
    void set_draft_ahead(bool on) { draft_ahead_ = on; }
    // Prompt lookup. Its proposals do not fail like a draft model's, token by token at a steady rate: a copy either
    // goes on or ends, and how likely its next token is accepted grows with how long the match behind it already
    // is (measured below, lookup_acceptance). So the length is chosen per proposal: the k (at most `available`,
    // the proposal's length) that maximises the round's expected tokens per second, given the chance of each
    // further token at match length match_len + i and the measured verification costs; 0 when plain decoding (or,
    // beside a draft model, its best round at the current estimates) is expected to do better.
    int choose_lookup(int match_len, int available, int k_limit) const;
    // Feedback: a proposal behind a match of `match_len` tokens had `drafted` tokens, `accepted` of them accepted.
    void record_lookup(int match_len, int drafted, int accepted);
    // The estimated chance that a proposed token whose match so far is `match_len` tokens long is accepted.
    double lookup_acceptance(int match_len) const;
    // Costs known before the draft has run, so that a draft that cannot pay on this machine is never started:
    // `draft_cost_ratio`, a draft step's cost as a fraction of a plain target step (decode reads every weight once,
    // so the ratio of the weight bytes); `prefill_token_s`, the target's seconds per token in a large prefill
    // chunk (n times it is a lower bound on what verifying n tokens costs); `catch_up_s`, what the draft's first
    // reading of the prompt will cost; `tokens_wanted`, the tokens left to generate, which must repay it. 0 means
    // unknown.
    void set_cost_prior(double draft_cost_ratio, double prefill_token_s, double catch_up_s, double tokens_wanted) {
        draft_cost_ratio_ = draft_cost_ratio;
        prefill_token_s_ = prefill_token_s;
        catch_up_s_ = catch_up_s;
        tokens_wanted_ = tokens_wanted;
    }
    // Whole-round wall time (proposing, verifying, sampling) of a round that drafted `n_drafted` tokens (0: a plain
    // round) and emitted `tokens`. What the model leaves out (sampling, the draft's softmax, the machine being busier
    // than when a cost was measured) must not carry the guarantee that drafting never runs much below plain
    // decoding, so choose() weighs realised costs: plain rounds' seconds per token for k = 0, and for k > 0 the
    // model's round cost scaled by what drafting rounds really took over what the model predicted for them (the
    // median over the last rounds, applied once four are in: one round slowed by the machine must not stop
    // drafting, as then only rare probes would draft again). The scale is of cost only, acceptance being alpha's:
    // an answer's first, unpredictable rounds lower alpha, and do not also count against every later round's cost.
    // `draft_steps` as in record_round: the model's prediction for the round is that many draft steps.
    void record_throughput(int n_drafted, int tokens, double seconds, int draft_steps = -1);
    double acceptance() const { return alpha_; }
    double draft_step_seconds() const { return draft_step_s_; }  // recent seconds per draft forward (-1: unknown)

private:
    double verify_cost(int n_tokens) const;  // estimated seconds for a target forward of n tokens
    int draft_min_, draft_max_;
    bool free_drafts_ = false;
    bool draft_ahead_ = false;
    double alpha_ = 0.7;            // running per-token acceptance estimate (prior: a typical draft's rate)
    double succ_ = 0, trials_ = 0;  // decayed counts behind alpha_ (per round: x kDecay)
    static constexpr double kDecay = 0.9;
    // Acceptance from decayed counts; one pseudo-trial at the prior keeps it off 0 and 1.
    static double acceptance(double succ, double trials) { return (succ + 0.7) / (trials + 1.0); }
    // The same over a long horizon (x 0.99 per drafting round): what alpha_ returns to during plain rounds. Drafts
    // fail in patches: on a code prompt the 0.5B missed 4 of 6 positions early in the answer and then agreed for
    // long stretches, but alpha_, measured in the patch, stayed there while the controller decoded plainly, and a
    // probe landing in the next hard spot left the rest of the answer plain (88 of ~120 rounds).
    double succ_long_ = 0, trials_long_ = 0;
    static constexpr double kLongDecay = 0.99;
    double long_run_acceptance() const { return acceptance(succ_long_, trials_long_); }
    void relax_acceptance();    // one plain round: alpha_ one step toward long_run_acceptance()
    double draft_step_s_ = -1;  // recent median seconds per draft forward (-1: not measured yet)
    RecentMedian<5> draft_steps_;
    std::vector<double> verify_s_;  // recent median seconds per target forward, by n_tokens (-1: not measured)
    std::vector<RecentMedian<5>> verify_recent_;
    bool drafting_may_pay() const;  // the prior at an optimistic acceptance (see set_cost_prior)
    // With the measured draft and verification costs, whether some k up to kmax beats plain decoding at an
    // optimistic acceptance (or the current estimate, if higher).
    bool better_acceptance_could_pay(int kmax) const;
    double draft_cost_ratio_ = 0, prefill_token_s_ = 0, catch_up_s_ = 0, tokens_wanted_ = 1e9;
    // The best drafting round's expected tokens per second at the current estimates; its k in *k_out.
    double best_drafting_rate(int kmin, int kmax, int* k_out) const;
    // Prompt lookup's acceptance by match length (1 .. kLookupBuckets, the last also every longer match): counts
    // started at a prior (lookup_prior) worth kLookupPriorTrials trials, then every proposed token verified.
    static constexpr int kLookupBuckets = 16;
    static constexpr double kLookupPriorTrials = 8.0;
    static double lookup_prior(int match_len);
    std::array<double, kLookupBuckets + 1> lookup_succ_{}, lookup_trials_{};
    int rounds_since_probe_ = 0;
    double plain_s_per_token_ = -1;  // running average over plain rounds (-1: not measured)
    // Realised over predicted seconds of the last drafting rounds.
    RecentMedian<7> cost_ratios_;
    static constexpr int kCalibrationRounds = 4;  // rounds in before the scale applies
    double cost_scale() const;                    // median of cost_ratios_ (1 until kCalibrationRounds are in)
    double round_cost(int k) const;  // the model's seconds for a round drafting k tokens (k = 0: a plain step)
    int probe_interval_ = 32;        // rounds of plain decoding between probes; doubles while probes keep losing
    // The first plain steps, whose minimum starts verify_s_[1]: the first steps after a prefill are slower (seen:
    // 35-41 ms against 31 ms later for the 1.5B here), and a plain step looking slower than it is would make
    // drafting look better than it is.
    std::vector<double> first_plain_s_;
    static constexpr size_t kPlainSamples = 5;
};

struct Verdict {
    int n_accepted = 0;   // leading drafted tokens accepted
    int next_token = -1;  // the target's token after them (a correction on rejection, the bonus when all accepted)
};

// Verifies `drafted` (k tokens), drafted[i] at context position `position` + i. `target` holds k + 1 target
// distributions (after the sampler's transforms) for the positions of drafted[0..k-1] and the bonus position;
// `draft` holds the k draft distributions the tokens were drawn from (certainty for deterministic proposals such as
// lookup; read by rejection sampling only). Greedy (temperature 0) accepts while the token is the target's argmax
// (its distribution one-hot). Coupled sampling accepts while the token is the target's Gumbel-max sample
// (NoiseUse::Token), and that sample is the next token: plain decoding's token there. Rejection sampling accepts x
// with probability min(1, p(x)/q(x)) (NoiseUse::Acceptance) and on rejection samples norm(max(p - q, 0))
// (NoiseUse::Residual); the bonus token is the target's sample, as in plain decoding. Every number is `noise`'s for
// that position, so a verdict is a pure function of its inputs. Sparse: O(kept ids), not O(n_vocab), per position.
Verdict verify_proposal(std::span<const int> drafted, std::span<const SparseDistribution> target,
                        std::span<const SparseDistribution> draft, bool greedy, SpecSampling sampling,
                        const PositionNoise& noise, int64_t position);

struct SpeculativeStats {
    int rounds = 0;       // verification forwards
    int plain_steps = 0;  // rounds where the controller chose k = 0
    int64_t drafted = 0, accepted = 0;
    // Drafting ahead (SpeculativeParams::draft_ahead): draft forwards run while the target verified, and the tokens
    // they drafted that a later round proposed.
    int64_t ahead_steps = 0, ahead_used = 0;
    std::array<int, 65> accepted_hist{};  // rounds by number of accepted tokens (last bucket: 64 or more)
    double draft_s = 0, verify_s = 0;
    std::string summary(double total_s, int n_generated) const;  // the --stats block
};

}  // namespace tandem
