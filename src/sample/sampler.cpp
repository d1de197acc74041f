// Sampler implementation: the transform chain (penalty → top-k → softmax with temperature → top-p → min-p →
// renormalise) and the Gumbel-max pick. The chain is the one llama.cpp's common
// sampler uses, so settings carried over from llama.cpp mean the same thing here.
#include "sample/sampler.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <string>

#include "error.h"

namespace tandem {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Softmax outputs carry ~1e-7 of float rounding, so a threshold that an exact distribution meets exactly (top-p 0.8
// on {0.5, 0.3, ...}, min-p 0.2 of 0.5 against 0.1) would otherwise be missed or met by chance. Anything within
// this slack of the threshold counts as meeting it; 1e-6 is far above the rounding and far below any setting a
// user would tell apart.
constexpr double kProbSlack = 1e-6;

// Up to this many kept tokens, write_kept sorts them by id (a SparseDistribution lists its ids in ascending order);
// beyond it, it scatters them into a dense row and walks all n_vocab floats, an O(n_vocab) cost that an O(k log k)
// sort of a few thousand ids matches at n_vocab = 150k (a rough break-even; the two give the same list).
constexpr int kSortKeptMax = 4096;

// Below this many, std::partial_sort (a heap of `middle` elements) is fastest; above, nth_element + sort wins.
constexpr long kPartialSortMax = 256;

// A total order (logit descending, then id ascending): equal logits are ordered by id, so which tokens survive a
// cut and the order they are visited in never depend on the sort algorithm. NaNs were replaced by -inf on load, so
// this is a strict weak ordering.
struct ByLogit {
    const float* logit;
    bool operator()(int a, int b) const { return logit[a] > logit[b] || (logit[a] == logit[b] && a < b); }
};

// Puts the best (middle - first) elements of [first, last) at the front, sorted.
void select_sorted(int* first, int* middle, int* last, ByLogit cmp) {
    if (middle - first <= kPartialSortMax) {
        std::partial_sort(first, middle, last, cmp);
    } else {
        std::nth_element(first, middle - 1, last, cmp);
        std::sort(first, middle, cmp);
    }
}

// Max of n floats (no NaNs). Eight independent running maxima: one chain would be bound by max's latency, about
// four times slower at n_vocab = 150k, and the compiler may not reorder a float reduction by itself.
float max_of(const float* x, int n) {
    float m[8];
    std::fill(m, m + 8, kNegInf);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; ++k) m[k] = x[i + k] > m[k] ? x[i + k] : m[k];
    for (; i < n; ++i) m[0] = x[i] > m[0] ? x[i] : m[0];
    return *std::max_element(m, m + 8);
}

std::string fmt(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
}

}  // namespace

// ---- Sampler --------------------------------------------------------------------------------------------------

void Sampler::validate(const SamplerParams& p) {
    // Written as !(ok) so that NaN fails every check.
    if (!(p.temperature >= 0.0f) || std::isinf(p.temperature))
        throw Error("sampler: temperature must be a finite value >= 0 (0 = greedy), got " + fmt(p.temperature));
    if (p.top_k < 0) throw Error("sampler: top_k must be >= 0 (0 = off), got " + std::to_string(p.top_k));
    if (!(p.top_p > 0.0f && p.top_p <= 1.0f))
        throw Error("sampler: top_p must be in (0, 1] (1 = off), got " + fmt(p.top_p));
    if (!(p.min_p >= 0.0f && p.min_p <= 1.0f))
        throw Error("sampler: min_p must be in [0, 1] (0 = off), got " + fmt(p.min_p));
    if (!(p.repeat_penalty > 0.0f) || std::isinf(p.repeat_penalty))
        throw Error("sampler: repeat_penalty must be a finite value > 0 (1 = off), got " + fmt(p.repeat_penalty));
    if (p.repeat_last_n < 0) throw Error("sampler: repeat_last_n must be >= 0, got " + std::to_string(p.repeat_last_n));
}

