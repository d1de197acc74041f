// The sequential --batch runner (batch.h).
#include "app/batch.h"

#include <cstdio>
#include <list>
#include <random>
#include <utility>

#include "app/answer_grammar.h"
#include "app/answer_record.h"
#include "app/batch_output.h"
#include "app/batch_request.h"
#include "app/prompt_answer.h"
#include "error.h"

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

int run_batch(Session& session, BatchInput& input, const BatchOptions& options) {
    const Model& model = session.model();
    const std::optional<ChatTemplate>& tmpl = session.chat_template();
    if (tmpl && !tmpl->is_raw() && session.verbose())
        std::fprintf(stderr, "tandem: chat template %s\n", tmpl->name().c_str());
    // The command line's grammar: built once, every line without a schema of its own takes a copy.
    std::optional<grammar::TokenConstraint> flag_grammar;
    if (options.grammar) flag_grammar.emplace(answer_constraint(model, *options.grammar, tmpl));
    SchemaConstraints schemas;
    BatchWriter writer;
    BatchProgress progress(input.requests());
    while (const std::optional<std::string> text = input.next_line()) {
        if (is_blank_line(*text)) continue;
        const BatchLine line = parse_batch_line(*text, input.line_number());
        // What is wrong with the line itself is its record's error; the engine's failures are the run's.
        std::optional<PreparedPrompt> prepared;
        std::string error = line.error;
        if (error.empty()) {
            const BatchRequest& r = line.request;
            try {
                const grammar::TokenConstraint* grammar = flag_grammar ? &*flag_grammar : nullptr;
                if (r.json_schema) {
                    try {
                        grammar = &schemas.get(model, tmpl, *r.json_schema);
                    } catch (const Error& e) {
                        throw Error(std::string("\"json_schema\": ") + e.what());
                    }
                }
                GenerationParams defaults = options.params;
                if (!options.seed_given) defaults.sampler.seed = std::random_device{}();
                prepared = prepare_prompt(session, {.prompt = r.prompt,
                                                    .system = r.system.value_or(options.system),
                                                    .params = request_params(r, defaults),
                                                    .grammar = grammar});
            } catch (const Error& e) {
                error = e.what();
            }
        }
        if (!error.empty()) {
            progress.line_done(/*failed=*/true, 0);
            if (!writer.error(line.id, error)) return 0;
            continue;
        }
        const PromptAnswer a =
            answer_prompt(session, *prepared, {.stream = false, .show_thinking = options.show_thinking});
        progress.line_done(/*failed=*/false, a.stats.n_generated);
        if (!writer.answer(line.id, answer_record_fields(a.text, a.reasoning, a.stats))) return 0;
    }
    progress.finish();
    if (options.stats) {
        const double s = progress.elapsed_s();
        const auto lines = [](size_t n) { return std::to_string(n) + (n == 1 ? " line" : " lines"); };
        std::fprintf(stderr, "batch: %s answered, %zu failed; %llu tokens generated in %.2f s (%.1f tokens/s)\n",
                     lines(writer.answered()).c_str(), writer.failed(),
                     static_cast<unsigned long long>(progress.tokens()), s, s > 0 ? progress.tokens() / s : 0.0);
    }
    return writer.failed() > 0 ? 1 : 0;
}

}  // namespace tandem
