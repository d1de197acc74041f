// Stand-ins for Generator and Backend tests: RowsBackend, whose "logits" are fixed rows (row r for the r-th output
// row of every call), for what Backend's default implementations (forward_argmax, forward_candidates) make of given
// logits; CpuDraft, a draft model on its own CPU backend and cache.
#pragma once
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "backend.h"
#include "cpu/cpu_backend.h"
#include "generate/generator.h"

namespace tandem::test {

class RowsBackend : public Backend {
public:
    struct Cache : KvCache {
        Cache() : KvCache(1 << 20) {}
    };
    explicit RowsBackend(std::vector<std::vector<float>> rows) : rows_(std::move(rows)) {}
    std::string name() const override { return "rows"; }
    std::unique_ptr<KvCache> new_cache(int) override { return std::make_unique<Cache>(); }
    void forward(std::span<const int> tokens, KvCache& cache, int n_logits, float* logits) override {
        for (int r = 0; r < n_logits; ++r) std::copy(rows_[r].begin(), rows_[r].end(), logits + r * rows_[r].size());
        cache.commit_appended(static_cast<int>(tokens.size()));
    }

private:
    std::vector<std::vector<float>> rows_;
};

// A draft for Generator (an empty DraftModel when `model` is null).
struct CpuDraft {
    std::unique_ptr<CpuBackend> backend;
    std::unique_ptr<KvCache> cache;
    DraftModel draft;
    CpuDraft(const Model* model, int n_ctx) {
        if (!model) return;
        backend = std::make_unique<CpuBackend>(*model, 1, n_ctx);
        cache = backend->new_cache(n_ctx);
        draft = {model, backend.get(), cache.get()};
    }
};

}  // namespace tandem::test
