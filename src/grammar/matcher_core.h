// Internal to src/grammar/: the compiled grammar and the arena of parse stacks that GrammarMatcher states point
// into, shared by a matcher and all its copies, and the one-byte step TokenMasker drives directly.
//
// The grammar is flattened into a program: per rule, per alternative, its elements (kChar: a character set, kRef: a
// rule) followed by kEnd. A parse stack is a list of program positions, the top one always at a kChar (the next
// character expected) and the ones below where to resume once the rule above finishes. Stacks are hash-consed into
// an arena of (parent stack, top position) nodes, so a stack is one uint32 id, equal stacks have equal ids, and
// copying a state copies ids only. Id 0 is the empty stack: the root rule finished, the grammar may end there.
// The arena only grows; the successor of each node and the closure (expansion of rule references at the top down
// to kChar tops) are computed once and cached in it, which makes a step a few lookups per stack.
//
// Not thread-safe: the arena is mutated by steps, even on a const-looking state; use one core per thread.
#pragma once
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "grammar/gbnf.h"

namespace tandem::grammar::detail {

inline constexpr size_t kMaxStacks = 10000;          // stacks in one state; more is an error (grammar too ambiguous)
inline constexpr size_t kMaxClosureNodes = 1 << 18;  // nodes visited expanding one stack; more is an error

// A code point being decoded: `remaining` continuation bytes still to come, of a `length`-byte character.
struct Utf8Partial {
    uint32_t value = 0;
    uint8_t remaining = 0;
    uint8_t length = 0;
    bool operator==(const Utf8Partial&) const = default;
};

// A matcher's whole state: the stacks alive (sorted, unique ids) and the partial character.
struct StackSet {
    std::vector<uint32_t> stacks;
    Utf8Partial partial;
    bool operator==(const StackSet&) const = default;
};

class MatcherCore {
public:
    // Compiles the grammar. Throws tandem::Error if a rule is left recursive (can derive itself with nothing
    // consumed), which the stack expansion could not finish.
    explicit MatcherCore(const Grammar& grammar);

    const uint64_t serial;  // unique per core: tells apart ids of different arenas (TokenMasker's memo)

    // The state before any input.
    StackSet initial();

    // `in` advanced by one byte into `out` (its vectors reused). A byte no stack can take leaves `out` with no
    // stacks; so does invalid UTF-8. Throws tandem::Error when a state would exceed kMaxStacks.
    void step(const StackSet& in, uint8_t byte, StackSet& out);

private:
    enum class Op : uint8_t { kChar, kRef, kEnd };
    struct Instr {
        Op op;
        uint32_t arg;  // kChar: index into sets_; kRef: rule index
    };
    struct CharSet {
        uint64_t ascii[2] = {0, 0};
        std::vector<CodePointRange> ranges;
        bool matches(uint32_t cp) const;
        bool intersects(uint32_t first, uint32_t last) const;
    };
    static constexpr uint32_t kUnset = 0xFFFFFFFF;
    struct Node {
        uint32_t parent;
        uint32_t pos;
        uint32_t next = kUnset;  // the stack once the top's character is consumed (before expansion)
        uint32_t closure_begin = kUnset;
        uint32_t closure_end = 0;
    };

    std::vector<Instr> program_;
    std::vector<std::vector<uint32_t>> alternative_starts_;  // per rule
    std::vector<CharSet> sets_;
    uint32_t root_;
    std::vector<Node> nodes_;                        // [0] is the empty stack
    std::unordered_map<uint64_t, uint32_t> intern_;  // (parent << 32 | pos) -> node
    std::vector<uint32_t> closures_;                 // the cached closures, back to back
    std::vector<uint32_t> work_, found_;             // scratch of closure()

    static void check_left_recursion(const Grammar& grammar);
    uint32_t intern(uint32_t parent, uint32_t pos);
    uint32_t successor(uint32_t node);
    // Appends the expansion of `node` (kChar-topped stacks, or 0) to out.
    void append_closure(uint32_t node, std::vector<uint32_t>& out);
    void consume(const StackSet& in, uint32_t code_point, StackSet& out);
    void keep_viable(const StackSet& in, const Utf8Partial& partial, StackSet& out) const;
};

}  // namespace tandem::grammar::detail
