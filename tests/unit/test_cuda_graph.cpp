// Tests of CUDA graphs as the emulation runs them (kernels/device.h's begin_capture / end_capture / Graph, recorded
// by kernels/emu/): a capture records instead of running, replays re-run the nodes in order against the current
// device memory, kernel arguments are frozen at capture (by value) while what they point to is not, captured copies
// re-read pinned host memory, and the calls CUDA forbids during a capture fail and invalidate it. The library's
// kernels (swiglu, add_bias) are captured through their host functions, the path the backend uses; the test's own
// kernels through tandem::emu::launch_on, the emulated launch that path ends in.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cuda_compat.h"
#include "device.h"
#include "kernels.h"

using namespace tandem;
using cuda::DeviceBuffer;
using cuda::DeviceError;
using cuda::Graph;
using cuda::PinnedBuffer;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

// A stream for one test, destroyed with it.
struct TestStream {
    cuda::Stream s = cuda::stream_create();
    ~TestStream() { cuda::stream_destroy(s); }
    operator cuda::Stream() const { return s; }
};

struct Step {
    int pos;
    int n;
};

// out[0] = the position passed by value, out[1] = the one read through a pointer, out[2] = a field of a struct
// passed by value: the by-value ones are frozen into a captured graph, the pointed-to one is not.
__global__ void positions_kernel(int* out, int pos_by_value, const int* pos_in_memory, Step step) {
    if (threadIdx.x == 0) {
        out[0] = pos_by_value;
        out[1] = *pos_in_memory;
        out[2] = step.pos + step.n;
    }
}

// x[i] += 1 for every i < n, one thread each: replaying it k times must add k.
__global__ void increment_kernel(float* x, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}

template <class T>
std::vector<T> to_host(const DeviceBuffer& b, size_t n) {
    std::vector<T> v(n);
    cuda::copy_to_host(v.data(), b.get(), n * sizeof(T), nullptr);
    return v;
}

std::string device_error(auto&& f) {
    try {
        f();
    } catch (const DeviceError& e) {
        return e.what();
    }
    return "";
}

bool contains(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

}  // namespace

TEST_CASE("cuda graph: a captured pair of kernels runs only on replay, and each replay reads the current inputs") {
    TestStream stream;
    const int n = 300, rows = 3, width = 100;
    DeviceBuffer gate(n * 4), up(n * 4), out(n * 4), bias(width * 4);
    std::vector<float> g(n), u(n), b(width);
    auto upload = [&](float scale) {
        for (int i = 0; i < n; ++i) g[i] = scale * static_cast<float>(i % 17 - 8) / 4.0f, u[i] = 0.5f + i % 5;
        for (int j = 0; j < width; ++j) b[j] = scale * j;
        cuda::copy_to_device(gate.get(), g.data(), n * 4, stream);
        cuda::copy_to_device(up.get(), u.data(), n * 4, stream);
        cuda::copy_to_device(bias.get(), b.data(), width * 4, stream);
    };
    auto expected = [&] {
        std::vector<float> e(n);
        for (int i = 0; i < n; ++i) {
            const float silu = g[i] / (1.0f + std::exp(-g[i]));
            e[i] = silu * u[i] + b[i % width];
        }
        return e;
    };
    upload(1.0f);
    const std::vector<float> nan_row(n, kNaN);
    cuda::copy_to_device(out.get(), nan_row.data(), n * 4, stream);

    CHECK_FALSE(cuda::is_capturing(stream));
    cuda::begin_capture(stream);
    CHECK(cuda::is_capturing(stream));
    cuda::swiglu(gate.as<float>(), up.as<float>(), out.as<float>(), n, stream);
    cuda::add_bias(out.as<float>(), bias.as<float>(), rows, width, stream);
    Graph graph = cuda::end_capture(stream);
    CHECK_FALSE(cuda::is_capturing(stream));
    REQUIRE(graph);
    CHECK(graph.node_count() == 2);
    for (float v : to_host<float>(out, n)) REQUIRE(std::isnan(v));  // recorded, not run

    for (float scale : {1.0f, -2.5f, 0.25f}) {
        CAPTURE(scale);
        upload(scale);
        graph.launch(stream);
        cuda::stream_synchronize(stream);
        const std::vector<float> got = to_host<float>(out, n), want = expected();
        for (int i = 0; i < n; ++i) REQUIRE(std::abs(got[i] - want[i]) <= 1e-5f * std::max(1.0f, std::abs(want[i])));
    }
}

