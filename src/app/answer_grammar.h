// The grammar an answer follows, as the CLI and the chat hold it: reading it from what the user gave (--grammar,
// --grammar-file, --json-schema, and the chat's /grammar, /grammar-file, /json-schema), and building its
// TokenConstraint over the model's vocabulary with the ids that end an answer (EOS and the chat template's end of
// turn). The one-shot run and the chat build their constraints here, so that both constrain alike.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "grammar/constraint.h"
#include "grammar/gbnf.h"
#include "text/chat_template.h"

namespace tandem {

struct Model;
class Tokenizer;

// The ids of the template's end-of-turn markers that are single tokens of the vocabulary: they end an answer as EOS
// does (none for raw).
std::vector<int> end_of_turn_ids(const Tokenizer& tokenizer, const ChatTemplate& tmpl);

// The constraint for answers rendered through `tmpl` (nullopt or raw: plain continuation): the vocabulary as bytes,
// and as end ids EOS and the template's end-of-turn tokens, so an answer can end only where the grammar accepts.
// Building one builds a trie over the whole vocabulary: build it once per grammar and give each answer a copy
// (AnswerGrammar::for_answer). It constrains from the answer's first token: a turn whose reasoning comes first
// takes constraint_for_turn's (below). Throws tandem::Error for a grammar the matcher refuses
// (left recursion).
grammar::TokenConstraint answer_constraint(const Model& model, const grammar::Grammar& grammar,
                                           const std::optional<ChatTemplate>& tmpl);

// A grammar on a reasoning turn's answer (a template with a thinking switch, thinking on) applies after the think
// block, which the prompt then opens itself, where the model would (qwen3, smollm3; deepseek-r1's prompt opens it
// anyway). Call before rendering `turn` (the template as this turn renders it), with whether the answer follows a
// grammar; returns whether the answer's constraint starts after the reasoning (constraint_for_turn).
bool open_reasoning_for_grammar(ChatTemplate& turn, bool constrained);

// One answer's constraint, from `grammar` (at its start, shared, never advanced): a reset copy, or, after_reasoning,
// free text up to the end of the think block, then the grammar (TokenConstraint::answer_after).
grammar::TokenConstraint constraint_for_turn(const grammar::TokenConstraint& grammar, bool after_reasoning);

// Where a grammar comes from.
enum class GrammarSource {
    Gbnf,        // GBNF text
    GbnfFile,    // the path of a GBNF file
    JsonSchema,  // a JSON schema: inline JSON, or @PATH of a file that holds it
};

// The grammar `arg` stands for, parsed (a schema converted to GBNF first). Throws tandem::Error with the parsers'
// message (GBNF: line and column; a schema: line and column of bad JSON, or the keyword it cannot convert), prefixed
// by the path for a file; and for a file that cannot be read.
grammar::Grammar read_grammar(GrammarSource source, const std::string& arg);

// How the chat names a grammar when asked which one is active: "grammar: TEXT", "grammar file PATH",
// "JSON schema: TEXT" or "JSON schema file PATH".
std::string describe_grammar(GrammarSource source, const std::string& arg);

// The grammar every answer of a chat follows until it is changed: what the user gave and its constraint, built once.
struct AnswerGrammar {
    std::string description;              // describe_grammar()
    grammar::TokenConstraint constraint;  // at the grammar's start; never advanced itself

    // A constraint for one answer: a copy (sharing the vocabulary's trie and the memo of masks, so cheap), reset
    // to the grammar's start.
    grammar::TokenConstraint for_answer() const;
};

}  // namespace tandem
