// Logit rows given by their candidates instead of all n_vocab values. A sampler with top-k (or a greedy one with a
// repeat penalty) reads only a row's best logits and the logits of its penalty window, so a GPU backend can select
// those on the device and copy back a few hundred numbers instead of a 150k-float row (Backend::forward_candidates).
//   - plan_candidates: how many best logits rows need, and which extra ids, for a Sampler's picks from them to be
//     exactly its picks from the whole rows.
//   - select_top_candidates: the host selection (Backend's default forward_candidates; the reference that
//     kernels/sampling.cu's top_k is tested against).
//   - CandidateRow: one row's candidates, what Sampler::sample / distribution take in place of the row.
#pragma once
#include <cstddef>
#include <span>
#include <vector>

namespace tandem {

struct SamplerParams;

// The most best logits a row's candidates may hold (cuda::kTopKMax, the device selection's limit). Enough for the
// default sampler (top-k 40 beside a penalty window of up to 64 distinct ids); larger settings take whole rows.
constexpr int kMaxCandidates = 256;

// One row's candidates: its best logits by Sampler's order (larger logit first, the lower id on ties; a NaN counts
// as -inf), with their ids, and the raw logits of further ids (a penalty window's; any order, repeats and ids
// already among the best allowed).
struct CandidateRow {
    std::span<const float> top_logits;
    std::span<const int> top_ids;
    std::span<const int> extra_ids;
    std::span<const float> extra_logits;
};

// What rows must carry for a Sampler with `params` over `n_vocab` ids to pick from their candidates exactly as from
// the whole rows: returns the number of best logits per row, and sets `extra_ids` to the distinct ids of `window`,
// the tokens any of the rows' repeat-penalty windows can reach (one row: its history's last repeat_last_n tokens;
// verification of n drafts: the last repeat_last_n + n tokens of history and drafts); empty without a penalty.
// 0 when candidates cannot serve these settings (no top-k or a top-k of the whole vocabulary, more than
// kMaxCandidates needed, or a window over 4096 tokens): then whole rows are needed.
//
// Why top-k + |window| best logits suffice: the penalty changes only the window's logits, which are carried as
// extras. Any other id that is among the k best after the penalty is beaten by fewer than k ids outside the window
// (their logits are unchanged), so before the penalty by fewer than k + |window| ids. Greedy is top-k with k = 1.
int plan_candidates(const SamplerParams& params, int n_vocab, std::span<const int> window, std::vector<int>& extra_ids);

// The k best logits of row[0, n) by Sampler's order, best first, into logits[0, k) (NaN written as -inf) and
// ids[0, k). 1 <= k <= n.
void select_top_candidates(const float* row, size_t n, int k, float* logits, int* ids);

}  // namespace tandem
