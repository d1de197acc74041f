// The one-shot run (one_shot.h).
#include "app/one_shot.h"

#include <cstdio>

#include "app/answer_grammar.h"
#include "app/answer_record.h"
#include "app/prompt_answer.h"
#include "app/stream_write.h"

namespace tandem {

namespace {

// Tokens per second as the user sees them; bandwidth from the target forwards actually run (fewer than the tokens
// when speculation accepts drafts).
void print_stats(const GenerationStats& st, const Model& model, const std::string& prompt_cache) {
    const double decode_tps = st.decode_s > 0 ? st.n_generated / st.decode_s : 0.0;
    const double bytes_per_token = static_cast<double>(model.weights.bytes_per_token());
    const double gbps = st.decode_s > 0 ? st.n_decode_forwards / st.decode_s * bytes_per_token / 1e9 : 0.0;
    const int prefilled = st.n_prompt - st.n_cached;
    std::fprintf(stderr,
                 "\n--- stats ---\n"
                 "prompt tokens:      %d\n"
                 "prompt cache:       %s\n"
                 "prefill:            %.3f s, %.1f tokens/s\n"
                 "time to first token: %.3f s\n"
                 "generated tokens:   %d (stop: %s)\n"
                 "decode:             %.3f s, %.1f tokens/s\n"
                 "weight bandwidth:   %.2f GB/s (%.1f MB of weights per token)\n",
                 st.n_prompt, prompt_cache.c_str(), st.prefill_s, st.prefill_s > 0 ? prefilled / st.prefill_s : 0.0,
                 st.ttft_s, st.n_generated, stop_reason_name(st.stop), st.decode_s, decode_tps, gbps,
                 bytes_per_token / 1e6);
    if (st.speculative) std::fputs(st.spec.summary(st.decode_s, st.n_generated).c_str(), stderr);
}

}  // namespace

int run_one_shot(Session& session, const OneShotOptions& o) {
    const Model& model = session.model();
    const std::optional<ChatTemplate>& tmpl = session.chat_template();
    if (tmpl && !tmpl->is_raw() && session.verbose())
        std::fprintf(stderr, "tandem: chat template %s\n", tmpl->name().c_str());
    // The grammar's constraint (its ends: EOS and the template's end of turn), before any backend is made.
    std::optional<grammar::TokenConstraint> grammar;
    if (o.grammar) grammar.emplace(answer_constraint(model, *o.grammar, tmpl));
    const PreparedPrompt prepared = prepare_prompt(
        session,
        {.prompt = o.prompt, .system = o.system, .params = o.params, .grammar = grammar ? &*grammar : nullptr});
    const PromptAnswer a = answer_prompt(
        session, prepared,
        {.stream = !o.jsonl, .echo = o.echo && !o.jsonl ? o.prompt : "", .show_thinking = o.show_thinking});
    if (a.output_closed()) return 0;  // the reader went away: end quietly
    if (a.stats.stop == StopReason::ContextFull)
        std::fprintf(stderr, "\ntandem: stopped: the context of %d tokens is full\n", session.n_ctx());
    if (o.jsonl && !write_stdout(answer_record(a.text, a.reasoning, a.stats) + "\n")) return 0;
    if (o.stats)
        print_stats(a.stats, model, describe_prompt_reuse(a.prompt_reuse, &session.prompts(), a.stats.n_prompt));
    if (o.stats && grammar)
        std::fprintf(stderr, "grammar masks:      %d, %.3f ms each\n", a.mask_calls,
                     a.mask_calls > 0 ? a.mask_seconds * 1e3 / a.mask_calls : 0.0);
    return 0;
}

}  // namespace tandem
