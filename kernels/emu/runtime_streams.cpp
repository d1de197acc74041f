// The CUDA emulation runtime's streams and graph capture: the registry of live streams, capture (recorded nodes,
// replayed in order), and graph launch (see "streams and graph capture" in cuda_emu.h for what is emulated).
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>

#include "emu/cuda_emu.h"

namespace tandem::emu {

// ---- streams and graph capture ----------------------------------------------------------------------------------

namespace {

struct StreamState {
    bool programmatic = false;
    bool high_priority = false;
    bool capturing = false;
    std::thread::id owner;  // the thread that began the capture (ThreadLocal mode's unsafe-call rule)
    std::string invalid;    // why the capture was invalidated; empty while it is valid
    Graph graph;
};

// Every live stream, behind one mutex: streams may be created, captured and used from different OS threads.
struct StreamRegistry {
    std::mutex mu;
    std::unordered_map<const void*, std::unique_ptr<StreamState>> streams;
};

StreamRegistry& registry() {
    static StreamRegistry r;
    return r;
}

// The state of a live stream; the registry's mutex must be held.
StreamState& state_of(void* stream, const char* what) {
    const auto it = registry().streams.find(stream);
    if (it == registry().streams.end())
        throw Error(std::string("tandem::emu: ") + what +
                    ": cudaErrorInvalidResourceHandle (not a live stream: destroyed, or never created)");
    return *it->second;
}

}  // namespace

bool Graph::same_topology(const Graph& o) const {
    if (nodes.size() != o.nodes.size()) return false;
    for (size_t i = 0; i < nodes.size(); ++i)
        if (nodes[i].kind != o.nodes[i].kind || nodes[i].function != o.nodes[i].function) return false;
    return true;
}

void* stream_create(bool programmatic, bool high_priority) {
    auto st = std::make_unique<StreamState>();
    st->programmatic = programmatic;
    st->high_priority = high_priority;
    void* handle = st.get();
    std::lock_guard<std::mutex> lock(registry().mu);
    registry().streams.emplace(handle, std::move(st));
    return handle;
}

void stream_destroy(void* stream) noexcept {
    if (!stream) return;
    std::unique_ptr<StreamState> doomed;  // destroyed (with any captured graph) after the lock is released
    {
        std::lock_guard<std::mutex> lock(registry().mu);
        const auto it = registry().streams.find(stream);
        if (it == registry().streams.end()) return;
        doomed = std::move(it->second);
        registry().streams.erase(it);
    }
}

void begin_capture(void* stream) {
    if (!stream)
        throw Error("tandem::emu: cudaStreamBeginCapture: cudaErrorStreamCaptureUnsupported (the legacy default "
                    "stream cannot be captured)");
    std::lock_guard<std::mutex> lock(registry().mu);
    StreamState& st = state_of(stream, "cudaStreamBeginCapture");
    if (st.capturing)
        throw Error("tandem::emu: cudaStreamBeginCapture: cudaErrorIllegalState (the stream is already capturing)");
    st.capturing = true;
    st.owner = std::this_thread::get_id();
    st.invalid.clear();
    st.graph.nodes.clear();
}

bool stream_is_programmatic(void* stream) {
    if (!stream) return false;
    std::lock_guard<std::mutex> lock(registry().mu);
    return state_of(stream, "launch").programmatic;
}

bool stream_is_high_priority(void* stream) {
    if (!stream) return false;
    std::lock_guard<std::mutex> lock(registry().mu);
    return state_of(stream, "cudaStreamGetPriority").high_priority;
}

bool is_capturing(void* stream) {
    if (!stream) return false;
    std::lock_guard<std::mutex> lock(registry().mu);
    return state_of(stream, "cudaStreamIsCapturing").capturing;
}

bool thread_is_capturing() {
    const std::thread::id me = std::this_thread::get_id();
    std::lock_guard<std::mutex> lock(registry().mu);
    for (const auto& [handle, st] : registry().streams)
        if (st->capturing && st->owner == me) return true;
    return false;
}

void invalidate_capture(void* stream, const std::string& why) {
    if (!stream) return;
    std::lock_guard<std::mutex> lock(registry().mu);
    StreamState& st = state_of(stream, "capture");
    if (st.capturing && st.invalid.empty()) st.invalid = why;
}

void invalidate_thread_captures(const std::string& why) {
    const std::thread::id me = std::this_thread::get_id();
    std::lock_guard<std::mutex> lock(registry().mu);
    for (auto& [handle, st] : registry().streams)
        if (st->capturing && st->owner == me && st->invalid.empty()) st->invalid = why;
}

void record(void* stream, GraphNode node) {
    std::lock_guard<std::mutex> lock(registry().mu);
    StreamState& st = state_of(stream, "capture");
    if (!st.capturing) throw Error("tandem::emu: recording " + node.name + " on a stream that is not capturing");
    // Nodes are still recorded after an invalidation (CUDA keeps accepting work too); end_capture discards them.
    st.graph.nodes.push_back(std::move(node));
}

Graph end_capture(void* stream) {
    std::lock_guard<std::mutex> lock(registry().mu);
    StreamState& st = state_of(stream, "cudaStreamEndCapture");
    if (!st.capturing)
        throw Error("tandem::emu: cudaStreamEndCapture: cudaErrorIllegalState (the stream is not capturing)");
    st.capturing = false;
    Graph g = std::move(st.graph);
    st.graph.nodes.clear();
    if (!st.invalid.empty()) {
        const std::string why = std::move(st.invalid);
        st.invalid.clear();
        throw Error("tandem::emu: cudaStreamEndCapture: cudaErrorStreamCaptureInvalidated (the capture was "
                    "invalidated by: " + why + ")");
    }
    return g;
}

void graph_launch(const Graph& graph, void* stream) {
    if (stream && is_capturing(stream)) {
        Graph child = graph;  // CUDA copies a graph launched into a capture as a child-graph node
        record(stream, GraphNode{NodeKind::Graph, "child graph", nullptr, [child] {
                                     for (const GraphNode& n : child.nodes) n.run();
                                 }});
        return;
    }
    for (const GraphNode& n : graph.nodes) n.run();
}

}  // namespace tandem::emu
