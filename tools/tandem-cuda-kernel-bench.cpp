// tandem-cuda-kernel-bench: time per launch and weight bandwidth of the CUDA matvec kernels (kernels.h), fp32 and
// 8-bit activations with direct, staged, split and persistent loads side by side, for each block type, shape and
// token count, beside the device's own copy bandwidth; then the prefill GEMM's two routes on the same matrices: a kernel change
// measured on a lent GPU in seconds, without a model.
//   tandem-cuda-kernel-bench [--types q4_0,q4_k] [--shapes 4096x4096,11008x4096] [--tokens 1,4,5,16]
//                            [--acts f32,int8] [--loads direct,staged,split,persistent] [--launches 40] [--reps 7]
//                            [--rotate-mib 256] [--copy-mib 512] [--gemm-tokens 512]
// An int8 launch is the activations' quantize_activations and the matvec, as the backend runs them.
// Each figure: `launches` matvecs captured in one CUDA graph and replayed (so the GPU runs them back to back, with
// no host launch cost between them), the wall time of a replay divided by `launches`, the median of `reps`
// replays after a warm-up. The launches cycle through copies of the matrix filling --rotate-mib, so that the
// weights come from memory and not from the L2 cache (50 MB on an H100), as in a model's decode step. Copy
// bandwidth: a device-to-device copy of --copy-mib, counted as read + write (2 x bytes / time).
// GEMM (--gemm-tokens, 0: none): a prefill chunk of that many tokens through the fp16 route as the backend runs it
// (convert_f16 of x, then gemm_via_f16: the matrix dequantized to an fp16 tile and cuBLAS on a GPU) and through
// the int8 tensor-core route (quantize_activations to Q8_1, then gemm_q8), the median of `reps` runs of `launches`
// calls each (no graph: cuBLAS picks its kernels per call), in µs per call and TFLOP/s (2 rows cols tokens).
// Without nvcc the tool is built on the CUDA emulation, where it runs (slowly) and its figures mean nothing.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <iterator>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/bench_util.h"
#include "device.h"
#include "gguf/ggml_types.h"
#include "kernels.h"

