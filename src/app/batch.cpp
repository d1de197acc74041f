// The sequential --batch runner (batch.h).
#include "app/batch.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <list>
#include <memory>
#include <random>
#include <unordered_map>
#include <utility>

#include "app/answer_grammar.h"
#include "app/answer_record.h"
#include "app/batch_output.h"
#include "app/batch_request.h"
#include "app/prompt_answer.h"
#include "app/prompt_reuse.h"
#include "cpu/cpu_backend.h"
#include "error.h"
#include "generate/continuous_batcher.h"

namespace tandem {

namespace {

// Constraints built from the lines' schemas, by the schema's compact JSON: lines that repeat a schema (the usual
// batch) share one vocabulary trie and memo of masks instead of building them again per line. Building one walks the
// whole vocabulary, and a constraint's trie and memo take memory of their own, so only the last few are kept.
class SchemaConstraints {
public:
    static constexpr size_t kKept = 4;

    // The constraint of `schema_json` at its start. Throws tandem::Error with the converter's message.
    const grammar::TokenConstraint& get(const Model& model, const std::optional<ChatTemplate>& tmpl,
                                        const std::string& schema_json) {
        for (auto it = kept_.begin(); it != kept_.end(); ++it)
            if (it->first == schema_json) {
                kept_.splice(kept_.begin(), kept_, it);  // most recently used first
                return kept_.front().second;
            }
        grammar::TokenConstraint built =
            answer_constraint(model, read_grammar(GrammarSource::JsonSchema, schema_json), tmpl);
        if (kept_.size() == kKept) kept_.pop_back();
        kept_.emplace_front(schema_json, std::move(built));
        return kept_.front().second;
    }

private:
    std::list<std::pair<std::string, grammar::TokenConstraint>> kept_;
};

}  // namespace

namespace {

// A line made ready: its record id, and the prompt prepared, or the error its record gets.
struct ReadyLine {
    std::string id;
    std::optional<PreparedPrompt> prepared;
    std::string error;
};

// Reads lines until one that is not blank; nullopt at the end of the input. What is wrong with the line itself
// becomes its error (the engine's failures are the run's: they propagate).
std::optional<ReadyLine> read_line(Session& session, BatchInput& input, const BatchOptions& options,
                                   const grammar::TokenConstraint* flag_grammar, SchemaConstraints& schemas) {
    for (;;) {
        const std::optional<std::string> text = input.next_line();
        if (!text) return std::nullopt;
        if (is_blank_line(*text)) continue;
        const BatchLine line = parse_batch_line(*text, input.line_number());
        ReadyLine ready{line.id, std::nullopt, line.error};
        if (!ready.error.empty()) return ready;
        const BatchRequest& r = line.request;
        try {
            const grammar::TokenConstraint* grammar = flag_grammar;
            if (r.json_schema) {
                try {
                    grammar = &schemas.get(session.model(), session.chat_template(), *r.json_schema);
                } catch (const Error& e) {
                    throw Error(std::string("\"json_schema\": ") + e.what());
                }
            }
            GenerationParams defaults = options.params;
            if (!options.seed_given) defaults.sampler.seed = std::random_device{}();
            ready.prepared = prepare_prompt(session, {.prompt = r.prompt,
                                                      .system = r.system.value_or(options.system),
                                                      .params = request_params(r, defaults),
                                                      .grammar = grammar});
        } catch (const Error& e) {
            ready.error = e.what();
        }
        return ready;
    }
}

// A line's record fields: the answer's, and for a sampled line the seed it ran with, so that any record can be
// reproduced (`tandem -p PROMPT --seed SEED`), also where the seed was drawn at random.
std::string line_fields(const PromptAnswer& a, const PreparedPrompt& prepared) {
    std::string fields = answer_record_fields(a.text, a.reasoning, a.stats);
    if (prepared.params.sampler.temperature > 0.0f)
        fields += ", \"seed\": " + std::to_string(prepared.params.sampler.seed);
    return fields;
}

// --parallel's default: 8 sequences in flight (on the 2-core CPU this project measures on, aggregate decode speed
// grows little beyond: docs/batch.md), fewer where 8 KV caches of the session's context, each filled, would take
// more than half of physical memory (each slot reserves its whole context).
int default_parallel(const Session& session) {
    const ModelConfig& c = session.model().config;
    const size_t phys = static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t per_slot =
        CpuKvCache::bytes_needed(c.n_layers, session.n_ctx(), c.kv_dim(),
                                 parse_cpu_kv_type(session.options().backends.kv_type).value_or(CpuKvType::F16));
    return static_cast<int>(std::clamp<size_t>(phys / 2 / std::max<size_t>(1, per_slot), 1, 8));
}

}  // namespace

int run_batch(Session& session, BatchInput& input, const BatchOptions& options) {
    const std::optional<ChatTemplate>& tmpl = session.chat_template();
    if (tmpl && !tmpl->is_raw() && session.verbose())
        std::fprintf(stderr, "tandem: chat template %s\n", tmpl->name().c_str());
    // The command line's grammar: built once, every line without a schema of its own takes a copy.
    std::optional<grammar::TokenConstraint> flag_grammar;
    if (options.grammar) flag_grammar.emplace(answer_constraint(session.model(), *options.grammar, tmpl));
    SchemaConstraints schemas;
    BatchWriter writer;
    BatchProgress progress(input.requests());
    const int parallel = options.parallel > 0 ? options.parallel : default_parallel(session);
    if (session.verbose())
        std::fprintf(stderr, "tandem: batch: %d sequences in flight at most%s\n", parallel,
                     parallel > 1 ? " (continuous batching, plain decoding)" : " (one after another)");
    bool closed = false;  // stdout went away: the run ends quietly
    std::optional<BatcherStats> batcher_stats;
    const auto next_line = [&]() -> std::optional<ReadyLine> {
        while (!closed) {
            std::optional<ReadyLine> line =
                read_line(session, input, options, flag_grammar ? &*flag_grammar : nullptr, schemas);
            if (!line || line->prepared) return line;
            progress.line_done(/*failed=*/true, 0);
            if (!writer.error(line->id, line->error)) closed = true;
        }
        return std::nullopt;
    };

    if (parallel == 1) {
        // One line after another through the one-shot core, with the session's draft or prompt lookup.
        while (std::optional<ReadyLine> line = next_line()) {
            const PromptAnswer a =
                answer_prompt(session, *line->prepared, {.stream = false, .show_thinking = options.show_thinking});
            progress.line_done(/*failed=*/false, a.stats.n_generated);
            if (!writer.answer(line->id, line_fields(a, *line->prepared))) closed = true;
        }
    } else {
        // Continuous batching: each line in flight keeps its prepared prompt, its own grammar state and its sink.
        struct InFlight {
            std::string id;
            PreparedPrompt prepared;
            std::optional<grammar::TokenConstraint> constraint;
            std::unique_ptr<AnswerSink> sink;
        };
        std::unordered_map<size_t, std::unique_ptr<InFlight>> in_flight;
        size_t tags = 0;
        session.open_backends();
        BatcherOptions batching{.n_parallel = parallel, .n_ctx = session.n_ctx(), .step_tokens = options.params.chunk};
        if (session.prompts().enabled()) {  // the on-disk prompt cache, as one-shot runs use it
            PromptReuser& prompts = session.prompts();
            batching.load_prefix = [&prompts](std::span<const int> prompt, KvCache& cache) {
                return prompts.load_into(prompt, cache);
            };
            batching.save_prefix = [&prompts](std::span<const int> prompt, const KvCache& cache, int computed) {
                prompts.save_from(prompt, cache, computed);
            };
        }
        ContinuousBatcher batcher(session.model(), session.backend(), batching);
        const AnswerOutput collected{.stream = false, .show_thinking = options.show_thinking};
        batcher_stats = batcher.run(
            [&]() -> std::optional<BatchJob> {
                std::optional<ReadyLine> line = next_line();
                if (!line) return std::nullopt;
                auto f = std::make_unique<InFlight>();
                f->id = std::move(line->id);
                f->prepared = std::move(*line->prepared);
                f->constraint = f->prepared.constraint;
                f->sink = std::make_unique<AnswerSink>(f->prepared, collected);
                BatchJob job;
                job.tag = tags++;
                job.prompt = f->prepared.tokens;
                job.params = f->prepared.params;
                job.params.constraint = f->constraint ? &*f->constraint : nullptr;
                AnswerSink* sink = f->sink.get();
                job.emit = [sink, &closed](std::string_view text) { return !closed && sink->push(text); };
                in_flight.emplace(job.tag, std::move(f));
                return job;
            },
            [&](BatchJob& job, GenerationStats& stats) {
                const auto it = in_flight.find(job.tag);
                InFlight& f = *it->second;
                const PromptAnswer a = f.sink->finish(std::move(stats), f.constraint ? &*f.constraint : nullptr);
                progress.line_done(/*failed=*/false, a.stats.n_generated);
                if (!closed && !writer.answer(f.id, line_fields(a, f.prepared))) closed = true;
                in_flight.erase(it);
            });
    }
    progress.finish();
    if (closed) return 0;
    if (options.stats) {
        const double s = progress.elapsed_s();
        const auto lines = [](size_t n) { return std::to_string(n) + (n == 1 ? " line" : " lines"); };
        std::fprintf(stderr, "batch: %s answered, %zu failed; %llu tokens generated in %.2f s (%.1f tokens/s)\n",
                     lines(writer.answered()).c_str(), writer.failed(),
                     static_cast<unsigned long long>(progress.tokens()), s, s > 0 ? progress.tokens() / s : 0.0);
        if (batcher_stats && batcher_stats->decode_seconds > 0)
            std::fprintf(stderr,
                         "batch: %d steps, at most %d lines in flight, %ld prompt tokens reused from shared starts "
                         "(%ld of them from the prompt cache); %d decode-only steps: %ld tokens in %.2f s "
                         "(%.1f tokens/s)\n",
                         batcher_stats->steps, batcher_stats->peak_in_flight, batcher_stats->prefix_tokens_reused,
                         batcher_stats->prefix_tokens_loaded, batcher_stats->decode_steps, batcher_stats->decode_tokens,
                         batcher_stats->decode_seconds, batcher_stats->decode_tokens / batcher_stats->decode_seconds);
    }
    return writer.failed() > 0 ? 1 : 0;
}

}  // namespace tandem
