// tandem-sampler-bench: host time per sampled token for one row of logits, three ways, in alternation on the same
// rows: the Sampler on the whole row (what a backend handing out rows costs), the host selection of the row's
// candidates plus the Sampler on them (Backend's default forward_candidates, the CPU backend's path), and the
// Sampler on candidates alone (what remains on the host when a GPU selects them). Then the distribution that
// speculative verification reads per row, from the candidates: dense (n_vocab floats written) against sparse. Prints medians of --reps:
//   tandem-sampler-bench [--vocab 151936] [--top-k 40] [--repeat-penalty 1.0] [--repeat-last-n 64] [--reps 300]
// Rows are normal logits (sigma 3) with a peaked head, redrawn every repetition; the history is random ids.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "common/bench_util.h"
#include "sample/candidates.h"
#include "error.h"
#include "sample/sampler.h"

using namespace tandem;

using bench::median;

int main(int argc, char** argv) {
    int vocab = 151936, reps = 300;
    SamplerParams params;
    CLI::App app{"tandem-sampler-bench: host time per sampled token, whole rows against candidates"};
    app.add_option("--vocab", vocab, "vocabulary size")->capture_default_str()->check(CLI::Range(2, 1 << 24));
    app.add_option("--top-k", params.top_k, "top-k (candidates need 0 < k < vocab)")->capture_default_str();
    app.add_option("--temp", params.temperature, "temperature")->capture_default_str();
    app.add_option("--repeat-penalty", params.repeat_penalty, "repeat penalty")->capture_default_str();
    app.add_option("--repeat-last-n", params.repeat_last_n, "penalty window")->capture_default_str();
    app.add_option("--reps", reps, "timed rows (the median is shown)")->capture_default_str()->check(CLI::Range(1, 1 << 20));
    CLI11_PARSE(app, argc, argv);
    try {
        Sampler::validate(params);
        std::mt19937 rng(1);
        std::normal_distribution<float> normal(0.0f, 3.0f);
        std::vector<int> history;
        for (int i = 0; i < 300; ++i) history.push_back(static_cast<int>(rng() % static_cast<unsigned>(vocab)));
        const size_t window_len = std::min(history.size(), static_cast<size_t>(params.repeat_last_n));
        const std::span<const int> window = std::span<const int>(history).last(window_len);
        std::vector<int> extra;
        const int k = plan_candidates(params, vocab, window, extra);
        if (k == 0) throw Error("these settings need whole rows (plan_candidates returned 0)");
        Sampler whole(params, vocab), selected(params, vocab), given(params, vocab);
        std::vector<float> row(static_cast<size_t>(vocab)), top(static_cast<size_t>(k)), extra_logits(extra.size());
        std::vector<int> top_ids(static_cast<size_t>(k));
        std::vector<double> t_whole, t_selected, t_given, t_dense_dist, t_sparse_dist;
        std::vector<float> dense_probs(static_cast<size_t>(vocab));
        SparseDistribution sparse_probs;
        using Clock = std::chrono::steady_clock;
        auto us = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count() * 1e6; };
        long sink = 0;
        for (int r = 0; r < reps; ++r) {
            for (float& x : row) x = normal(rng);
            for (int j = 0; j < 8; ++j) row[rng() % row.size()] = 14.0f + static_cast<float>(j);
            const Clock::time_point t0 = Clock::now();
            sink += whole.sample(row.data(), history, r);
            const Clock::time_point t1 = Clock::now();
            select_top_candidates(row.data(), row.size(), k, top.data(), top_ids.data());
            for (size_t j = 0; j < extra.size(); ++j) extra_logits[j] = row[static_cast<size_t>(extra[j])];
            sink += selected.sample(CandidateRow{top, top_ids, extra, extra_logits}, history, r);
            const Clock::time_point t2 = Clock::now();
            sink += given.sample(CandidateRow{top, top_ids, extra, extra_logits}, history, r);
            const Clock::time_point t3 = Clock::now();
            given.distribution(CandidateRow{top, top_ids, extra, extra_logits}, history, dense_probs.data());
            const Clock::time_point t4 = Clock::now();
            given.distribution(CandidateRow{top, top_ids, extra, extra_logits}, history, sparse_probs);
            const Clock::time_point t5 = Clock::now();
            sink += static_cast<long>(sparse_probs.ids.size()) + (dense_probs[0] > 0.5f);
            t_dense_dist.push_back(us(t3, t4));
            t_sparse_dist.push_back(us(t4, t5));
            t_whole.push_back(us(t0, t1));
            t_selected.push_back(us(t1, t2));
            t_given.push_back(us(t2, t3));
        }
        std::printf("vocab %d, top-k %d, penalty %g over %zu tokens: %d candidates per row (%zu extra)\n", vocab,
                    params.top_k, static_cast<double>(params.repeat_penalty), window_len, k, extra.size());
        std::printf("whole row                  %8.1f us\n", median(t_whole));
        std::printf("host selection + sampler   %8.1f us\n", median(t_selected));
        std::printf("sampler on candidates      %8.1f us\n", median(t_given));
        std::printf("dense distribution (cand)  %8.1f us\n", median(t_dense_dist));
        std::printf("sparse distribution (cand) %8.1f us\n", median(t_sparse_dist));
        std::fprintf(stderr, "(checksum %ld)\n", sink);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "tandem-sampler-bench: %s\n", e.what());
        return 1;
    }
    return 0;
}
