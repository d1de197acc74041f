// Prefill GEMM y[t][r] = dot(row r of W, x[t]) for chunks of many tokens, two routes (kernels.h):
//  - gemm: a tiled SIMT kernel for every matvec weight type. A block computes a 64-row x 64-token tile of y; per
//    step of 32 along k it dequantizes the 64x32 weight tile and stages the 64x32 activation tile in shared memory
//    (k-major, so the compute loop reads both with 16-byte loads), and each thread accumulates a 4x4 micro-tile in
//    fp32 registers.
//  - the fp16 route: dequantize_f16 (weight rows -> fp16 tiles), convert_f16 (activations), then cuBLAS
//    (cublasGemmEx, fp16 in, fp32 compute: tensor cores; loaded with dlopen on first use) in the nvcc build, or gemm_f16
//    (the SIMT kernel over fp16 operands) as its emulatable mirror. Everything cuBLAS is in the
//    `#if defined(__CUDACC__)` blocks of this file.
#include <algorithm>

#include "common.cuh"
#include "dequant.cuh"

#if defined(__CUDACC__)
#include <cublas_v2.h>
#include <dlfcn.h>

#include <stdexcept>
#include <string>
#include <type_traits>
#endif

namespace tandem::cuda {
namespace {

constexpr int kBM = 64, kBN = 64, kBK = 32, kThreads = 256;
// Row padding of the k-major tiles: keeps rows 16-byte aligned for the float4 reads (68 floats = 272 bytes); the
// loaders' stores (32 consecutive rows / tokens per warp at one k) are conflict-free either way.
constexpr int kStride = kBM + 4;
static_assert(kBM == kBN, "one stride serves both tiles");

// Weight loaders: the 8 elements k..k+7 of a row (k % 8 == 0), zeros past `cols`.
template <GgmlType T>
struct QuantRow {
    static __device__ __forceinline__ void load8(const uint8_t* row, int k, int cols, float (&v)[8]) {
#pragma unroll
        for (int u = 0; u < 8; ++u) v[u] = k + u < cols ? detail::dequant_element(T, row, k + u) : 0.0f;
    }
};

// Activation loaders: elements k..k+7 of an activation row, zeros past `cols`. `vec`: cols % 8 == 0 and 16-byte
// aligned rows, so a whole in-range group is two float4 (fp32) or one uint4 (fp16) loads.
__device__ __forceinline__ void load_x8(const float* xr, int k, int cols, bool vec, float (&v)[8]) {
    if (vec && k + 8 <= cols) {
        const float4 a = *reinterpret_cast<const float4*>(xr + k), b = *reinterpret_cast<const float4*>(xr + k + 4);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        return;
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) v[u] = k + u < cols ? xr[k + u] : 0.0f;
}
__device__ __forceinline__ void load_x8(const uint16_t* xr, int k, int cols, bool vec, float (&v)[8]) {
    if (vec && k + 8 <= cols) {
        const uint4 a = *reinterpret_cast<const uint4*>(xr + k);
        const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            v[2 * u] = tandem_half_to_float(static_cast<unsigned short>(w[u] & 0xFFFF));
            v[2 * u + 1] = tandem_half_to_float(static_cast<unsigned short>(w[u] >> 16));
        }
        return;
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) v[u] = k + u < cols ? tandem_half_to_float(xr[k + u]) : 0.0f;
}

// Block (blockIdx.x, blockIdx.y) = rows r0..r0+63, tokens t0..t0+63. Loading: thread `tid` fills row / token
// tid % 64 at k slice 8 * (tid / 64). Computing: rows 4 * (tid % 16) + i, tokens 4 * (tid / 16) + j. Every output
// is the sum over k in ascending order, so it does not depend on the tile it falls in.
template <class WLoad, class XT>
__global__ void __launch_bounds__(kThreads)
    gemm_kernel(const uint8_t* __restrict__ W, size_t row_bytes, int rows, int cols, const XT* __restrict__ x,
                int n_tok, float* __restrict__ y, int ldy, bool x_vec) {
    detail::wait_for_inputs();
    TANDEM_SHARED(float4, w_tile4, kBK * kStride / 4);
    TANDEM_SHARED(float4, x_tile4, kBK * kStride / 4);
    float* w_tile = reinterpret_cast<float*>(w_tile4);
    float* x_tile = reinterpret_cast<float*>(x_tile4);
    const int tid = threadIdx.x;
    const int r0 = blockIdx.x * kBM, t0 = blockIdx.y * kBN;
    const int ld = tid % 64, lk = 8 * (tid / 64);
    const uint8_t* w_row = r0 + ld < rows ? W + static_cast<size_t>(r0 + ld) * row_bytes : nullptr;
    const XT* x_row = t0 + ld < n_tok ? x + static_cast<size_t>(t0 + ld) * cols : nullptr;
    const int cr = 4 * (tid % 16), ct = 4 * (tid / 16);

    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < cols; k0 += kBK) {
        float v[8];
        if (w_row) {
            WLoad::load8(w_row, k0 + lk, cols, v);
        } else {
#pragma unroll
            for (int u = 0; u < 8; ++u) v[u] = 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 8; ++u) w_tile[(lk + u) * kStride + ld] = v[u];
        if (x_row) {
            load_x8(x_row, k0 + lk, cols, x_vec, v);
        } else {
#pragma unroll
            for (int u = 0; u < 8; ++u) v[u] = 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 8; ++u) x_tile[(lk + u) * kStride + ld] = v[u];
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < kBK; ++kk) {
            const float4 a = w_tile4[(kk * kStride + cr) / 4], b = x_tile4[(kk * kStride + ct) / 4];
            const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int t = t0 + ct + j;
        if (t >= n_tok) break;
#pragma unroll
        for (int i = 0; i < 4; ++i)
            if (r0 + cr + i < rows) y[static_cast<size_t>(t) * ldy + r0 + cr + i] = acc[i][j];
    }
}