TEST_CASE("cuda graph: kernel arguments are frozen at capture, values read through a pointer are not") {
    TestStream stream;
    DeviceBuffer out(3 * 4), pos_dev(4);
    int pos = 5;
    Step step{5, 1};
    cuda::copy_to_device(pos_dev.get(), &pos, 4, stream);
    cuda::begin_capture(stream);
    tandem::emu::launch_on(stream, "positions_kernel", positions_kernel, dim3(1), dim3(32), 0, out.as<int>(), pos,
                                pos_dev.as<const int>(), step);
    Graph graph = cuda::end_capture(stream);

    for (int next : {6, 7, 42}) {
        // What a decode loop does between steps: the host's position moves on and is uploaded.
        pos = next;
        step = {next, 1};
        cuda::copy_to_device(pos_dev.get(), &pos, 4, stream);
        graph.launch(stream);
        const std::vector<int> got = to_host<int>(out, 3);
        CHECK(got[0] == 5);         // stale: the by-value argument of capture time
        CHECK(got[1] == next);      // fresh: read from device memory at replay
        CHECK(got[2] == 5 + 1);     // a struct argument is a by-value argument too
    }
    // Launched directly, the same call sees the new values.
    tandem::emu::launch_on(stream, "positions_kernel", positions_kernel, dim3(1), dim3(32), 0, out.as<int>(), pos,
                                pos_dev.as<const int>(), step);
    CHECK(to_host<int>(out, 3) == std::vector<int>{42, 42, 43});
}

TEST_CASE("cuda graph: replays accumulate, copies and memsets are recorded in stream order") {
    TestStream stream;
    const int n = 70;
    DeviceBuffer x(n * 4);
    PinnedBuffer host_in(n * 4), host_out(n * 4);
    float* in = host_in.as<float>();
    float* res = host_out.as<float>();

    cuda::begin_capture(stream);
    cuda::copy_to_device(x.get(), in, n * 4, stream);  // re-reads host_in at every replay
    tandem::emu::launch_on(stream, "increment_kernel", increment_kernel, dim3(3), dim3(32), 0, x.as<float>(), n);
    tandem::emu::launch_on(stream, "increment_kernel", increment_kernel, dim3(3), dim3(32), 0, x.as<float>(), n);
    cuda::copy_to_host(res, x.get(), n * 4, stream);  // lands in host_out at every replay
    cuda::device_memset(x.get(), 0, n * 4, stream);
    Graph graph = cuda::end_capture(stream);
    CHECK(graph.node_count() == 5);

    for (int round = 0; round < 3; ++round) {
        for (int i = 0; i < n; ++i) in[i] = static_cast<float>(10 * round + i);
        std::fill(res, res + n, kNaN);
        graph.launch(stream);
        cuda::stream_synchronize(stream);
        for (int i = 0; i < n; ++i) REQUIRE(res[i] == static_cast<float>(10 * round + i + 2));
        CHECK(to_host<float>(x, n) == std::vector<float>(n, 0.0f));  // the memset ran last
    }

    // Without the copy-in, repeated replays keep incrementing the same device memory.
    cuda::begin_capture(stream);
    tandem::emu::launch_on(stream, "increment_kernel", increment_kernel, dim3(3), dim3(32), 0, x.as<float>(), n);
    Graph inc = cuda::end_capture(stream);
    for (int k = 0; k < 4; ++k) inc.launch(stream);
    CHECK(to_host<float>(x, n) == std::vector<float>(n, 4.0f));
}

