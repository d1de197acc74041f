// One prompt answered once from an empty cache (prompt_answer.h).
#include "app/prompt_answer.h"

#include <cstdio>

#include "app/answer_grammar.h"
#include "app/reasoning_output.h"
#include "app/stream_write.h"
#include "error.h"
#include "sample/sampler.h"
#include "text/chat_prompt.h"
#include "text/reasoning_split.h"

namespace tandem {

PreparedPrompt prepare_prompt(const Session& session, const PromptRequest& request) {
    const Model& model = session.model();
    const std::optional<ChatTemplate>& tmpl = session.chat_template();
    PreparedPrompt p;
    p.params = request.params;
    p.params.constraint = nullptr;  // answer_prompt() points it at the answer's own copy
    Sampler::validate(p.params.sampler);
    // A grammar on a reasoning model's answer applies after its think block, which the prompt then opens itself
    // (where the model would): the grammar starts inside the reasoning (grammar/answer_after.h).
    bool constrain_after_reasoning = false;
    if (tmpl && !tmpl->is_raw()) {
        std::vector<ChatMessage> messages;
        if (!request.system.empty()) messages.push_back({"system", request.system});
        messages.push_back({"user", request.prompt});
        // The template as this turn renders it (smollm3's reasoning mode may come from the system message).
        p.turn = tmpl->for_messages(messages);
        constrain_after_reasoning = request.grammar && p.turn->supports_thinking() && p.turn->thinking();
        p.turn->set_reasoning_opened(constrain_after_reasoning);
        p.tokens = tokenize_chat(*model.tokenizer, *p.turn, messages, /*add_generation_prompt=*/true);
        for (const int id : end_of_turn_ids(*model.tokenizer, *tmpl)) p.params.stop_tokens.push_back(id);
    } else {
        p.tokens = model.tokenizer->encode(request.prompt, model.tokenizer->add_bos());
    }
    if (p.tokens.empty()) throw Error("the prompt is empty (no tokens to start from)");
    const int n_ctx = session.n_ctx();
    if (static_cast<int>(p.tokens.size()) > n_ctx)
        throw Error("the prompt has " + std::to_string(p.tokens.size()) + " tokens but the context holds " +
                    std::to_string(n_ctx) + " (raise --ctx, at most the model's " +
                    std::to_string(model.config.context_length) + ")");
    if (request.grammar) {
        if (constrain_after_reasoning) {
            p.constraint.emplace(request.grammar->answer_after("</think>"));
        } else {
            p.constraint.emplace(*request.grammar);
            p.constraint->reset();
        }
    }
    return p;
}

PromptAnswer answer_prompt(Session& session, const PreparedPrompt& prepared, const AnswerOutput& output) {
    session.open_backends();  // the prompt fits: only now are weights copied or uploaded (once)
    // Every answer starts from an empty context, as a one-shot run does, or from what the prompt cache holds of
    // its prompt: the same bits (prompt_cache.h).
    session.cache().truncate(0);
    if (KvCache* draft_cache = session.draft().cache) draft_cache->truncate(0);
    PromptAnswer a;
    if (output.stream && !output.echo.empty() && !write_stdout(output.echo)) {
        a.stats.stop = StopReason::OutputClosed;
        return a;
    }
    a.prompt_reuse = session.prompts().load(prepared.tokens);
    const int cached = a.prompt_reuse.n_loaded;
    GenerationParams params = prepared.params;
    std::optional<grammar::TokenConstraint> constraint = prepared.constraint;  // a copy: `prepared` stays as it is
    if (constraint) params.constraint = &*constraint;
    Generator generator(session.model(), session.backend(), session.cache(), session.draft());
    // Collected output: the answer (and, with show_thinking, the reasoning) go into the record instead.
    std::string reasoning;
    const auto answer_out = [&](std::string_view text) {
        if (output.stream) return write_stdout(text);
        a.text += text;
        return true;
    };
    const std::optional<ChatTemplate>& turn = prepared.turn;
    if (turn && turn->supports_thinking()) {
        // The answer goes to stdout, the thinking wherever the printer puts it.
        ReasoningPrinter printer(output.show_thinking && output.stream);
        ReasoningSplitter splitter(turn->generation_opens_reasoning(),
                                   [&](ReasoningSplitter::Part part, std::string_view text) {
                                       if (part == ReasoningSplitter::Part::Reasoning) {
                                           if (!output.stream && output.show_thinking) return reasoning += text, true;
                                           return printer.reasoning(text);
                                       }
                                       return printer.end() && answer_out(text);
                                   });
        a.stats = generator.generate(
            prepared.tokens, params, [&](std::string_view text) { return splitter.push(text); }, {}, cached);
        if (a.stats.stop != StopReason::OutputClosed) {
            const bool flushed = splitter.finish();
            const bool unfinished = splitter.in_reasoning();
            if (!flushed || !printer.end(!unfinished)) {
                a.stats.stop = StopReason::OutputClosed;
            } else if (unfinished) {
                std::fprintf(stderr, "tandem: note: the model stopped while thinking, before any answer%s\n",
                             a.stats.stop == StopReason::Length ? " (raise -n)" : "");
            }
        }
        if (!output.stream && output.show_thinking) a.reasoning = std::move(reasoning);
    } else {
        a.stats = generator.generate(prepared.tokens, params, answer_out, {}, cached);
    }
    // The time to the first token counts the lookup and the load; then the prompt is saved (after the answer, so
    // that saving never delays it).
    a.stats.ttft_s += a.prompt_reuse.seconds;
    session.prompts().save(prepared.tokens, a.prompt_reuse);
    if (constraint) {
        a.mask_calls = constraint->mask_calls();
        a.mask_seconds = constraint->mask_seconds();
    }
    return a;
}

}  // namespace tandem
