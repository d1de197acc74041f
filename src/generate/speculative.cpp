// LookupProposer, DraftLengthController, verify_proposal and SpeculativeStats.
#include "generate/speculative.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>

#include "sample/noise.h"
#include "sample/sampler.h"

namespace tandem {

LookupProposal LookupProposer::propose(std::span<const int> ctx, int k) const {
    LookupProposal best;
    const int size = static_cast<int>(ctx.size());
    const int n_max = std::max(1, params_.lookup_ngram_max), n_min = std::max(1, params_.lookup_ngram_min);
    if (k <= 0 || size < n_min + 1) return best;
    // Candidate j: ctx[j] lines up with the context's last token, so its continuation starts at j + 1 < size.
    for (int j = size - 2; j >= 0; --j) {
        if (ctx[static_cast<size_t>(j)] != ctx[static_cast<size_t>(size - 1)]) continue;
        int len = 1;
        while (len < n_max && j - len >= 0 &&
               ctx[static_cast<size_t>(j - len)] == ctx[static_cast<size_t>(size - 1 - len)])
            ++len;
        if (len < n_min) continue;
        const bool after = cursor_ >= 0 && j + 1 >= cursor_;
        // Scanning backwards: a longer match wins; an equal one only if it is after the cursor (then nearer to it
        // than the one before; otherwise the first found stays: the most recent). A scan of the whole context per
        // round: ~10 us for a few thousand tokens, against a 30 ms target step.
        if (len > best.match_len || (len == best.match_len && after)) {
            best.match_len = len;
            best.source = j + 1;
        }
    }
    if (best.match_len == 0) return best;
    const int to = std::min(size, best.source + k);
    best.tokens.assign(ctx.begin() + best.source, ctx.begin() + to);
    return best;
}

void LookupProposer::follow(const LookupProposal& proposal, int accepted) {
    if (accepted > 0 && proposal.source >= 0) cursor_ = proposal.source + accepted;
}

DraftLengthController::DraftLengthController(int draft_min, int draft_max)
    : draft_min_(std::max(0, draft_min)),
      draft_max_(std::max(draft_min, draft_max)),
      verify_s_(static_cast<size_t>(std::max(draft_min, draft_max)) + 2, -1.0),
      verify_recent_(verify_s_.size()) {
    for (int m = 1; m <= kLookupBuckets; ++m) {
        lookup_trials_[static_cast<size_t>(m)] = kLookupPriorTrials;
        lookup_succ_[static_cast<size_t>(m)] = kLookupPriorTrials * lookup_prior(m);
    }
}

double DraftLengthController::verify_cost(int n) const {
    if (verify_s_[static_cast<size_t>(n)] > 0) return verify_s_[static_cast<size_t>(n)];
    // A forward of n tokens reads every weight once (the cost of one token) and does n tokens' arithmetic; with the
    // kernels' prefetch the two overlap, so a small batch costs little more than one token (the 1.5B here: 34.6,
    // 38.4, 41.1, 42.1, 45.3, 47.9 ms for 1-6 tokens) until the arithmetic dominates (69.9 ms for 9, 126.5 for 17,
    // where the prompt's prefill costs 6.9 ms a token). So: a line through the measured points, never falling,
    // and never below n times the prefill's cost per token where that is known. That floor also guards against a
    // line through two noisy points - seen in a cold one-shot run, plain steps 42-70 ms while the weights were
    // being repacked, then 46 ms for 3 tokens: 17 tokens looked as cheap as one, and a 16-token lookup was verified
    // for nothing. With one point, each further token is taken as 10% of it (from the 1.5B's plain step that
    // predicts 41.5 ms for 3 tokens and 48.4 for 5, against 41.1 and 45.3 measured).
    double sn = 0, st = 0, snn = 0, snt = 0;
    int m = 0;
    for (size_t i = 1; i < verify_s_.size(); ++i) {
        if (verify_s_[i] <= 0) continue;
        const double x = static_cast<double>(i);
        sn += x, st += verify_s_[i], snn += x * x, snt += x * verify_s_[i];
        ++m;
    }
    if (m == 0) return 1.0;  // nothing measured: only ratios matter
    double line;
    if (m == 1) {
        const double x0 = sn, t0 = st;
        line = t0 * (1.0 + 0.1 * (n - 1)) / (1.0 + 0.1 * (x0 - 1));
    } else {
        const double slope = std::max(0.0, (m * snt - sn * st) / (m * snn - sn * sn));
        line = (st - slope * sn) / m + slope * n;
    }
    return std::max({1e-9, line, n * prefill_token_s_});
}

// Expected tokens per round with k drafted tokens each accepted with probability a: (1 - a^(k+1)) / (1 - a).
static double expected_tokens(double a, int k) { return (1.0 - std::pow(a, k + 1)) / (1.0 - a); }

// The acceptance rate the "could drafting ever pay" questions assume: high for a draft of the same family.
static constexpr double kOptimisticAcceptance = 0.9;

bool DraftLengthController::drafting_may_pay() const {
    if (free_drafts_ || draft_cost_ratio_ <= 0 || prefill_token_s_ <= 0 || verify_s_[1] <= 0) return true;
    // Optimistic on every count: 90% acceptance, a draft step at the weight-bytes ratio of a target step, a
    // verification of k + 1 tokens at the larger of a plain step and k + 1 tokens at the target's large-batch
    // prefill cost (reading the weights and the arithmetic fully overlapped). Against that, the draft must first
    // read the prompt (catch_up_s_), a cost the tokens still wanted must repay.
    const double t1 = verify_s_[1], step = draft_cost_ratio_ * t1;
    const double plain_s = tokens_wanted_ * t1;
    for (int k = std::max(1, draft_min_); k <= draft_max_; ++k) {
        const double round_s = k * step + std::max(t1, (k + 1) * prefill_token_s_);
        const double drafting_s = catch_up_s_ + tokens_wanted_ * round_s / expected_tokens(kOptimisticAcceptance, k);
        if (drafting_s < plain_s) return true;
    }
    return false;
}

double DraftLengthController::round_cost(int k) const {
    if (k == 0) return plain_s_per_token_ > 0 ? plain_s_per_token_ : verify_cost(1);
    const double step = free_drafts_ ? 0.0 : std::max(0.0, draft_step_s_);
    const double verify = verify_cost(k + 1);
    double steps = k;
    if (draft_ahead_ && step > 0) {
        // While the target verifies, the draft takes about verify / step steps: a guess of the target's next token,
        // then proposals after it. With the k drafts all accepted and the guess right (taken as k + 1 tokens
        // accepted at alpha), the next round opens with up to k of those proposals instead of its own steps, the
        // rounds being alike.
        const int ahead = std::min(draft_max_ + 1, static_cast<int>(std::ceil(verify / step)));
        const double carried = std::pow(std::min(alpha_, 0.999), k + 1) * std::min(k, std::max(0, ahead - 1));
        steps -= carried;
    }
    return cost_scale() * (steps * step + verify);
}

double DraftLengthController::cost_scale() const {
    return cost_ratios_.count() < kCalibrationRounds ? 1.0 : cost_ratios_.median();
}

bool DraftLengthController::better_acceptance_could_pay(int kmax) const {
    const double a = std::max(kOptimisticAcceptance, std::min(alpha_, 0.999));
    const double plain_rate = 1.0 / round_cost(0);
    for (int k = 1; k <= kmax; ++k)
        if (expected_tokens(a, k) / round_cost(k) > plain_rate) return true;
    return false;
}

int DraftLengthController::choose(int k_limit) {
    const int kmax = std::min(draft_max_, k_limit);
    if (kmax <= 0) return 0;
    const int kmin = std::min(draft_min_, kmax);
    if (verify_s_[1] <= 0)
        return kmin;  // measure plain decoding first (kPlainSamples steps): every other cost is
                      // judged against it
    if (!free_drafts_ && draft_step_s_ < 0) {
        // The draft has not run yet. If even the optimistic prior says it cannot win, never start it (it would
        // first have to read the whole prompt); otherwise draft a few tokens to measure its real cost.
        if (kmin == 0 && !drafting_may_pay()) return 0;
        return std::max(kmin, std::min(kmax, 4));
    }
    int best_k = kmin;
    best_drafting_rate(kmin, kmax, &best_k);
    if (best_k == 0 && kmax > 0) {
        if (!free_drafts_) relax_acceptance();
        // Plain decoding wins on current estimates; re-measure acceptance now and then, as it drifts with content.
        // A draft model must first catch up on every token since it last ran, so each losing probe doubles the
        // interval before the next (up to 512 rounds). A probe only measures acceptance: when the measured costs
        // lose to plain decoding even at an optimistic acceptance, no acceptance it could find would change the
        // decision, and the draft is left alone.
        if (!free_drafts_ && !better_acceptance_could_pay(kmax)) return 0;
        if (++rounds_since_probe_ >= probe_interval_) {
            rounds_since_probe_ = 0;
            if (!free_drafts_) probe_interval_ = std::min(512, probe_interval_ * 2);
            return std::min(kmax, 2);
        }
    } else {
        probe_interval_ = 32;
    }
    return best_k;
}

double DraftLengthController::best_drafting_rate(int kmin, int kmax, int* k_out) const {
    const double a = std::min(alpha_, 0.999);
    int best_k = kmin;
    double best_rate = -1;
    for (int k = kmin; k <= kmax; ++k) {
        // Cost: k draft steps plus one target forward of k + 1 tokens, as drafting rounds really cost them (k = 0: a
        // plain round's realised cost; see record_throughput).
        const double rate = expected_tokens(a, k) / round_cost(k);
        if (rate > best_rate) best_rate = rate, best_k = k;
    }
    *k_out = best_k;
    return best_rate;
}

// P(a proposed token is accepted | the match behind it is m tokens long), greedy, measured with the 1.5B on nine
// prompts (compare-llamacpp's three; renaming a variable, JavaScript to TypeScript, fixing spelling in a paragraph,
// adding a docstring; two answers written from scratch), every position of the answers, the longest match with
// the most recent occurrence: m = 1: 0.23 (266 positions), 2: 0.50 (158), 3: 0.69, 4: 0.70, 5: 0.78, 6: 0.76 (112-141
// each), 7-15: 0.87-1.0 (112-150 each), 16-23: 0.86-1.0, 24 or more: 0.95 (3384). Rounded down where the samples
// are few; sampling at a temperature accepts less, which the counts then learn.
double DraftLengthController::lookup_prior(int m) {
    static constexpr double kPrior[] = {0.0, 0.23, 0.50, 0.65, 0.70, 0.75, 0.78, 0.85, 0.90};
    if (m >= kLookupBuckets) return 0.93;
    return kPrior[std::clamp(m, 0, 8)];
}

double DraftLengthController::lookup_acceptance(int match_len) const {
    const auto m = static_cast<size_t>(std::clamp(match_len, 1, kLookupBuckets));
    return lookup_succ_[m] / lookup_trials_[m];
}

int DraftLengthController::choose_lookup(int match_len, int available, int k_limit) const {
    const int kmax = std::min({draft_max_, k_limit, available});
    if (kmax <= 0 || match_len <= 0) return 0;
    // --draft-min asks for at least that many drafted tokens per round: beside a draft model, the draft provides
    // them when lookup is not the better proposal (choose() honours it); alone, lookup must.
    const int kmin = free_drafts_ ? std::min(draft_min_, kmax) : 0;
    if (verify_s_[1] <= 0) return kmin;  // plain decoding is measured first
    // What the round would otherwise be: a plain step, or beside a draft model that has run its best round.
    double best_rate = 1.0 / round_cost(0);
    if (!free_drafts_ && draft_step_s_ > 0) {
        int k_draft = 0;
        best_rate = std::max(best_rate, best_drafting_rate(0, kmax, &k_draft));
    }
    int best_k = 0;
    double expected = 1.0, p_all = 1.0;  // tokens per round: the target's own one, plus each accepted proposal
    for (int k = 1; k <= kmax; ++k) {
        p_all *= lookup_acceptance(match_len + k - 1);  // token k is accepted if all before it were
        expected += p_all;
        const double rate = expected / (cost_scale() * verify_cost(k + 1));  // a lookup takes no draft steps
        if (rate > best_rate) best_rate = rate, best_k = k;
    }
    return best_k > 0 ? std::max(best_k, std::min(draft_min_, kmax)) : kmin;
}

void DraftLengthController::record_lookup(int match_len, int drafted, int accepted) {
    // Token i was tried at match length match_len + i if the i before it were accepted.
    for (int i = 0; i < drafted && i <= accepted; ++i) {
        const auto m = static_cast<size_t>(std::clamp(match_len + i, 1, kLookupBuckets));
        lookup_trials_[m] += 1.0;
        if (i < accepted) lookup_succ_[m] += 1.0;
    }
}

void DraftLengthController::record_round(int drafted, int accepted, double draft_seconds, int draft_steps) {
    if (drafted <= 0) return;
    // Decayed success / trial counts: a rejection after `accepted` tokens is one failed trial.
    const double trials = accepted + (accepted < drafted ? 1 : 0);
    succ_ = succ_ * kDecay + accepted;
    trials_ = trials_ * kDecay + trials;
    alpha_ = acceptance(succ_, trials_);
    succ_long_ = succ_long_ * kLongDecay + accepted;
    trials_long_ = trials_long_ * kLongDecay + trials;
    if (!free_drafts_ && draft_seconds > 0) {
        draft_steps_.add(draft_seconds / (draft_steps > 0 ? draft_steps : drafted));
        draft_step_s_ = draft_steps_.median();
    }
}

// A plain round decays the local evidence as a drafting round would and adds one pseudo-trial at the long-run
// rate: after a hard patch alpha_ recovers within ~10-20 plain rounds where the long run is good (instead of waiting
// for a probe, 32 rounds and then doubling), and stays low where the draft is poor all along.
void DraftLengthController::relax_acceptance() {
    succ_ = succ_ * kDecay + long_run_acceptance();
    trials_ = trials_ * kDecay + 1.0;
    alpha_ = acceptance(succ_, trials_);
}

void DraftLengthController::record_throughput(int n_drafted, int tokens, double seconds, int draft_steps) {
    if (tokens <= 0 || seconds <= 0) return;
    if (n_drafted > 0) {
        if (!free_drafts_ && draft_step_s_ <= 0) return;  // nothing to compare with yet
        const double step = free_drafts_ ? 0.0 : draft_step_s_;
        const double predicted = (draft_steps >= 0 ? draft_steps : n_drafted) * step + verify_cost(n_drafted + 1);
        cost_ratios_.add(seconds / predicted);
        return;
    }
    const double per_token = seconds / tokens;
    plain_s_per_token_ = plain_s_per_token_ < 0 ? per_token : 0.8 * plain_s_per_token_ + 0.2 * per_token;
}

void DraftLengthController::record_verify(int n_tokens, double seconds) {
    if (n_tokens < 1 || static_cast<size_t>(n_tokens) >= verify_s_.size() || seconds <= 0) return;
    RecentMedian<5>& recent = verify_recent_[static_cast<size_t>(n_tokens)];
    if (n_tokens == 1 && first_plain_s_.size() < kPlainSamples) {
        first_plain_s_.push_back(seconds);
        if (first_plain_s_.size() == kPlainSamples) {
            recent.add(*std::min_element(first_plain_s_.begin(), first_plain_s_.end()));
            verify_s_[1] = recent.median();
        }
        return;
    }
    recent.add(seconds);
    verify_s_[static_cast<size_t>(n_tokens)] = recent.median();
}

const char* spec_sampling_name(SpecSampling s) { return s == SpecSampling::Coupled ? "coupled" : "rejection"; }

Verdict verify_proposal(std::span<const int> drafted, std::span<const SparseDistribution> target,
                        std::span<const SparseDistribution> draft, bool greedy, SpecSampling sampling,
                        const PositionNoise& noise, int64_t position) {
    Verdict v;
    const int k = static_cast<int>(drafted.size());
    const bool rejection = !greedy && sampling == SpecSampling::Rejection;
    assert(target.size() >= drafted.size() + 1 && (!rejection || draft.size() >= drafted.size()));
    // The first id of the largest probability (a dense row's max_element).
    auto argmax = [](const SparseDistribution& p) {
        int best = -1;
        float best_p = 0.0f;
        for (size_t j = 0; j < p.ids.size(); ++j)
            if (best < 0 || p.probs[j] > best_p) best = p.ids[j], best_p = p.probs[j];
        return best;
    };
    // The target's own token at position + i: what plain decoding samples there.
    auto target_token = [&](int i) {
        const SparseDistribution& p = target[static_cast<size_t>(i)];
        return greedy ? argmax(p) : gumbel_max(p, noise, position + i, NoiseUse::Token);
    };
    SparseDistribution residual;
    for (int i = 0; i < k; ++i) {
        const int x = drafted[static_cast<size_t>(i)];
        if (!rejection) {
            // Greedy: p is one-hot at the argmax. Coupled: the draft is accepted iff it is the target's sample.
            const int t = target_token(i);
            if (t == x) {
                ++v.n_accepted;
                continue;
            }
            v.next_token = t;
            return v;
        }
        const SparseDistribution& p = target[static_cast<size_t>(i)];
        const SparseDistribution& q = draft[static_cast<size_t>(i)];
        const float px = p.at(x), qx = q.at(x);
        // Accept with probability min(1, p(x) / q(x)); q(x) > 0 because x was drawn from q.
        const double u = noise.uniform(position + i, NoiseUse::Acceptance);
        if (qx > 0 && u < std::min(1.0, static_cast<double>(px) / qx)) {
            ++v.n_accepted;
            continue;
        }
        // Rejected: the correction comes from the residual max(p - q, 0) (zero wherever p is).
        residual.ids = p.ids;
        residual.probs.resize(p.probs.size());
        bool any = false;
        for (size_t j = 0; j < p.ids.size(); ++j) {
            residual.probs[j] = std::max(0.0f, p.probs[j] - q.at(p.ids[j]));
            any = any || residual.probs[j] > 0;
        }
        // p == q exactly leaves no residual; then rejection had probability 0 and cannot happen, except through
        // float rounding: fall back to p itself.
        v.next_token = gumbel_max(any ? residual : p, noise, position + i, NoiseUse::Residual);
        return v;
    }
    v.next_token = target_token(k);
    return v;
}

std::string SpeculativeStats::summary(double total_s, int n_generated) const {
    char buf[512];
    std::string out;
    const double rate = drafted ? static_cast<double>(accepted) / static_cast<double>(drafted) : 0.0;
    const int drafting_rounds = rounds - plain_steps;
    std::snprintf(buf, sizeof buf,
                  "speculative:        %d rounds (%d without drafting), %lld drafted, %lld accepted (%.1f%%)\n"
                  "mean accepted:      %.2f tokens per drafting round\n",
                  rounds, plain_steps, static_cast<long long>(drafted), static_cast<long long>(accepted), 100.0 * rate,
                  drafting_rounds ? static_cast<double>(accepted) / drafting_rounds : 0.0);
    out += buf;
    out += "accepted lengths:   ";
    int last = 0;
    for (int i = 0; i < static_cast<int>(accepted_hist.size()); ++i)
        if (accepted_hist[static_cast<size_t>(i)]) last = i;
    for (int i = 0; i <= last; ++i) {
        std::snprintf(buf, sizeof buf, "%s%d:%d", i ? " " : "", i, accepted_hist[static_cast<size_t>(i)]);
        out += buf;
    }
    if (ahead_steps > 0) {
        std::snprintf(buf, sizeof buf,
                      "\ndrafted ahead:      %lld draft steps during verification, %lld of their tokens proposed",
                      static_cast<long long>(ahead_steps), static_cast<long long>(ahead_used));
        out += buf;
    }
    const double other = std::max(0.0, total_s - draft_s - verify_s);
    std::snprintf(buf, sizeof buf,
                  "\ntime split:         draft %.3f s, verify %.3f s, other %.3f s\n"
                  "effective decode:   %.1f tokens/s\n",
                  draft_s, verify_s, other, total_s > 0 ? n_generated / total_s : 0.0);
    out += buf;
    return out;
}

}  // namespace tandem