Sampler::Sampler(SamplerParams params, int n_vocab) : params_(params), n_vocab_(n_vocab), noise_(params.seed) {
    validate(params_);
    if (n_vocab <= 0) throw Error("sampler: vocabulary size must be > 0, got " + std::to_string(n_vocab));
    const size_t n = static_cast<size_t>(n_vocab);
    logit_.resize(n);
    prob_.resize(n);
    ids_.resize(n);
    seen_.assign(n, 0);
    dense_.resize(n);
}

void Sampler::load_logits(const float* logits, std::span<const int> history) {
    float* l = logit_.data();
    // A NaN would break the sort's ordering; treat it as "never pick" rather than let it poison the distribution.
    for (int i = 0; i < n_vocab_; ++i) l[i] = std::isnan(logits[i]) ? kNegInf : logits[i];

    const float penalty = params_.repeat_penalty;
    if (penalty == 1.0f || params_.repeat_last_n == 0 || history.empty()) return;
    const auto window = history.last(std::min(history.size(), static_cast<size_t>(params_.repeat_last_n)));
    // Check ids first so that a throw cannot leave marks behind in seen_.
    for (int t : window)
        if (t < 0 || t >= n_vocab_)
            throw Error("sampler: token id " + std::to_string(t) + " in the history is outside the vocabulary (" +
                        std::to_string(n_vocab_) + " tokens)");
    // Each distinct token is penalised once, however often it recurs (llama.cpp's repeat penalty does the same;
    // frequency-scaled penalties are a different knob).
    for (int t : window) {
        if (seen_[t]) continue;
        seen_[t] = 1;
        l[t] = l[t] > 0.0f ? l[t] / penalty : l[t] * penalty;
    }
    for (int t : window) seen_[t] = 0;
}

int Sampler::argmax() const {
    // Two passes, the max and then the first id holding it (so the lowest id wins a tie), are faster than one
    // pass carrying an index along.
    const float* l = logit_.data();
    const float mx = max_of(l, n_vocab_);
    if (mx == kNegInf) throw Error("sampler: every logit is -inf or NaN");
    return static_cast<int>(std::find(l, l + n_vocab_, mx) - l);
}

void Sampler::top_k() {
    std::iota(ids_.begin(), ids_.end(), 0);
    const int k = params_.top_k;
    if (k > 0 && k < n_vocab_) {
        select_sorted(ids_.data(), ids_.data() + k, ids_.data() + n_vocab_, ByLogit{logit_.data()});
        n_kept_ = k;
        order_ = Order::ByLogit;
    } else {
        n_kept_ = n_vocab_;
        order_ = Order::ById;  // no sort is paid for unless top-p needs one
    }
}

void Sampler::softmax() {
    float mx = kNegInf;
    if (order_ == Order::ByLogit) {
        mx = logit_[ids_[0]];
    } else {
        assert(n_kept_ == n_vocab_);  // ById before any cut: ids_ is 0..n-1, so logit_ can be read directly
        mx = max_of(logit_.data(), n_vocab_);
    }
    if (mx == kNegInf) throw Error("sampler: every logit is -inf or NaN");
    const float temperature = params_.temperature;
    double sum = 0.0;  // double: 150k terms summed in float would lose the small ones
    for (int j = 0; j < n_kept_; ++j) {
        const int id = ids_[j];
        const float l = logit_[id];
        // l == mx short-cuts exp(0) and keeps a +inf logit from producing inf - inf = NaN.
        const float e = l == mx ? 1.0f : std::exp((l - mx) / temperature);
        prob_[id] = e;
        sum += e;
    }
    const double inv = 1.0 / sum;
    for (int j = 0; j < n_kept_; ++j) prob_[ids_[j]] = static_cast<float>(prob_[ids_[j]] * inv);
}

