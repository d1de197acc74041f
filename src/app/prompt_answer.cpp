// One prompt answered once from an empty cache (prompt_answer.h).
#include "app/prompt_answer.h"

#include <cstdio>

#include "app/answer_grammar.h"
#include "app/stream_write.h"
#include "error.h"
#include "sample/sampler.h"
#include "text/chat_prompt.h"

namespace tandem {

PreparedPrompt prepare_prompt(const Session& session, const PromptRequest& request) {
    const Model& model = session.model();
    const std::optional<ChatTemplate>& tmpl = session.chat_template();
    PreparedPrompt p;
    p.params = request.params;
    p.params.constraint = nullptr;  // answer_prompt() points it at the answer's own copy
    Sampler::validate(p.params.sampler);
    // A grammar on a reasoning model's answer applies after its think block (open_reasoning_for_grammar).
    bool constrain_after_reasoning = false;
    if (tmpl && !tmpl->is_raw()) {
        std::vector<ChatMessage> messages;
        if (!request.system.empty()) messages.push_back({"system", request.system});
        messages.push_back({"user", request.prompt});
        // The template as this turn renders it (smollm3's reasoning mode may come from the system message).
        p.turn = tmpl->for_messages(messages);
        constrain_after_reasoning = open_reasoning_for_grammar(*p.turn, request.grammar != nullptr);
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
    if (request.grammar) p.constraint.emplace(constraint_for_turn(*request.grammar, constrain_after_reasoning));
    return p;
}

AnswerSink::AnswerSink(const PreparedPrompt& prepared, const AnswerOutput& output) : output_(output) {
    const std::optional<ChatTemplate>& turn = prepared.turn;
    if (!turn || !turn->supports_thinking()) return;
    // The answer goes to stdout (or the record), the thinking wherever the printer puts it.
    printer_.emplace(output_.show_thinking && output_.stream);
    splitter_.emplace(turn->generation_opens_reasoning(), [this](ReasoningSplitter::Part part, std::string_view text) {
        if (part == ReasoningSplitter::Part::Reasoning) {
            if (!output_.stream && output_.show_thinking) return reasoning_ += text, true;
            return printer_->reasoning(text);
        }
        return printer_->end() && answer(text);
    });
}

bool AnswerSink::answer(std::string_view text) {
    if (output_.stream) return write_stdout(text);
    answer_.text += text;
    return true;
}

bool AnswerSink::push(std::string_view text) { return splitter_ ? splitter_->push(text) : answer(text); }

PromptAnswer AnswerSink::finish(GenerationStats stats, const grammar::TokenConstraint* constraint) {
    answer_.stats = std::move(stats);
    if (splitter_) {
        if (answer_.stats.stop != StopReason::OutputClosed) {
            const bool flushed = splitter_->finish();
            const bool unfinished = splitter_->in_reasoning();
            if (!flushed || !printer_->end(!unfinished)) {
                answer_.stats.stop = StopReason::OutputClosed;
            } else if (unfinished) {
                std::fprintf(stderr, "tandem: note: the model stopped while thinking, before any answer%s\n",
                             answer_.stats.stop == StopReason::Length ? " (raise -n)" : "");
            }
        }
        if (!output_.stream && output_.show_thinking) answer_.reasoning = std::move(reasoning_);
    }
    if (constraint) {
        answer_.mask_calls = constraint->mask_calls();
        answer_.mask_seconds = constraint->mask_seconds();
    }
    return std::move(answer_);
}

PromptAnswer answer_prompt(Session& session, const PreparedPrompt& prepared, const AnswerOutput& output) {
    session.open_backends();  // the prompt fits: only now are weights copied or uploaded (once)
    // Every answer starts from an empty context, as a one-shot run does, or from what the prompt cache holds of
    // its prompt: the same bits (prompt_cache.h).
    session.cache().truncate(0);
    if (KvCache* draft_cache = session.draft().cache) draft_cache->truncate(0);
    if (output.stream && !output.echo.empty() && !write_stdout(output.echo)) {
        PromptAnswer a;
        a.stats.stop = StopReason::OutputClosed;
        return a;
    }
    const PromptReuse reuse = session.prompts().load(prepared.tokens);
    GenerationParams params = prepared.params;
    std::optional<grammar::TokenConstraint> constraint = prepared.constraint;  // a copy: `prepared` stays as it is
    if (constraint) params.constraint = &*constraint;
    Generator generator(session.model(), session.backend(), session.cache(), session.draft());
    AnswerSink sink(prepared, output);
    GenerationStats stats = generator.generate(
        prepared.tokens, params, [&](std::string_view text) { return sink.push(text); }, {}, reuse.n_loaded);
    // The time to the first token counts the lookup and the load; then the prompt is saved (after the answer, so
    // that saving never delays it).
    stats.ttft_s += reuse.seconds;
    PromptAnswer a = sink.finish(std::move(stats), constraint ? &*constraint : nullptr);
    a.prompt_reuse = reuse;
    session.prompts().save(prepared.tokens, a.prompt_reuse);
    return a;
}

}  // namespace tandem
