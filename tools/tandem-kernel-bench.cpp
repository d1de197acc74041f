// tandem-kernel-bench: throughput of the integer (8-bit activation) matmul kernels of quant_q8.h, each variant the
// CPU runs (scalar, AVX2, AVX-512 VNNI) on the same random weights and activations, so that a kernel change can be
// measured without a model. For each type and token count it times dot_rows over a rows x cols matrix (activations
// quantized beforehand, as matmul does once per call) and prints the median of R timed runs after one warm-up:
//   tandem-kernel-bench [--types q4_k,q6_k] [--tokens 1,8,64,512] [--rows 4096] [--cols 4096] [--reps 5]
//                       [--threads 1] [--scalar] [--variants avx2,avx512]
// Variants take turns within each repetition. One thread is timed by its CPU time (--wall for the wall clock), so
// that preemption on a shared machine does not count; cache and memory contention still do, hence the min column.
// GMAC/s counts rows * cols * tokens multiply-adds; weight GB/s is the matrix bytes over the time (the weights are
// read from memory once per call, whatever the token count, so this is the decode figure that matters).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "common/bench_util.h"
#include "cpu/quant_q8.h"
#include "cpu/repack.h"
#include "cpu/thread_pool.h"
#include "gguf/ggml_types.h"

namespace {

using namespace tandem;
using Clock = std::chrono::steady_clock;
using bench::median;
using bench::random_matrix;
using bench::split_list;

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"tandem-kernel-bench: integer matmul kernel throughput (scalar / AVX2 / AVX-512 VNNI)"};
    std::string types_arg, tokens_arg = "1,8,64,512", variants_arg = "avx2,avx512,repacked";
    int64_t rows = 4096, cols = 4096;
    int reps = 5, threads = 1;
    bool scalar = false, wall = false;
    unsigned seed = 1;
    app.add_option("--types", types_arg, "comma-separated weight types (default: all ten integer types)");
    app.add_option("--tokens", tokens_arg, "comma-separated token counts")->capture_default_str();
    app.add_option("--rows", rows, "weight rows")->capture_default_str()->check(CLI::PositiveNumber);
    app.add_option("--cols", cols, "weight columns (a multiple of 256 for the k-quants)")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--reps", reps, "timed runs per figure (the median is shown)")->capture_default_str()->check(
        CLI::PositiveNumber);
    app.add_option("-t,--threads", threads, "threads splitting the rows (as matmul does)")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--variants", variants_arg, "which of avx2, avx512, repacked (RepackedMatrix, where the type has one) to run")->capture_default_str();
    app.add_flag("--scalar", scalar, "also time the portable scalar kernel (slow)");
    app.add_flag("--wall", wall, "time one thread by the wall clock instead of its CPU time");
    app.add_option("--seed", seed, "random seed")->capture_default_str();
    CLI11_PARSE(app, argc, argv);

    std::vector<GgmlType> types;
    if (types_arg.empty()) {
        types.assign(std::begin(bench::kBlockTypes), std::end(bench::kBlockTypes));
    } else {
        for (const std::string& name : split_list(types_arg)) {
            const auto t = ggml_type_from_name(name);
            if (!t || !cpu::find_q8_kernels(*t)) {
                std::fprintf(stderr, "unknown or non-integer type: %s\n", name.c_str());
                return 1;
            }
            types.push_back(*t);
        }
    }
    std::vector<int64_t> token_counts;
    for (const std::string& s : split_list(tokens_arg)) token_counts.push_back(std::stoll(s));
    const std::vector<std::string> variants = split_list(variants_arg);
    auto wanted = [&](const char* v) { return std::find(variants.begin(), variants.end(), v) != variants.end(); };
    const int64_t max_tokens = *std::max_element(token_counts.begin(), token_counts.end());

    cpu::ThreadPool pool(threads);
    std::mt19937 rng(seed);
    // One thread: the thread's CPU time, which time spent preempted by other processes does not inflate (the
    // machines this runs on are shared); more threads: wall-clock time.
    const bool cpu_time = threads == 1 && !wall;
    auto now = [cpu_time] {
        if (cpu_time) {
            timespec ts;
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
            return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
        }
        return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
    };
    std::printf("rows %lld, cols %lld, threads %d, %s, median (GMAC/s, GB/s) and min of %d runs\n\n",
                static_cast<long long>(rows), static_cast<long long>(cols), threads,
                cpu_time ? "thread CPU time" : "wall time", reps);
    std::printf("| type | tokens | variant |       ms |   min ms |  GMAC/s | weight GB/s |\n");
    std::printf("|------|-------:|---------|---------:|---------:|--------:|------------:|\n");
    for (GgmlType type : types) {
        const cpu::Q8TypeKernels* k = cpu::find_q8_kernels(type);
        const int64_t bs = std::max<int64_t>(ggml_type_info(type).block_size, cpu::act_block_size(k->act));
        if (cols % bs != 0) {
            std::fprintf(stderr, "%s: cols %lld is not a multiple of %lld, skipped\n", ggml_type_name(type),
                         static_cast<long long>(cols), static_cast<long long>(bs));
            continue;
        }
        const std::vector<uint8_t> W = random_matrix(type, rows, cols, rng);
        const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(cols));
        const size_t xs = cpu::act_row_bytes(k->act, cols);
        std::vector<uint8_t> xq(xs * static_cast<size_t>(max_tokens));
        {
            std::normal_distribution<float> normal(0.0f, 1.0f);
            std::vector<float> x(static_cast<size_t>(cols));
            for (int64_t t = 0; t < max_tokens; ++t) {
                for (float& v : x) v = normal(rng);
                cpu::quantize_activations(k->act, x.data(), xq.data() + t * xs, cols);
            }
        }
        // A variant computes y for rows [begin, end) of n tokens; the repacked one works in whole row groups, and the
        // threads split groups (as matmul does for a repacked matrix).
        using RunFn = std::function<void(int64_t n, float* y)>;
        std::vector<std::pair<const char*, RunFn>> fns;
        auto rows_variant = [&](cpu::DotRowsQ8Fn fn) {
            return [&, fn](int64_t n, float* y) {
                auto part = [&](int64_t begin, int64_t end, int) {
                    fn(W.data(), row_bytes, cols, begin, end, xq.data(), xs, n, y, rows);
                };
                threads == 1 ? part(0, rows, 0) : pool.parallel_for(rows, part);
            };
        };
        if (scalar) fns.emplace_back("scalar", rows_variant(k->dot_rows_scalar));
        if (wanted("avx2") && k->dot_rows_avx2) fns.emplace_back("avx2", rows_variant(k->dot_rows_avx2));
        if (wanted("avx512") && k->dot_rows_avx512) fns.emplace_back("avx512", rows_variant(k->dot_rows_avx512));
        std::unique_ptr<cpu::RepackedMatrix> repacked;
        if (wanted("repacked") && cpu::RepackedMatrix::available(type)) {
            repacked = std::make_unique<cpu::RepackedMatrix>(type, W.data(), cols, rows, pool);
            fns.emplace_back("repacked", [&](int64_t n, float* y) {
                auto part = [&](int64_t begin, int64_t end, int) {
                    repacked->dot_groups(begin, end, xq.data(), xs, n, y, rows);
                };
                threads == 1 ? part(0, repacked->n_groups(), 0) : pool.parallel_for(repacked->n_groups(), part);
            });
        }
        for (int64_t n : token_counts) {
            std::vector<float> y(static_cast<size_t>(rows * n));
            auto run = [&](const RunFn& fn) { fn(n, y.data()); };
            // The variants take turns within each repetition, so that a burst of load from elsewhere on the machine
            // falls on all of them rather than on whichever was running.
            std::vector<std::vector<double>> times(fns.size());
            for (const auto& f : fns) run(f.second);  // warm-up: page faults, caches, the pool's threads
            for (int r = 0; r < reps; ++r)
                for (size_t v = 0; v < fns.size(); ++v) {
                    const double t0 = now();
                    run(fns[v].second);
                    times[v].push_back(now() - t0);
                }
            for (size_t v = 0; v < fns.size(); ++v) {
                const double s = median(times[v]);
                const double best = *std::min_element(times[v].begin(), times[v].end());
                const double macs = static_cast<double>(rows) * static_cast<double>(cols) * static_cast<double>(n);
                std::printf("| %-4s | %6lld | %-7s | %8.3f | %8.3f | %7.2f | %11.2f |\n", ggml_type_name(type),
                            static_cast<long long>(n), fns[v].first, s * 1e3, best * 1e3, macs / s * 1e-9,
                            static_cast<double>(W.size()) / s * 1e-9);
                std::fflush(stdout);
            }
        }
    }
    return 0;
}