void Sampler::top_p() {
    // The cumulative mass is summed in 2^-62 fixed point: integer sums do not depend on the order of addition, so
    // the walk over a by-logit prefix below and the quickselect's partial sums give the identical cut, on any
    // platform. Probabilities under 2^-62 count as zero mass; they cannot move a cut. The conversion goes through
    // int64 (p * 2^62 < 2^63) because the signed one is a single instruction and the unsigned one is not.
    auto fixed = [](double p) { return static_cast<uint64_t>(static_cast<int64_t>(p * 0x1.0p62)); };
    // At least 1 so that the top token alone can satisfy it and every range searched below has positive mass.
    const uint64_t target = std::max<uint64_t>(1, fixed(std::max(0.0, params_.top_p - kProbSlack)));
    int* ids = ids_.data();
    const float* prob = prob_.data();
    const float* logit = logit_.data();
    const ByLogit better{logit};

    auto walk = [&](int lo, int hi, uint64_t need) {  // the cut within a by-logit sorted range, or hi if none
        uint64_t cum = 0;
        for (int j = lo; j < hi; ++j) {
            cum += fixed(prob[ids[j]]);
            if (cum >= need) return j + 1;
        }
        return hi;  // rounding left the total a hair short of top_p: keep the whole range
    };
    if (order_ == Order::ByLogit) {  // top-k already sorted the few candidates
        n_kept_ = walk(0, n_kept_, target);
        return;
    }

    // No top-k: rather than sort up to n_vocab candidates, quickselect on mass. Invariant: ids[0, lo) are kept and
    // better than everything in [lo, hi), the cut lies in [lo, hi), and `need` is the mass still missing. Expected
    // O(n); a deterministic pivot and a pass budget (then a sort) bound the worst case, and since the result is the
    // unique cut of the total order, no library's nth_element can change it.
    //
    // First drop every candidate below eps = (1 - top_p) / n: together they hold less than 1 - top_p of the mass,
    // so the rest holds more than top_p (minus float rounding, ~6e-8, well inside kProbSlack) and the cut lies among
    // them. A peaked row, the usual case, keeps only a handful, and the quickselect then has almost nothing to do.
    const double eps = (1.0 - static_cast<double>(params_.top_p)) / n_kept_;
    int hi = 0;
    for (int j = 0; j < n_kept_; ++j) {
        const int x = ids[j];
        ids[hi] = x;
        hi += static_cast<double>(prob[x]) >= eps;  // branchless compaction: ids stay in id order
    }
    int lo = 0;
    uint64_t need = target;
    for (int budget = 64; hi - lo > 32 && budget > 0; --budget) {
        int* a = ids + lo;
        int* b = ids + lo + (hi - lo) / 2;
        int* c = ids + hi - 1;
        if (better(*b, *a)) std::swap(*a, *b);  // median of three into *b
        if (better(*c, *b)) std::swap(*b, *c);
        if (better(*b, *a)) std::swap(*a, *b);
        std::swap(*b, ids[hi - 1]);
        const int pivot = ids[hi - 1];
        const float pivot_logit = logit[pivot];
        int split = lo;
        uint64_t mass = 0;  // of the candidates better than the pivot
        // Branchless Lomuto: the better/worse test is a coin flip here, so a branch would mispredict half the time.
        // Positions [split, j) hold worse candidates; swapping unconditionally and advancing split only for a better
        // one keeps that true either way.
        for (int j = lo; j < hi - 1; ++j) {
            const int x = ids[j];
            const float lx = logit[x];
            const bool is_better = (lx > pivot_logit) | ((lx == pivot_logit) & (x < pivot));
            ids[j] = ids[split];
            ids[split] = x;
            split += is_better;
            mass += fixed(prob[x]) & (0 - static_cast<uint64_t>(is_better));
        }
        std::swap(ids[split], ids[hi - 1]);  // pivot between the better and the worse
        if (mass >= need) {
            hi = split;  // need >= 1, so mass >= 1 and [lo, split) is not empty
        } else if (mass + fixed(prob[pivot]) >= need) {
            n_kept_ = split + 1;
            order_ = Order::None;
            return;
        } else {
            need -= mass + fixed(prob[pivot]);
            lo = split + 1;
        }
    }
    std::sort(ids + lo, ids + hi, better);
    n_kept_ = walk(lo, hi, need);
    order_ = lo == 0 ? Order::ByLogit : Order::None;
}