// One block per row of the tile: element e of row row0 + blockIdx.x, rounded to fp16.
__global__ void __launch_bounds__(256)
    dequantize_f16_kernel(GgmlType type, const uint8_t* __restrict__ W, size_t row_bytes, int row0, int cols,
                          uint16_t* __restrict__ out) {
    detail::wait_for_inputs();
    const uint8_t* row = W + static_cast<size_t>(row0 + blockIdx.x) * row_bytes;
    uint16_t* o = out + static_cast<size_t>(blockIdx.x) * cols;
    for (int e = threadIdx.x; e < cols; e += blockDim.x) o[e] = tandem_float_to_half(detail::dequant_element(type, row, e));
}

__global__ void __launch_bounds__(256) convert_f16_kernel(const float* __restrict__ x, size_t n, uint16_t* __restrict__ out) {
    detail::wait_for_inputs();
    const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = tandem_float_to_half(x[i]);
}

template <GgmlType T, class XT>
void launch_gemm(const char* name, const void* W, size_t row_bytes, int rows, int cols, const XT* x, int n_tokens,
                 float* y, int ldy, Stream stream) {
    const bool x_vec = cols % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
    const dim3 grid((rows + kBM - 1) / kBM, (n_tokens + kBN - 1) / kBN), block(kThreads);
    detail::launch_kernel(name, gemm_kernel<QuantRow<T>, XT>, grid, block, 0, stream, static_cast<const uint8_t*>(W),
                          row_bytes, rows, cols, x, n_tokens, y, ldy, x_vec);
}

void check_blocks(GgmlType type, int cols, const char* who) {
    detail::require(cols % static_cast<int>(ggml_type_info(type).block_size) == 0,
                    (std::string(who) + ": block-quantized rows are whole blocks").c_str());
}

}  // namespace

bool gemm_supports(GgmlType type) { return matvec_supports(type); }