namespace {

using namespace tandem;
using Clock = std::chrono::steady_clock;

using bench::kBlockTypes;

struct Shape {
    int rows, cols;
};

// Seconds of one run of `work` followed by a stream synchronize: the median of `reps` after one warm-up.
template <class Work>
double time_median(int reps, cuda::Stream stream, Work&& work) {
    work();
    cuda::stream_synchronize(stream);
    std::vector<double> runs;
    for (int r = 0; r < reps; ++r) {
        const auto t0 = Clock::now();
        work();
        cuda::stream_synchronize(stream);
        runs.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return bench::median(runs);
}

double copy_bandwidth(size_t bytes, int reps, cuda::Stream stream) {
    cuda::DeviceBuffer a(bytes), b(bytes);
    cuda::device_memset(a.get(), 1, bytes, stream);
    const double s = time_median(reps, stream, [&] { cuda::copy_on_device(b.get(), a.get(), bytes, stream); });
    return 2.0 * static_cast<double>(bytes) / s / 1e9;
}

// One row per route of the prefill GEMM for `type` at `shape` and `n` tokens, appended to `table` (printed after
// the matvec table). W: the matrix (one copy), x: n x cols floats.
void bench_gemm(GgmlType type, const Shape& shape, int n, const uint8_t* W, const float* x, int launches, int reps,
                cuda::BlasHandle* blas, cuda::Stream stream, std::string& table) {
    const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(shape.cols));
    // The backend's tile: the matrix, capped at 16 Mi halves (CudaBackend::kBlasTileHalves, which this tool, built
    // without the backend on the emulation, cannot name).
    const size_t tile_halves = std::min(static_cast<size_t>(shape.rows) * shape.cols, size_t{16} << 20);
    cuda::DeviceBuffer x16(static_cast<size_t>(n) * shape.cols * 2), tile(tile_halves * 2);
    cuda::DeviceBuffer xq(cuda::q8_activation_row_bytes(GgmlType::Q8_0, shape.cols) * n);
    cuda::DeviceBuffer y(static_cast<size_t>(n) * shape.rows * 4);
    const double flops = 2.0 * shape.rows * shape.cols * n;
    const auto fp16_route = [&] {
        cuda::convert_f16(x, static_cast<size_t>(n) * shape.cols, x16.as<uint16_t>(), stream);
        cuda::gemm_via_f16(blas, type, W, row_bytes, shape.rows, shape.cols, x, x16.as<uint16_t>(), n, y.as<float>(),
                           tile.as<uint16_t>(), tile_halves, stream);
    };
    const auto int8_route = [&] {
        cuda::quantize_activations(GgmlType::Q8_0, x, shape.cols, n, xq.get(), stream);
        cuda::gemm_q8(type, W, row_bytes, shape.rows, shape.cols, xq.get(), n, y.as<float>(), stream);
    };
    double fp16_us = 0.0;
    for (bool int8 : {false, true}) {
        if (int8 && !cuda::gemm_q8_supports(type)) continue;
        const double us = 1e6 * time_median(reps, stream, [&] {
                              for (int i = 0; i < launches; ++i) int8 ? int8_route() : fp16_route();
                          }) / launches;
        if (!int8) fp16_us = us;
        char vs[16] = "-";
        if (int8) std::snprintf(vs, sizeof vs, "%.2fx", fp16_us / us);
        char row[160];
        std::snprintf(row, sizeof row, "| %s | %d x %d | %d | %s | %.1f | %.1f | %s |\n", ggml_type_name(type),
                      shape.rows, shape.cols, n, int8 ? "int8 tensor-core" : (blas ? "fp16 cuBLAS" : "fp16 SIMT"), us,
                      flops / (us * 1e-6) / 1e12, vs);
        table += row;
    }
}

// A count in lo..hi, or nothing.
std::optional<int> parse_count(const std::string& s, int lo, int hi) {
    try {
        const int n = std::stoi(s);
        if (n >= lo && n <= hi) return n;
    } catch (const std::exception&) {
    }
    return std::nullopt;
}

std::optional<Shape> parse_shape(const std::string& s) {
    const size_t x = s.find('x');
    if (x == std::string::npos) return std::nullopt;
    try {
        const int rows = std::stoi(s.substr(0, x)), cols = std::stoi(s.substr(x + 1));
        if (rows > 0 && cols > 0) return Shape{rows, cols};
    } catch (const std::exception&) {
    }
    return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"tandem-cuda-kernel-bench: CUDA matvec time per launch and weight bandwidth, by activations and loads"};
    std::string types_arg = "q4_0,q4_k,q8_0,q6_k,q5_k", shapes_arg = "4096x4096,11008x4096,4096x11008,1536x1536,8960x1536";
    std::string tokens_arg = "1,4,5,16", loads_arg = "direct,staged,split,persistent", acts_arg = "f32,int8";
    std::string gemm_tokens_arg = "512";
    int launches = 40, reps = 7, rotate_mib = 256, copy_mib = 512;
    unsigned seed = 1;
    app.add_option("--types", types_arg, "comma-separated block types (q4_0 q4_1 q5_0 q5_1 q8_0 q2_k..q6_k)")
        ->capture_default_str();
    app.add_option("--shapes", shapes_arg, "comma-separated ROWSxCOLS")->capture_default_str();
    app.add_option("--tokens", tokens_arg, "comma-separated token counts (1..16)")->capture_default_str();
    app.add_option("--loads", loads_arg, "which of direct, staged, split, persistent")->capture_default_str();
    app.add_option("--acts", acts_arg, "which activations: f32, int8 (quantized per launch, dp4a)")
        ->capture_default_str();
    app.add_option("--launches", launches, "matvecs per timed graph replay")->capture_default_str()->check(
        CLI::Range(1, 10000));
    app.add_option("--reps", reps, "timed replays (the median is shown)")->capture_default_str()->check(
        CLI::Range(1, 1000));
    app.add_option("--rotate-mib", rotate_mib, "MiB of matrix copies the launches cycle through (0: one copy)")
        ->capture_default_str()
        ->check(CLI::Range(0, 1 << 16));
    app.add_option("--copy-mib", copy_mib, "MiB copied for the device's copy bandwidth (0: skip)")
        ->capture_default_str()
        ->check(CLI::Range(0, 1 << 16));
    app.add_option("--gemm-tokens", gemm_tokens_arg, "comma-separated prefill chunk sizes for the GEMM table (0: none)")
        ->capture_default_str();
    app.add_option("--seed", seed, "random seed")->capture_default_str();
    CLI11_PARSE(app, argc, argv);