void Sampler::min_p() {
    int* ids = ids_.data();
    float pmax = 0.0f;
    if (order_ == Order::ByLogit) {
        pmax = prob_[ids[0]];
    } else {
        for (int j = 0; j < n_kept_; ++j) pmax = std::max(pmax, prob_[ids[j]]);
    }
    const double threshold = static_cast<double>(params_.min_p) * pmax * (1.0 - kProbSlack);
    if (order_ == Order::ByLogit) {
        // Probabilities fall along a by-logit order, so the kept set is a prefix; the top token always passes.
        int j = 1;
        while (j < n_kept_ && prob_[ids[j]] >= threshold) ++j;
        n_kept_ = j;
    } else {
        int w = 0;  // in-place stable compaction keeps an id order
        for (int j = 0; j < n_kept_; ++j)
            if (prob_[ids[j]] >= threshold) ids[w++] = ids[j];
        n_kept_ = w;
    }
}

void Sampler::renormalise() {
    double sum = 0.0;
    for (int j = 0; j < n_kept_; ++j) sum += prob_[ids_[j]];
    const double inv = 1.0 / sum;  // sum > 0: the max-logit token is always kept with probability 1/softmax_sum
    for (int j = 0; j < n_kept_; ++j) prob_[ids_[j]] = static_cast<float>(prob_[ids_[j]] * inv);
}

void Sampler::prepare(const float* logits, std::span<const int> history) {
    load_logits(logits, history);
    if (params_.temperature == 0.0f) {
        // Greedy: top-k, top-p and min-p all keep the argmax, so only the penalty can change the answer.
        ids_[0] = argmax();
        prob_[ids_[0]] = 1.0f;
        n_kept_ = 1;
        order_ = Order::ByLogit;
        return;
    }
    top_k();
    transform();
}

int Sampler::load_candidates(const CandidateRow& row, std::span<const int> history) {
    if (row.top_logits.size() != row.top_ids.size() || row.extra_logits.size() != row.extra_ids.size())
        throw Error("sampler: candidate ids and logits differ in number");
    int n = 0;
    uint8_t* seen = seen_.data();
    // Marks: 1 = a candidate, 2 = a candidate already penalised. Cleared on every exit, a throw included.
    struct ClearMarks {
        uint8_t* seen;
        const int* ids;
        const int& n;
        ~ClearMarks() {
            for (int j = 0; j < n; ++j) seen[ids[j]] = 0;
        }
    } clear{seen, ids_.data(), n};
    auto add = [&](int id, float v) {
        if (id < 0 || id >= n_vocab_)
            throw Error("sampler: candidate id " + std::to_string(id) + " is outside the vocabulary (" +
                        std::to_string(n_vocab_) + " tokens)");
        if (seen[id]) return;
        seen[id] = 1;
        logit_[static_cast<size_t>(id)] = std::isnan(v) ? kNegInf : v;
        ids_[static_cast<size_t>(n++)] = id;
    };
    for (size_t j = 0; j < row.top_ids.size(); ++j) add(row.top_ids[j], row.top_logits[j]);
    for (size_t j = 0; j < row.extra_ids.size(); ++j) add(row.extra_ids[j], row.extra_logits[j]);

    const float penalty = params_.repeat_penalty;
    if (penalty == 1.0f || params_.repeat_last_n == 0 || history.empty()) return n;
    const auto window = history.last(std::min(history.size(), static_cast<size_t>(params_.repeat_last_n)));
    for (int t : window) {  // as load_logits: each distinct token once
        if (t < 0 || t >= n_vocab_)
            throw Error("sampler: token id " + std::to_string(t) + " in the history is outside the vocabulary (" +
                        std::to_string(n_vocab_) + " tokens)");
        if (!seen[t])
            throw Error("sampler: the candidates lack token " + std::to_string(t) + " of the repeat penalty's window");
        if (seen[t] == 2) continue;
        seen[t] = 2;
        float& l = logit_[static_cast<size_t>(t)];
        l = l > 0.0f ? l / penalty : l * penalty;
    }
    return n;
}