void gemm(GgmlType type, const void* W, size_t row_bytes, int rows, int cols, const float* x, int n_tokens, float* y,
          Stream stream) {
    detail::require(rows > 0 && cols > 0 && n_tokens > 0, "gemm: empty shape");
    detail::require(n_tokens <= 65535 * kBN, "gemm: too many tokens");
    detail::require(reinterpret_cast<uintptr_t>(W) % 16 == 0, "gemm: W must be 16-byte aligned");
    detail::require(gemm_supports(type), "gemm: unsupported weight type");
    check_blocks(type, cols, "gemm");
    switch (type) {
#define TANDEM_GEMM_CASE(T)                                                                                        \
    case GgmlType::T:                                                                                              \
        return launch_gemm<GgmlType::T>("gemm_kernel<" #T ">", W, row_bytes, rows, cols, x, n_tokens, y, rows, stream);
        TANDEM_GEMM_CASE(F32)
        TANDEM_GEMM_CASE(F16)
        TANDEM_GEMM_CASE(BF16)
        TANDEM_GEMM_CASE(Q8_0)
        TANDEM_GEMM_CASE(Q4_0)
        TANDEM_GEMM_CASE(Q4_1)
        TANDEM_GEMM_CASE(Q5_0)
        TANDEM_GEMM_CASE(Q5_1)
        TANDEM_GEMM_CASE(Q2_K)
        TANDEM_GEMM_CASE(Q3_K)
        TANDEM_GEMM_CASE(Q4_K)
        TANDEM_GEMM_CASE(Q5_K)
        TANDEM_GEMM_CASE(Q6_K)
#undef TANDEM_GEMM_CASE
        default: break;
    }
}

void dequantize_f16(GgmlType type, const void* W, size_t row_bytes, int row0, int n_rows, int cols, uint16_t* out,
                    Stream stream) {
    detail::require(row0 >= 0 && n_rows > 0 && cols > 0, "dequantize_f16: empty shape");
    detail::require(gemm_supports(type), "dequantize_f16: unsupported weight type");
    check_blocks(type, cols, "dequantize_f16");
    detail::launch_kernel("dequantize_f16_kernel", dequantize_f16_kernel, dim3(n_rows), dim3(256), 0, stream, type,
                          static_cast<const uint8_t*>(W), row_bytes, row0, cols, out);
}

void convert_f16(const float* x, size_t n, uint16_t* out, Stream stream) {
    if (n == 0) return;
    const size_t blocks = std::min<size_t>((n + 255) / 256, 4096);
    detail::launch_kernel("convert_f16_kernel", convert_f16_kernel, dim3(static_cast<unsigned>(blocks)), dim3(256), 0,
                          stream, x, n, out);
}

void gemm_f16(const uint16_t* W16, int ldw, int rows, int cols, const uint16_t* x16, int n_tokens, float* y, int ldy,
              Stream stream) {
    detail::require(rows > 0 && cols > 0 && n_tokens > 0 && ldw >= cols && ldy >= rows, "gemm_f16: bad shape");
    detail::require(n_tokens <= 65535 * kBN, "gemm_f16: too many tokens");
    launch_gemm<GgmlType::F16>("gemm_kernel<F16, f16 x>", W16, static_cast<size_t>(ldw) * 2, rows, cols, x16,
                               n_tokens, y, ldy, stream);
}

// ---- cuBLAS ---------------------------------------------------------------------------------------------------------
#if defined(__CUDACC__)
struct BlasHandle {
    cublasHandle_t h = nullptr;
};

namespace {
// cuBLAS is loaded on first use (dlopen), not linked. Linked, every run of every tandem program mapped libcublas
// and libcublasLt at start-up, and their initialisation kept ~150 MB resident (62 MB of library pages and 86 MB of
// libcublasLt's .bss, read off /proc/PID/smaps of a CPU-only run on the 1.5B model) whether or not a GPU was used.
// The entry points are declared with the library's exported signatures; the static_asserts check them against the
// header without referring to the symbols (an unevaluated operand), so nothing links to cuBLAS.
using CreateFn = cublasStatus_t (*)(cublasHandle_t*);
using DestroyFn = cublasStatus_t (*)(cublasHandle_t);
using SetStreamFn = cublasStatus_t (*)(cublasHandle_t, cudaStream_t);
using StatusStringFn = const char* (*)(cublasStatus_t);
using GemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                    const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                                    cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
static_assert(sizeof(static_cast<CreateFn>(&cublasCreate_v2)) > 0);
static_assert(sizeof(static_cast<DestroyFn>(&cublasDestroy_v2)) > 0);
static_assert(sizeof(static_cast<SetStreamFn>(&cublasSetStream_v2)) > 0);
static_assert(sizeof(static_cast<StatusStringFn>(&cublasGetStatusString)) > 0);
static_assert(sizeof(static_cast<GemmExFn>(&cublasGemmEx)) > 0);

struct BlasApi {
    CreateFn create = nullptr;
    DestroyFn destroy = nullptr;
    SetStreamFn set_stream = nullptr;
    StatusStringFn status_string = nullptr;
    GemmExFn gemm_ex = nullptr;
    std::string error;  // why it could not be loaded; empty when it was
};

// The cuBLAS of the toolkit tandem was built with (same major version), loaded once; never unloaded.
const BlasApi& blas_api() {
    static const BlasApi api = [] {
        BlasApi a;
        const std::string soname = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
        void* lib = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
#ifdef TANDEM_CUBLAS_DIR
        // Not on the loader's paths: the toolkit tandem was built against.
        if (!lib) lib = dlopen((std::string(TANDEM_CUBLAS_DIR) + "/" + soname).c_str(), RTLD_NOW | RTLD_LOCAL);
#endif
        if (!lib) {
            const char* why = dlerror();
            a.error = why ? why : soname + ": cannot be loaded";
            return a;
        }
        auto load = [&](auto& fn, const char* name) {
            fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
            if (!fn && a.error.empty()) a.error = soname + " has no " + name;
        };
        load(a.create, "cublasCreate_v2");
        load(a.destroy, "cublasDestroy_v2");
        load(a.set_stream, "cublasSetStream_v2");
        load(a.status_string, "cublasGetStatusString");
        load(a.gemm_ex, "cublasGemmEx");
        return a;
    }();
    return api;
}

void check_blas(cublasStatus_t st, const char* what) {
    if (st != CUBLAS_STATUS_SUCCESS)
        throw std::runtime_error(std::string("tandem::cuda: ") + what + " failed: " + blas_api().status_string(st));
}

// Column-major view of the row-major products: y (rows x n, ld ldy) = W^T (W is cols x rows, ld ldw) * x (cols x n).
void blas_gemm(BlasHandle* b, const void* W, cudaDataType wt, int ldw, int rows, int cols, const void* x,
               cudaDataType xt, int n_tokens, float* y, int ldy) {
    const float alpha = 1.0f, beta = 0.0f;
    check_blas(blas_api().gemm_ex(b->h, CUBLAS_OP_T, CUBLAS_OP_N, rows, n_tokens, cols, &alpha, W, wt, ldw, x, xt,
                                  cols, &beta, y, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
}
}  // namespace

// False when cuBLAS cannot be loaded: the prefill GEMM then runs on the SIMT kernel (CudaBackend::use_blas).
bool blas_available() { return blas_api().error.empty(); }

BlasHandle* blas_create(Stream stream) {
    const BlasApi& api = blas_api();
    if (!api.error.empty()) throw std::runtime_error("tandem::cuda: cuBLAS: " + api.error);
    auto* b = new BlasHandle;
    cublasStatus_t st = api.create(&b->h);
    if (st == CUBLAS_STATUS_SUCCESS) st = api.set_stream(b->h, static_cast<cudaStream_t>(stream));
    if (st != CUBLAS_STATUS_SUCCESS) {
        blas_destroy(b);
        check_blas(st, "cublasCreate");
    }
    return b;
}

void blas_destroy(BlasHandle* b) noexcept {
    if (!b) return;
    if (b->h) blas_api().destroy(b->h);
    delete b;
}
#else
struct BlasHandle {};

namespace {
void blas_gemm(BlasHandle*, const void*, int, int, int, int, const void*, int, int, float*, int) {
    detail::require(false, "cuBLAS is not part of the CUDA emulation");
}
constexpr int CUDA_R_16F = 0, CUDA_R_32F = 0;
}  // namespace

bool blas_available() { return false; }
BlasHandle* blas_create(Stream) {
    detail::require(false, "cuBLAS is not part of the CUDA emulation");
    return nullptr;
}
void blas_destroy(BlasHandle* b) noexcept { delete b; }
#endif

void gemm_via_f16(BlasHandle* blas, GgmlType type, const void* W, size_t row_bytes, int rows, int cols, const float* x,
                  const uint16_t* x16, int n_tokens, float* y, uint16_t* tile, size_t tile_elems, Stream stream) {
    detail::require(rows > 0 && cols > 0 && n_tokens > 0, "gemm_via_f16: empty shape");
    if (type == GgmlType::F32) {  // fp32 weights stay fp32: rounding them to fp16 would lose what they are for
        if (!blas) return gemm(type, W, row_bytes, rows, cols, x, n_tokens, y, stream);
        detail::require(row_bytes % 4 == 0, "gemm_via_f16: F32 rows must be whole floats apart");
        return blas_gemm(blas, W, CUDA_R_32F, static_cast<int>(row_bytes / 4), rows, cols, x, CUDA_R_32F, n_tokens, y,
                         rows);
    }
    if (type == GgmlType::F16) {  // already fp16: multiplied in place
        detail::require(row_bytes % 2 == 0, "gemm_via_f16: F16 rows must be whole halves apart");
        const int ldw = static_cast<int>(row_bytes / 2);
        if (!blas) return gemm_f16(static_cast<const uint16_t*>(W), ldw, rows, cols, x16, n_tokens, y, rows, stream);
        return blas_gemm(blas, W, CUDA_R_16F, ldw, rows, cols, x16, CUDA_R_16F, n_tokens, y, rows);
    }
    const size_t tile_rows_max = tile_elems / static_cast<size_t>(cols);
    detail::require(tile_rows_max > 0, "gemm_via_f16: the fp16 tile holds less than one row");
    const int tile_rows = static_cast<int>(std::min<size_t>(tile_rows_max, static_cast<size_t>(rows)));
    for (int r0 = 0; r0 < rows; r0 += tile_rows) {
        const int n = std::min(tile_rows, rows - r0);
        // Stream order keeps the next dequantization from overwriting `tile` before this product has read it.
        dequantize_f16(type, W, row_bytes, r0, n, cols, tile, stream);
        if (blas)
            blas_gemm(blas, tile, CUDA_R_16F, cols, n, cols, x16, CUDA_R_16F, n_tokens, y + r0, rows);
        else
            gemm_f16(tile, cols, n, cols, x16, n_tokens, y + r0, rows, stream);
    }
}

}  // namespace tandem::cuda