    std::vector<GgmlType> types;
    for (const std::string& name : bench::split_list(types_arg)) {
        const auto t = ggml_type_from_name(name);
        if (!t || std::find(std::begin(kBlockTypes), std::end(kBlockTypes), *t) == std::end(kBlockTypes)) {
            std::fprintf(stderr, "tandem-cuda-kernel-bench: not a block type matvec runs: %s\n", name.c_str());
            return 2;
        }
        types.push_back(*t);
    }
    std::vector<Shape> shapes;
    for (const std::string& s : bench::split_list(shapes_arg)) {
        const auto shape = parse_shape(s);
        if (!shape) {
            std::fprintf(stderr, "tandem-cuda-kernel-bench: --shapes wants ROWSxCOLS, got '%s'\n", s.c_str());
            return 2;
        }
        shapes.push_back(*shape);
    }
    std::vector<int> tokens;
    for (const std::string& s : bench::split_list(tokens_arg)) {
        const auto n = parse_count(s, 1, cuda::kMatvecMaxTokens);
        if (!n) {
            std::fprintf(stderr, "tandem-cuda-kernel-bench: token counts are 1..%d, got '%s'\n",
                         cuda::kMatvecMaxTokens, s.c_str());
            return 2;
        }
        tokens.push_back(*n);
    }
    std::vector<int> gemm_tokens;
    for (const std::string& s : bench::split_list(gemm_tokens_arg)) {
        const auto n = parse_count(s, 0, 65536);
        if (!n) {
            std::fprintf(stderr, "tandem-cuda-kernel-bench: --gemm-tokens are 0..65536, got '%s'\n", s.c_str());
            return 2;
        }
        if (*n > 0) gemm_tokens.push_back(*n);
    }
    std::vector<cuda::MatvecLoads> loads;
    for (const std::string& s : bench::split_list(loads_arg)) {
        const auto known = std::begin(cuda::kAllMatvecLoads), known_end = std::end(cuda::kAllMatvecLoads);
        const auto l = std::find_if(known, known_end, [&](auto k) { return s == cuda::matvec_loads_name(k); });
        if (l == known_end) {
            std::fprintf(stderr, "tandem-cuda-kernel-bench: --loads takes direct, staged, split, persistent, got '%s'\n",
                         s.c_str());
            return 2;
        }
        loads.push_back(*l);
    }
    std::vector<bool> int8_acts;
    for (const std::string& s : bench::split_list(acts_arg)) {
        if (s != "f32" && s != "int8") {
            std::fprintf(stderr, "tandem-cuda-kernel-bench: --acts takes f32 and/or int8, got '%s'\n", s.c_str());
            return 2;
        }
        int8_acts.push_back(s == "int8");
    }
    if (types.empty() || shapes.empty() || tokens.empty() || loads.empty() || int8_acts.empty()) {
        std::fprintf(stderr, "tandem-cuda-kernel-bench: nothing to run\n");
        return 2;
    }
    std::string why;
    if (cuda::device_count(&why) < 1) {
        std::fprintf(stderr, "tandem-cuda-kernel-bench: no CUDA device: %s\n", why.c_str());
        return 1;
    }