TEST_CASE("cuda graph: work on another stream, or on the default stream, runs during a capture") {
    TestStream capturing, other;
    DeviceBuffer x(32 * 4);
    cuda::device_memset(x.get(), 0, 32 * 4, nullptr);
    cuda::begin_capture(capturing);
    tandem::emu::launch_on(other.s, "increment_kernel", increment_kernel, dim3(1), dim3(32), 0, x.as<float>(), 32);
    tandem::emu::launch_on(nullptr, "increment_kernel", increment_kernel, dim3(1), dim3(32), 0, x.as<float>(), 32);
    CHECK_FALSE(cuda::is_capturing(other));
    CHECK(to_host<float>(x, 32) == std::vector<float>(32, 2.0f));
    tandem::emu::launch_on(capturing.s, "increment_kernel", increment_kernel, dim3(1), dim3(32), 0, x.as<float>(), 32);
    CHECK(to_host<float>(x, 32) == std::vector<float>(32, 2.0f));
    const Graph g = cuda::end_capture(capturing);
    CHECK(g.node_count() == 1);
    g.launch(other);  // a graph may be launched on any stream
    CHECK(to_host<float>(x, 32) == std::vector<float>(32, 3.0f));
}

TEST_CASE("cuda graph: misuse of capture is reported") {
    TestStream stream;
    SUBCASE("the legacy default stream cannot capture") {
        CHECK(contains(device_error([] { cuda::begin_capture(nullptr); }), "cudaErrorStreamCaptureUnsupported"));
    }
    SUBCASE("begin twice, end without begin") {
        cuda::begin_capture(stream);
        CHECK(contains(device_error([&] { cuda::begin_capture(stream); }), "already capturing"));
        (void)cuda::end_capture(stream);
        CHECK(contains(device_error([&] { (void)cuda::end_capture(stream); }), "not capturing"));
    }
    SUBCASE("synchronizing the capturing stream fails and invalidates the capture") {
        cuda::begin_capture(stream);
        const std::string e = device_error([&] { cuda::stream_synchronize(stream); });
        CHECK(contains(e, "cudaStreamSynchronize"));
        CHECK(contains(e, "cudaErrorStreamCaptureUnsupported"));
        CHECK(cuda::is_capturing(stream));  // still capturing, but invalid
        const std::string end = device_error([&] { (void)cuda::end_capture(stream); });
        CHECK(contains(end, "cudaErrorStreamCaptureInvalidated"));
        CHECK(contains(end, "cudaStreamSynchronize"));
        CHECK_FALSE(cuda::is_capturing(stream));
        // The stream is usable again.
        cuda::begin_capture(stream);
        CHECK(cuda::end_capture(stream).node_count() == 0);
    }
    SUBCASE("allocating or freeing device memory while this thread captures") {
        cuda::begin_capture(stream);
        CHECK(contains(device_error([] { (void)cuda::device_alloc(64); }), "cudaMalloc"));
        CHECK(contains(device_error([] { (void)cuda::pinned_alloc(64); }), "cudaMallocHost"));
        CHECK(contains(device_error([&] { (void)cuda::end_capture(stream); }), "cudaErrorStreamCaptureInvalidated"));
        DeviceBuffer held(64);
        cuda::begin_capture(stream);
        held = DeviceBuffer();  // cudaFree: invalidates (the emulation frees anyway)
        CHECK(contains(device_error([&] { (void)cuda::end_capture(stream); }), "cudaFree"));
    }
    SUBCASE("a captured copy of pageable host memory") {
        DeviceBuffer x(64);
        std::vector<float> pageable(16);
        cuda::begin_capture(stream);
        CHECK(contains(device_error([&] { cuda::copy_to_device(x.get(), pageable.data(), 64, stream); }),
                       "pinned host memory"));
        CHECK(contains(device_error([&] { cuda::copy_to_host(pageable.data(), x.get(), 64, stream); }),
                       "pinned host memory"));
        CHECK(contains(device_error([&] { (void)cuda::end_capture(stream); }), "pageable"));
        // A pinned buffer is fine, but not a range that runs past its end.
        PinnedBuffer pinned(64);
        cuda::begin_capture(stream);
        cuda::copy_to_device(x.get(), pinned.get(), 64, stream);
        CHECK(contains(device_error([&] { cuda::copy_to_device(x.get(), pinned.as<char>() + 8, 64, stream); }),
                       "pinned host memory"));
        CHECK_THROWS_AS((void)cuda::end_capture(stream), DeviceError);
        // Outside a capture pageable memory is fine, as with cudaMemcpyAsync.
        cuda::copy_to_device(x.get(), pageable.data(), 64, stream);
    }
    SUBCASE("a bad launch configuration fails at the capturing launch and invalidates the capture") {
        DeviceBuffer x(4);
        cuda::begin_capture(stream);
        CHECK_THROWS_AS(tandem::emu::launch_on(stream, "increment_kernel", increment_kernel, dim3(1), dim3(2048), 0,
                                               x.as<float>(), 1),
                        tandem::emu::Error);
        const std::string e = device_error([&] { (void)cuda::end_capture(stream); });
        CHECK(contains(e, "cudaErrorStreamCaptureInvalidated"));
        CHECK(contains(e, "exceeds 1024 threads"));
    }
    SUBCASE("an empty graph and a dead stream") {
        const Graph empty;
        CHECK_FALSE(empty);
        CHECK(contains(device_error([&] { empty.launch(stream); }), "empty"));
        cuda::Stream dead = cuda::stream_create();
        cuda::stream_destroy(dead);
        CHECK(contains(device_error([&] { cuda::begin_capture(dead); }), "cudaErrorInvalidResourceHandle"));
    }
}

