// A run's use of the on-disk prompt cache (prompt_cache/): the keys of its target and draft (their model files and
// backends), the lookup and load before a prompt is prefilled, the save after it is answered, and what --stats says
// of it. The CLI's one-shot answer (and each --batch line, through prompt_answer.h), --chat and the REPL's first turn
// use it; the default directory and size cap come from the environment and the flags (main.cpp).
#pragma once
#include <cstdint>
#include <span>
#include <string>

#include "generate/generator.h"
#include "prompt_cache/prompt_cache.h"

namespace tandem {

class Backend;
class KvCache;

// What the prompt cache did for one prompt.
struct PromptReuse {
    bool looked_up = false;  // the cache is on and the prompt long enough: an entry was looked for
    int n_loaded = 0;        // the target's positions loaded: the Generator's `cached`
    int n_draft_loaded = 0;  // the draft's (at most the target's)
    double seconds = 0;      // lookup and load, both models
    uint64_t bytes = 0;      // entry bytes read
    bool saved = false;      // the target's positions were saved after the answer (the draft's: draft_saved)
    bool draft_saved = false;
};

class PromptReuser {
public:
    // For a target `backend` + `cache` made from `model_path`, and optionally a draft (draft.model null: none).
    // options.dir "" turns it off (every call then does nothing).
    PromptReuser(prompt_cache::Options options, const std::string& model_path, Backend& backend, KvCache& cache,
                 const std::string& draft_path, DraftModel draft);
    bool enabled() const { return cache_.enabled(); }
    int min_tokens() const { return cache_.options().min_tokens; }

    // Before prefill, with both caches empty: loads the longest saved prefix of `tokens` (never the last token) into
    // the target's cache, then the draft's up to as many positions. Prompts shorter than the cache's minimum are not
    // looked up.
    PromptReuse load(std::span<const int> tokens);
    // After the answer (the caches hold at least the prompt's positions that were fed): saves the target's positions
    // of `tokens`, and the draft's that it caught up on, where the prompt is long enough and at least the minimum
    // of tokens was computed rather than loaded (a prompt served by an entry but for its last question is not saved
    // again). Warnings on stderr where saving fails; never throws.
    void save(std::span<const int> tokens, PromptReuse& reuse);

    // The same for another cache of the target's backend (a --batch slot), without the draft: load_into replaces
    // the `cache.n_committed()` positions of `tokens` it holds with more where an entry has more, and returns the
    // positions it holds then; save_from saves the prompt's positions where at least the minimum of them were
    // computed (`computed`) rather than loaded or copied.
    int load_into(std::span<const int> tokens, KvCache& cache);
    void save_from(std::span<const int> tokens, const KvCache& cache, int computed);

private:
    prompt_cache::PromptCache cache_;
    prompt_cache::Key target_key_, draft_key_;
    Backend& backend_;
    KvCache& target_cache_;
    DraftModel draft_;
};

// The --stats line: "prompt cache:       hit, 1480 of 1500 tokens loaded (43.1 MB, 0.012 s, 3.6 GB/s), 20 prefilled;
// draft 1480; saved" or "miss" / "off" / "not looked up (under 256 tokens)".
std::string describe_prompt_reuse(const PromptReuse& reuse, const PromptReuser* reuser, int n_prompt);

}  // namespace tandem