    try {
        cuda::Stream stream = cuda::stream_create();
        std::printf("device: %s\n", cuda::device_name().c_str());
        const double copy_gbps =
            copy_mib > 0 ? copy_bandwidth(static_cast<size_t>(copy_mib) << 20, reps, stream) : 0.0;
        if (copy_mib > 0) std::printf("device-to-device copy: %.0f GB/s (read + write, median of %d)\n", copy_gbps, reps);
        std::printf("matvec: median of %d graph replays of %d launches over %d MiB of matrix copies\n\n", reps,
                    launches, rotate_mib);
        std::printf("| type | rows x cols | tokens | acts | loads  | us/launch | weight GB/s | of copy | vs f32 direct |\n");
        std::printf("|------|-------------|-------:|------|--------|----------:|------------:|--------:|--------------:|\n");
        std::mt19937 rng(seed);
        // The GEMM table is filled from the same matrices and printed after the matvec table.
        const std::unique_ptr<cuda::BlasHandle, void (*)(cuda::BlasHandle*)> blas(
            !gemm_tokens.empty() && cuda::blas_available() ? cuda::blas_create(stream) : nullptr, cuda::blas_destroy);
        std::string gemm_table;
        for (GgmlType type : types) {
            for (const Shape& shape : shapes) {
                const int block = ggml_type_info(type).block_size;
                if (shape.cols % block != 0) {
                    std::fprintf(stderr, "%s: %d columns are not whole blocks of %d, skipped\n", ggml_type_name(type),
                                 shape.cols, block);
                    continue;
                }
                const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(shape.cols));
                const std::vector<uint8_t> host = bench::random_matrix(type, shape.rows, shape.cols, rng);
                const size_t stride = (host.size() + 255) / 256 * 256;  // copies start 256-byte aligned
                const size_t copies =
                    std::max<size_t>(1, ((static_cast<size_t>(rotate_mib) << 20) + host.size() - 1) / host.size());
                cuda::DeviceBuffer W(stride * copies);
                for (size_t c = 0; c < copies; ++c)
                    cuda::copy_to_device(W.as<uint8_t>() + c * stride, host.data(), host.size(), stream);
                int max_tokens = *std::max_element(tokens.begin(), tokens.end());
                for (int n : gemm_tokens) max_tokens = std::max(max_tokens, n);
                std::vector<float> x_host(static_cast<size_t>(max_tokens) * shape.cols);
                std::normal_distribution<float> normal(0.0f, 1.0f);
                for (float& v : x_host) v = normal(rng);
                cuda::DeviceBuffer x(x_host.size() * 4), y(static_cast<size_t>(max_tokens) * shape.rows * 4);
                cuda::DeviceBuffer xq(cuda::q8_activation_row_bytes(type, shape.cols) * max_tokens);
                cuda::copy_to_device(x.get(), x_host.data(), x_host.size() * 4, stream);
                cuda::stream_synchronize(stream);
                for (int n : tokens) {
                    double direct_us = 0.0;  // fp32 activations, direct loads: the baseline of the last column
                    for (bool int8 : int8_acts) {
                        for (cuda::MatvecLoads l : loads) {
                            cuda::begin_capture(stream);
                            for (int i = 0; i < launches; ++i) {
                                if (int8)
                                    cuda::quantize_activations(type, x.as<float>(), shape.cols, n, xq.get(), stream);
                                cuda::matvec(type, W.as<uint8_t>() + (static_cast<size_t>(i) % copies) * stride,
                                             row_bytes, shape.rows, shape.cols, x.as<float>(), n, y.as<float>(), stream,
                                             0, l, int8 ? xq.get() : nullptr);
                            }
                            const cuda::Graph graph = cuda::end_capture(stream);
                            const double us = 1e6 * time_median(reps, stream, [&] { graph.launch(stream); }) / launches;
                            const double gbps = static_cast<double>(host.size()) / (us * 1e-6) / 1e9;
                            const bool baseline = !int8 && l == cuda::MatvecLoads::Direct;
                            if (baseline) direct_us = us;
                            char of_copy[16] = "-", vs[16] = "-";
                            if (copy_gbps > 0)
                                std::snprintf(of_copy, sizeof of_copy, "%.0f%%", 100.0 * gbps / copy_gbps);
                            if (!baseline && direct_us > 0) std::snprintf(vs, sizeof vs, "%.2fx", direct_us / us);
                            std::printf("| %s | %d x %d | %d | %s | %s | %.2f | %.1f | %s | %s |\n",
                                        ggml_type_name(type), shape.rows, shape.cols, n, int8 ? "int8" : "f32",
                                        cuda::matvec_loads_name(l), us, gbps, of_copy, vs);
                            std::fflush(stdout);
                        }
                    }
                }
                for (int n : gemm_tokens)  // the first copy of the matrix
                    bench_gemm(type, shape, n, W.as<uint8_t>(), x.as<float>(), launches, reps, blas.get(), stream,
                               gemm_table);
            }
        }
        if (!gemm_tokens.empty()) {
            std::printf("\ngemm: median of %d runs of %d calls, x quantized or converted in each call\n\n", reps,
                        launches);
            std::printf("| type | rows x cols | tokens | route | us/call | TFLOP/s | vs fp16 |\n");
            std::printf("|------|-------------|-------:|-------|--------:|--------:|--------:|\n%s", gemm_table.c_str());
        }
        cuda::stream_destroy(stream);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "tandem-cuda-kernel-bench: %s\n", e.what());
        return 1;
    }
    return 0;
}