void Sampler::prepare(const CandidateRow& row, std::span<const int> history) {
    const int n = load_candidates(row, history);
    int* ids = ids_.data();
    const float* l = logit_.data();
    if (params_.temperature == 0.0f) {
        // argmax(): the largest logit, the lowest id holding it. Every id outside the candidates is beaten by one
        // inside (plan_candidates), so this is the whole row's pick.
        if (n == 0) throw Error("sampler: no candidates");
        int best = ids[0];
        for (int j = 1; j < n; ++j)
            if (l[ids[j]] > l[best] || (l[ids[j]] == l[best] && ids[j] < best)) best = ids[j];
        if (l[best] == kNegInf) throw Error("sampler: every logit is -inf or NaN");
        ids[0] = best;
        prob_[static_cast<size_t>(best)] = 1.0f;
        n_kept_ = 1;
        order_ = Order::ByLogit;
        return;
    }
    const int k = params_.top_k;
    if (!(k > 0 && k < n_vocab_) || n < k)
        throw Error("sampler: candidates serve a top-k below the vocabulary size, with at least k of them (k = " +
                    std::to_string(k) + ", " + std::to_string(n) + " candidates)");
    // top_k()'s cut among the candidates: the same total order, so the same k ids in the same order.
    select_sorted(ids, ids + k, ids + n, ByLogit{l});
    n_kept_ = k;
    order_ = Order::ByLogit;
    transform();
}

void Sampler::transform() {
    softmax();
    if (params_.top_p < 1.0f) top_p();
    if (params_.min_p > 0.0f) min_p();
    renormalise();
}

void Sampler::write_kept(float* probs) const {
    std::fill(probs, probs + n_vocab_, 0.0f);
    for (int j = 0; j < n_kept_; ++j) probs[ids_[j]] = prob_[ids_[j]];
}

void Sampler::write_kept(SparseDistribution& out) {
    out.ids.clear();
    out.probs.clear();
    if (order_ != Order::ById && n_kept_ <= kSortKeptMax) {
        std::sort(ids_.begin(), ids_.begin() + n_kept_);
        order_ = Order::ById;
    }
    if (order_ == Order::ById) {
        out.ids.assign(ids_.begin(), ids_.begin() + n_kept_);
        out.probs.resize(static_cast<size_t>(n_kept_));
        for (int j = 0; j < n_kept_; ++j) out.probs[static_cast<size_t>(j)] = prob_[ids_[j]];
        return;
    }
    // Too many to sort (no top-k): put in id order through a dense row. Zero probabilities drop out.
    std::fill(dense_.begin(), dense_.end(), 0.0f);
    for (int j = 0; j < n_kept_; ++j) dense_[ids_[j]] = prob_[ids_[j]];
    for (int i = 0; i < n_vocab_; ++i)
        if (dense_[i] != 0.0f) {
            out.ids.push_back(i);
            out.probs.push_back(dense_[i]);
        }
}

void Sampler::distribution(const float* logits, std::span<const int> history, SparseDistribution& out) {
    prepare(logits, history);
    write_kept(out);
}

void Sampler::distribution(const CandidateRow& row, std::span<const int> history, SparseDistribution& out) {
    prepare(row, history);
    write_kept(out);
}

void Sampler::distribution(const float* logits, std::span<const int> history, float* probs) {
    prepare(logits, history);
    write_kept(probs);
}

void Sampler::distribution(const CandidateRow& row, std::span<const int> history, float* probs) {
    prepare(row, history);
    write_kept(probs);
}

int Sampler::sample(const float* logits, std::span<const int> history, int64_t position) {
    prepare(logits, history);
    return pick(position);
}

int Sampler::sample(const CandidateRow& row, std::span<const int> history, int64_t position) {
    prepare(row, history);
    return pick(position);
}

int Sampler::pick(int64_t position) const {
    if (params_.temperature == 0.0f) return ids_[0];
    // gumbel_max over the kept set, without write_kept's sort: GumbelArgmax's pick does not depend on the order.
    GumbelArgmax argmax(noise_, position, NoiseUse::Token);
    for (int j = 0; j < n_kept_; ++j) argmax.offer(ids_[j], prob_[ids_[j]]);
    return argmax.pick();
}

float SparseDistribution::at(int id) const {
    const auto it = std::lower_bound(ids.begin(), ids.end(), id);
    return it != ids.end() && *it == id ? probs[static_cast<size_t>(it - ids.begin())] : 0.0f;
}

}  // namespace tandem
