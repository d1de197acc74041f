// The answer's grammar: reading it, and its constraint over the model's vocabulary (answer_grammar.h).
#include "app/answer_grammar.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "error.h"
#include "grammar/json_schema.h"
#include "model/model.h"

namespace tandem {

namespace {

std::string read_text_file(const std::string& path, const char* what) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) throw Error(path + ": is a directory, not " + what);
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(path + ": cannot open " + what + ": " + std::strerror(errno));
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) throw Error(path + ": cannot read " + what);
    return ss.str();
}

// Runs `parse`, naming `path` (when there is one) in its error, so a message about line 3 says of which file.
template <typename F>
auto naming(const std::string& path, F&& parse) {
    if (path.empty()) return parse();
    try {
        return parse();
    } catch (const Error& e) {
        throw Error(path + ": " + e.what());
    }
}

}  // namespace

std::vector<int> end_of_turn_ids(const Tokenizer& tokenizer, const ChatTemplate& tmpl) {
    std::vector<int> ids;
    for (const std::string& marker : tmpl.end_of_turn()) {
        const int id = tokenizer.token_id(marker);
        if (id >= 0) ids.push_back(id);
    }
    return ids;
}

grammar::TokenConstraint answer_constraint(const Model& model, const grammar::Grammar& grammar,
                                           const std::optional<ChatTemplate>& tmpl) {
    const Tokenizer& tok = *model.tokenizer;
    std::vector<int> ends = tmpl ? end_of_turn_ids(tok, *tmpl) : std::vector<int>{};
    if (tok.eos() >= 0) ends.push_back(tok.eos());
    return grammar::TokenConstraint(grammar, tok.token_bytes_table(model.config.n_vocab), std::move(ends));
}

grammar::Grammar read_grammar(GrammarSource source, const std::string& arg) {
    switch (source) {
        case GrammarSource::Gbnf: return grammar::parse_gbnf(arg);
        case GrammarSource::GbnfFile: {
            const std::string text = read_text_file(arg, "a grammar file");
            return naming(arg, [&] { return grammar::parse_gbnf(text); });
        }
        case GrammarSource::JsonSchema: {
            const bool file = !arg.empty() && arg[0] == '@';
            const std::string path = file ? arg.substr(1) : "";
            const std::string schema = file ? read_text_file(path, "a JSON schema file") : arg;
            // The converter's grammar is its own output: an error parsing it would be the converter's bug, and is
            // reported as it comes.
            return grammar::parse_gbnf(naming(path, [&] { return json_schema_to_gbnf(schema); }));
        }
    }
    throw Error("unknown grammar source");
}

std::string describe_grammar(GrammarSource source, const std::string& arg) {
    switch (source) {
        case GrammarSource::Gbnf: return "grammar: " + arg;
        case GrammarSource::GbnfFile: return "grammar file " + arg;
        case GrammarSource::JsonSchema:
            return !arg.empty() && arg[0] == '@' ? "JSON schema file " + arg.substr(1) : "JSON schema: " + arg;
    }
    return "";
}

bool open_reasoning_for_grammar(ChatTemplate& turn, bool constrained) {
    const bool after_reasoning = constrained && turn.supports_thinking() && turn.thinking();
    turn.set_reasoning_opened(after_reasoning);
    return after_reasoning;
}

grammar::TokenConstraint constraint_for_turn(const grammar::TokenConstraint& grammar, bool after_reasoning) {
    // The end of the think block of every reasoning template tandem renders (text/chat_template.h).
    if (after_reasoning) return grammar.answer_after("</think>");
    grammar::TokenConstraint copy = grammar;
    copy.reset();
    return copy;
}

grammar::TokenConstraint AnswerGrammar::for_answer() const {
    grammar::TokenConstraint copy = constraint;
    copy.reset();
    return copy;
}

}  // namespace tandem
