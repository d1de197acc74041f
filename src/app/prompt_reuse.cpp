// PromptReuser (prompt_reuse.h): a run's target and draft against the on-disk prompt cache.
#include "app/prompt_reuse.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "backend.h"
#include "cpu/repack_cache.h"

namespace tandem {

PromptReuser::PromptReuser(prompt_cache::Options options, const std::string& model_path, Backend& backend,
                           KvCache& cache, const std::string& draft_path, DraftModel draft)
    : cache_(std::move(options)), backend_(backend), target_cache_(cache), draft_(draft) {
    if (!cache_.enabled()) return;
    // The model file as repack_model_identity names it (path, size, modification time, inode): a changed file is
    // another key.
    target_key_ = {cpu::repack_model_identity(model_path), backend.kv_signature()};
    if (draft_.model && draft_.backend && draft_.cache)
        draft_key_ = {cpu::repack_model_identity(draft_path), draft_.backend->kv_signature()};
}

PromptReuse PromptReuser::load(std::span<const int> tokens) {
    PromptReuse r;
    if (!cache_.worth_it(tokens.size())) return r;
    r.looked_up = true;
    // The last token is always prefilled: its forward gives the first answer token's logits.
    const int max_tokens = static_cast<int>(tokens.size()) - 1;
    const prompt_cache::LoadResult t =
        cache_.load_longest_prefix(target_key_, tokens, target_cache_, max_tokens, backend_.resume_multiple());
    r.n_loaded = t.n_loaded;
    r.seconds = t.seconds;
    r.bytes = t.bytes;
    // The draft may hold any prefix of what the target holds (the Generator catches it up when it drafts): worth a
    // lookup only where the target loaded something.
    if (r.n_loaded > 0 && !draft_key_.model.empty() && draft_.cache->n_committed() == 0) {
        const prompt_cache::LoadResult d = cache_.load_longest_prefix(draft_key_, tokens, *draft_.cache, r.n_loaded,
                                                                      draft_.backend->resume_multiple());
        r.n_draft_loaded = d.n_loaded;
        r.seconds += d.seconds;
        r.bytes += d.bytes;
    }
    return r;
}

int PromptReuser::load_into(std::span<const int> tokens, KvCache& cache) {
    if (!cache_.worth_it(tokens.size())) return cache.n_committed();
    cache_.load_longest_prefix(target_key_, tokens, cache, static_cast<int>(tokens.size()) - 1,
                               backend_.resume_multiple(), cache.n_committed());
    return cache.n_committed();
}

void PromptReuser::save_from(std::span<const int> tokens, const KvCache& cache, int computed) {
    if (!cache_.worth_it(tokens.size()) || computed < cache_.options().min_tokens) return;
    if (cache.n_committed() >= static_cast<int>(tokens.size())) cache_.store(target_key_, tokens, cache);
}

void PromptReuser::save(std::span<const int> tokens, PromptReuse& reuse) {
    if (!cache_.worth_it(tokens.size())) return;
    const int min_new = cache_.options().min_tokens;
    const int n = static_cast<int>(tokens.size());
    if (n - reuse.n_loaded >= min_new && target_cache_.n_committed() >= n)
        reuse.saved = cache_.store(target_key_, tokens, target_cache_);
    if (!draft_key_.model.empty()) {
        const int k = std::min(n, draft_.cache->n_committed());
        if (k >= min_new && k - reuse.n_draft_loaded >= min_new)
            reuse.draft_saved = cache_.store(draft_key_, tokens.first(static_cast<size_t>(k)), *draft_.cache);
    }
}

std::string describe_prompt_reuse(const PromptReuse& r, const PromptReuser* reuser, int n_prompt) {
    char buf[320];
    if (!reuser || !reuser->enabled()) return "off";
    if (!r.looked_up) {
        std::snprintf(buf, sizeof buf, "not looked up (prompts under %d tokens)", reuser->min_tokens());
        return buf;
    }
    if (r.n_loaded == 0) {
        std::snprintf(buf, sizeof buf, "miss, %d tokens prefilled (%.3f s looking)%s", n_prompt, r.seconds,
                      r.saved ? "; saved" : "");
        return buf;
    }
    std::snprintf(
        buf, sizeof buf, "hit, %d of %d tokens loaded (%.1f MB, %.3f s, %.2f GB/s), %d prefilled%s%s", r.n_loaded,
        n_prompt, r.bytes / 1e6, r.seconds, r.seconds > 0 ? r.bytes / r.seconds / 1e9 : 0.0, n_prompt - r.n_loaded,
        r.n_draft_loaded > 0 ? ("; draft " + std::to_string(r.n_draft_loaded)).c_str() : "", r.saved ? "; saved" : "");
    return buf;
}

}  // namespace tandem
