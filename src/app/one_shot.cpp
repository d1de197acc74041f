// The one-shot run (one_shot.h).
#include "app/one_shot.h"

#include <cstdio>
#include <vector>

#include "app/answer_grammar.h"
#include "app/answer_record.h"
#include "app/reasoning_output.h"
#include "app/stream_write.h"
#include "error.h"
#include "text/chat_prompt.h"
#include "text/reasoning_split.h"

namespace tandem {

namespace {

// Tokens per second as the user sees them; bandwidth from the target forwards actually run (fewer than the tokens
// when speculation accepts drafts).
void print_stats(const GenerationStats& st, const Model& model) {
    const double decode_tps = st.decode_s > 0 ? st.n_generated / st.decode_s : 0.0;
    const double bytes_per_token = static_cast<double>(model.weights.bytes_per_token());
    const double gbps = st.decode_s > 0 ? st.n_decode_forwards / st.decode_s * bytes_per_token / 1e9 : 0.0;
    std::fprintf(stderr,
                 "\n--- stats ---\n"
                 "prompt tokens:      %d\n"
                 "prefill:            %.3f s, %.1f tokens/s\n"
                 "time to first token: %.3f s\n"
                 "generated tokens:   %d (stop: %s)\n"
                 "decode:             %.3f s, %.1f tokens/s\n"
                 "weight bandwidth:   %.2f GB/s (%.1f MB of weights per token)\n",
                 st.n_prompt, st.prefill_s, st.prefill_s > 0 ? st.n_prompt / st.prefill_s : 0.0, st.ttft_s,
                 st.n_generated, stop_reason_name(st.stop), st.decode_s, decode_tps, gbps, bytes_per_token / 1e6);
    if (st.speculative) std::fputs(st.spec.summary(st.decode_s, st.n_generated).c_str(), stderr);
}

}  // namespace

int run_one_shot(Session& session, const OneShotOptions& o) {
    const Model& model = session.model();
    const std::optional<ChatTemplate>& tmpl = session.chat_template();
    GenerationParams params = o.params;
    std::vector<int> tokens;
    // The template as this turn renders it (smollm3's reasoning mode may come from the system message).
    std::optional<ChatTemplate> turn;
    // A grammar on a reasoning model's answer applies after its think block, which the prompt then opens itself
    // (where the model would): the grammar starts inside the reasoning (grammar/answer_after.h).
    bool constrain_after_reasoning = false;
    if (tmpl && !tmpl->is_raw()) {
        std::vector<ChatMessage> messages;
        if (!o.system.empty()) messages.push_back({"system", o.system});
        messages.push_back({"user", o.prompt});
        turn = tmpl->for_messages(messages);
        constrain_after_reasoning = o.grammar && turn->supports_thinking() && turn->thinking();
        turn->set_reasoning_opened(constrain_after_reasoning);
        tokens = tokenize_chat(*model.tokenizer, *turn, messages, /*add_generation_prompt=*/true);
        for (const int id : end_of_turn_ids(*model.tokenizer, *tmpl)) params.stop_tokens.push_back(id);
        if (session.verbose()) std::fprintf(stderr, "tandem: chat template %s\n", tmpl->name().c_str());
    } else {
        tokens = model.tokenizer->encode(o.prompt, model.tokenizer->add_bos());
    }
    const int n_ctx = session.n_ctx();
    if (static_cast<int>(tokens.size()) > n_ctx)
        throw Error("the prompt has " + std::to_string(tokens.size()) + " tokens but the context holds " +
                    std::to_string(n_ctx) + " (raise --ctx, at most the model's " +
                    std::to_string(model.config.context_length) + ")");

    // The grammar's constraint (its ends: EOS and the template's end of turn), before any backend is made.
    std::optional<grammar::TokenConstraint> constraint;
    if (o.grammar) {
        constraint.emplace(constrain_after_reasoning
                               ? answer_constraint(model, *o.grammar, turn).answer_after("</think>")
                               : answer_constraint(model, *o.grammar, turn));
        params.constraint = &*constraint;
    }
    session.open_backends();  // the prompt fits: only now are weights copied or uploaded
    if (o.echo && !o.jsonl && !write_stdout(o.prompt)) return 0;
    Generator generator(model, session.backend(), session.cache(), session.draft());
    GenerationStats st;
    // jsonl: the answer (and, with --show-thinking, the reasoning) is collected for the record instead of printed.
    std::string answer, reasoning;
    const auto answer_out = [&](std::string_view text) {
        if (!o.jsonl) return write_stdout(text);
        answer += text;
        return true;
    };
    if (turn && turn->supports_thinking()) {
        // The answer goes to stdout, the thinking wherever the printer puts it.
        ReasoningPrinter printer(o.show_thinking && !o.jsonl);
        ReasoningSplitter splitter(turn->generation_opens_reasoning(),
                                   [&](ReasoningSplitter::Part part, std::string_view text) {
                                       if (part == ReasoningSplitter::Part::Reasoning) {
                                           if (o.jsonl && o.show_thinking) return reasoning += text, true;
                                           return printer.reasoning(text);
                                       }
                                       return printer.end() && answer_out(text);
                                   });
        st = generator.generate(tokens, params, [&](std::string_view text) { return splitter.push(text); });
        if (st.stop != StopReason::OutputClosed) {
            if (!splitter.finish()) return 0;
            const bool unfinished = splitter.in_reasoning();
            if (!printer.end(!unfinished)) return 0;
            if (unfinished)
                std::fprintf(stderr, "tandem: note: the model stopped while thinking, before any answer%s\n",
                             st.stop == StopReason::Length ? " (raise -n)" : "");
        }
    } else {
        st = generator.generate(tokens, params, answer_out);
    }
    if (st.stop == StopReason::OutputClosed) return 0;  // the reader went away: end quietly
    if (st.stop == StopReason::ContextFull)
        std::fprintf(stderr, "\ntandem: stopped: the context of %d tokens is full\n", n_ctx);
    if (o.jsonl && !write_stdout(answer_record(answer,
                                               o.show_thinking && tmpl && tmpl->supports_thinking()
                                                   ? std::optional<std::string>(reasoning)
                                                   : std::nullopt,
                                               st) +
                                 "\n"))
        return 0;
    if (o.stats) print_stats(st, model);
    if (o.stats && constraint)
        std::fprintf(stderr, "grammar masks:      %d, %.3f ms each\n", constraint->mask_calls(),
                     constraint->mask_calls() > 0 ? constraint->mask_seconds() * 1e3 / constraint->mask_calls() : 0.0);
    return 0;
}

}  // namespace tandem