TEST_CASE("cuda graph: re-capture updates a graph of the same topology in place, graphs nest and move") {
    TestStream stream;
    const int n = 40;
    DeviceBuffer x(n * 4);
    cuda::device_memset(x.get(), 0, n * 4, stream);
    auto capture_increments = [&](int count, int len) {
        cuda::begin_capture(stream);
        for (int i = 0; i < count; ++i)
            tandem::emu::launch_on(stream, "increment_kernel", increment_kernel, dim3(2), dim3(32), 0,
                                   x.as<float>(), len);
    };
    Graph g;
    capture_increments(2, n);
    CHECK_FALSE(cuda::end_capture(stream, g));  // nothing to update: instantiated
    capture_increments(2, n / 2);               // same nodes, new arguments: updated in place
    CHECK(cuda::end_capture(stream, g));
    g.launch(stream);
    std::vector<float> got = to_host<float>(x, n);
    CHECK(got[0] == 2.0f);
    CHECK(got[n - 1] == 0.0f);  // the updated argument (n / 2) is the one replayed
    capture_increments(3, n);   // another node: re-instantiated
    CHECK_FALSE(cuda::end_capture(stream, g));
    CHECK(g.node_count() == 3);

    // A graph launched into a capture becomes one node of the outer graph.
    cuda::begin_capture(stream);
    g.launch(stream);
    tandem::emu::launch_on(stream, "increment_kernel", increment_kernel, dim3(2), dim3(32), 0, x.as<float>(), n);
    Graph outer = cuda::end_capture(stream);
    CHECK(outer.node_count() == 2);
    cuda::device_memset(x.get(), 0, n * 4, stream);
    outer.launch(stream);
    CHECK(to_host<float>(x, n) == std::vector<float>(n, 4.0f));

    Graph moved = std::move(outer);
    CHECK_FALSE(outer);  // NOLINT(bugprone-use-after-move): the moved-from graph is empty by contract
    moved.launch(stream);
    CHECK(to_host<float>(x, n) == std::vector<float>(n, 8.0f));
    moved = Graph();
    CHECK_FALSE(moved);

    // Destroying a stream in the middle of a capture drops what it recorded.
    cuda::Stream s2 = cuda::stream_create();
    cuda::begin_capture(s2);
    tandem::emu::launch_on(s2, "increment_kernel", increment_kernel, dim3(2), dim3(32), 0, x.as<float>(), n);
    cuda::stream_destroy(s2);
    CHECK(to_host<float>(x, n) == std::vector<float>(n, 8.0f));
}
