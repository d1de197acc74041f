// GrammarMatcher and its MatcherCore: compiling a Grammar into a program, the left-recursion check, the hash-consed
// stack arena, UTF-8 decoding and the one-byte step.
#include "grammar/grammar_matcher.h"

#include <algorithm>
#include <atomic>
#include <unordered_set>

#include "error.h"

namespace tandem::grammar {

namespace detail {

namespace {

std::atomic<uint64_t> next_serial{1};

constexpr uint32_t kMinCodePointForLength[] = {0, 0, 0x80, 0x800, 0x10000};

// The user's rule a (possibly generated "<rule>#<n>") rule belongs to.
std::string user_rule_name(const std::string& name) { return name.substr(0, name.find('#')); }

}  // namespace

bool MatcherCore::CharSet::matches(uint32_t cp) const {
    if (cp < 128) return (ascii[cp >> 6] >> (cp & 63)) & 1;
    auto it = std::upper_bound(ranges.begin(), ranges.end(), cp,
                               [](uint32_t c, const CodePointRange& r) { return c < r.first; });
    return it != ranges.begin() && cp <= std::prev(it)->last;
}

bool MatcherCore::CharSet::intersects(uint32_t first, uint32_t last) const {
    auto it = std::lower_bound(ranges.begin(), ranges.end(), first,
                               [](const CodePointRange& r, uint32_t c) { return r.last < c; });
    return it != ranges.end() && it->first <= last;
}

void MatcherCore::check_left_recursion(const Grammar& grammar) {
    const size_t n = grammar.rules.size();
    // Nullable rules, by counting down each alternative's references not yet known nullable.
    std::vector<char> nullable(n, 0);
    std::vector<std::vector<std::pair<uint32_t, uint32_t>>> occurrences(n);  // rule -> (owner rule, alternative id)
    std::vector<uint32_t> pending;                                           // per alternative id
    std::vector<uint32_t> owner;
    std::vector<uint32_t> queue;
    for (uint32_t r = 0; r < n; ++r) {
        for (const GrammarSequence& alt : grammar.rules[r].alternatives) {
            const bool has_char = std::any_of(alt.begin(), alt.end(), [](const GrammarElement& e) {
                return e.kind == GrammarElement::Kind::kCharSet;
            });
            if (has_char) continue;
            const auto id = static_cast<uint32_t>(pending.size());
            pending.push_back(static_cast<uint32_t>(alt.size()));
            owner.push_back(r);
            for (const GrammarElement& e : alt) occurrences[e.rule].push_back({r, id});
            if (alt.empty() && !nullable[r]) {
                nullable[r] = 1;
                queue.push_back(r);
            }
        }
    }
    while (!queue.empty()) {
        const uint32_t r = queue.back();
        queue.pop_back();
        for (const auto& [owner_rule, alt_id] : occurrences[r])
            if (--pending[alt_id] == 0 && !nullable[owner_rule]) {
                nullable[owner_rule] = 1;
                queue.push_back(owner_rule);
            }
    }
    // Left edges: A -> B when an alternative of A can begin with B. A cycle is left recursion.
    std::vector<std::vector<uint32_t>> edges(n);
    for (uint32_t r = 0; r < n; ++r)
        for (const GrammarSequence& alt : grammar.rules[r].alternatives)
            for (const GrammarElement& e : alt) {
                if (e.kind == GrammarElement::Kind::kCharSet) break;
                edges[r].push_back(e.rule);
                if (!nullable[e.rule]) break;
            }
    enum : uint8_t { kWhite, kGray, kBlack };
    std::vector<uint8_t> color(n, kWhite);
    std::vector<std::pair<uint32_t, size_t>> dfs;  // (rule, next edge)
    for (uint32_t start = 0; start < n; ++start) {
        if (color[start] != kWhite) continue;
        dfs.push_back({start, 0});
        color[start] = kGray;
        while (!dfs.empty()) {
            auto& [rule, next] = dfs.back();
            if (next == edges[rule].size()) {
                color[rule] = kBlack;
                dfs.pop_back();
                continue;
            }
            const uint32_t to = edges[rule][next++];
            if (color[to] == kGray) {
                throw Error("grammar: rule '" + user_rule_name(grammar.rules[to].name) +
                            "' is left recursive (it can begin with itself, consuming nothing), which the matcher "
                            "cannot expand; rewrite it with a repetition, e.g. `expr ::= term (\"+\" term)*`");
            }
            if (color[to] == kWhite) {
                color[to] = kGray;
                dfs.push_back({to, 0});
            }
        }
    }
}

MatcherCore::MatcherCore(const Grammar& grammar) : serial(next_serial++), root_(grammar.root) {
    if (grammar.root >= grammar.rules.size()) throw Error("grammar: no root rule");
    check_left_recursion(grammar);
    alternative_starts_.resize(grammar.rules.size());
    for (size_t r = 0; r < grammar.rules.size(); ++r) {
        for (const GrammarSequence& alt : grammar.rules[r].alternatives) {
            alternative_starts_[r].push_back(static_cast<uint32_t>(program_.size()));
            for (const GrammarElement& e : alt) {
                if (e.kind == GrammarElement::Kind::kRuleRef) {
                    program_.push_back({Op::kRef, e.rule});
                    continue;
                }
                CharSet set;
                set.ranges = e.ranges;
                for (const CodePointRange& range : e.ranges)
                    for (uint32_t c = range.first; c <= std::min<uint32_t>(range.last, 127); ++c)
                        set.ascii[c >> 6] |= uint64_t{1} << (c & 63);
                program_.push_back({Op::kChar, static_cast<uint32_t>(sets_.size())});
                sets_.push_back(std::move(set));
            }
            program_.push_back({Op::kEnd, 0});
        }
    }
    nodes_.push_back({0, kUnset});  // the empty stack
}

uint32_t MatcherCore::intern(uint32_t parent, uint32_t pos) {
    const uint64_t key = (uint64_t{parent} << 32) | pos;
    auto [it, inserted] = intern_.emplace(key, static_cast<uint32_t>(nodes_.size()));
    if (inserted) nodes_.push_back({parent, pos});
    return it->second;
}

uint32_t MatcherCore::successor(uint32_t node) {
    if (nodes_[node].next != kUnset) return nodes_[node].next;
    const uint32_t parent = nodes_[node].parent;
    const uint32_t pos = nodes_[node].pos + 1;
    const uint32_t next = program_[pos].op == Op::kEnd ? parent : intern(parent, pos);
    nodes_[node].next = next;
    return next;
}

void MatcherCore::append_closure(uint32_t node, std::vector<uint32_t>& out) {
    if (node == 0 || program_[nodes_[node].pos].op == Op::kChar) {
        out.push_back(node);
        return;
    }
    if (nodes_[node].closure_begin == kUnset) {
        // Depth-first over the expansions of rule references at the top, down to kChar tops or the empty stack.
        // Left recursion was refused at compile time, so this ends; `visited` keeps shared paths from repeating.
        std::unordered_set<uint32_t> visited{node};
        work_.assign(1, node);
        found_.clear();
        while (!work_.empty()) {
            const uint32_t x = work_.back();
            work_.pop_back();
            if (x == 0 || program_[nodes_[x].pos].op == Op::kChar) {
                found_.push_back(x);
                continue;
            }
            const uint32_t rule = program_[nodes_[x].pos].arg;
            const uint32_t rest = successor(x);
            for (const uint32_t start : alternative_starts_[rule]) {
                const uint32_t y = program_[start].op == Op::kEnd ? rest : intern(rest, start);
                if (visited.insert(y).second) work_.push_back(y);
            }
            if (visited.size() > kMaxClosureNodes)
                throw Error("grammar: too ambiguous (expanding one parse stack visits over " +
                            std::to_string(kMaxClosureNodes) + " stacks)");
        }
        std::sort(found_.begin(), found_.end());
        found_.erase(std::unique(found_.begin(), found_.end()), found_.end());
        nodes_[node].closure_begin = static_cast<uint32_t>(closures_.size());
        closures_.insert(closures_.end(), found_.begin(), found_.end());
        nodes_[node].closure_end = static_cast<uint32_t>(closures_.size());
    }
    out.insert(out.end(), closures_.begin() + nodes_[node].closure_begin, closures_.begin() + nodes_[node].closure_end);
}

StackSet MatcherCore::initial() {
    StackSet state;
    for (const uint32_t start : alternative_starts_[root_])
        append_closure(program_[start].op == Op::kEnd ? 0 : intern(0, start), state.stacks);
    std::sort(state.stacks.begin(), state.stacks.end());
    state.stacks.erase(std::unique(state.stacks.begin(), state.stacks.end()), state.stacks.end());
    return state;
}

void MatcherCore::consume(const StackSet& in, uint32_t code_point, StackSet& out) {
    out.stacks.clear();
    out.partial = {};
    for (const uint32_t s : in.stacks) {
        if (s == 0) continue;
        if (!sets_[program_[nodes_[s].pos].arg].matches(code_point)) continue;
        append_closure(successor(s), out.stacks);
        if (out.stacks.size() > 4 * kMaxStacks) {  // bound the memory before the final deduplication
            std::sort(out.stacks.begin(), out.stacks.end());
            out.stacks.erase(std::unique(out.stacks.begin(), out.stacks.end()), out.stacks.end());
            if (out.stacks.size() > kMaxStacks) break;
        }
    }
    if (out.stacks.size() > 1) {
        std::sort(out.stacks.begin(), out.stacks.end());
        out.stacks.erase(std::unique(out.stacks.begin(), out.stacks.end()), out.stacks.end());
    }
    if (out.stacks.size() > kMaxStacks)
        throw Error("grammar: too ambiguous (over " + std::to_string(kMaxStacks) + " parse stacks at once)");
}

// The stacks of `in` whose next character could still complete `partial`.
void MatcherCore::keep_viable(const StackSet& in, const Utf8Partial& partial, StackSet& out) const {
    const uint32_t shift = 6u * partial.remaining;
    const uint32_t first = std::max(partial.value << shift, kMinCodePointForLength[partial.length]);
    const uint32_t last = std::min((partial.value << shift) | ((1u << shift) - 1), kMaxCodePoint);
    out.stacks.clear();
    out.partial = partial;
    if (first > last) return;
    for (const uint32_t s : in.stacks)
        if (s != 0 && sets_[program_[nodes_[s].pos].arg].intersects(first, last)) out.stacks.push_back(s);
}

void MatcherCore::step(const StackSet& in, uint8_t byte, StackSet& out) {
    if (in.partial.remaining > 0) {
        if ((byte & 0xC0) != 0x80) {
            out.stacks.clear();
            out.partial = {};
            return;
        }
        Utf8Partial partial = in.partial;
        partial.value = (partial.value << 6) | (byte & 0x3Fu);
        --partial.remaining;
        if (partial.remaining > 0) {
            keep_viable(in, partial, out);
            return;
        }
        const uint32_t cp = partial.value;
        if (cp < kMinCodePointForLength[partial.length] || cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF)) {
            out.stacks.clear();
            out.partial = {};
            return;
        }
        consume(in, cp, out);
        return;
    }
    if (byte < 0x80) {
        consume(in, byte, out);
        return;
    }
    Utf8Partial partial;
    if ((byte & 0xE0) == 0xC0)
        partial = {byte & 0x1Fu, 1, 2};
    else if ((byte & 0xF0) == 0xE0)
        partial = {byte & 0x0Fu, 2, 3};
    else if ((byte & 0xF8) == 0xF0)
        partial = {byte & 0x07u, 3, 4};
    else
        partial.length = 0;
    if (partial.length == 0) {  // a continuation byte or 0xF8..0xFF where a character must begin
        out.stacks.clear();
        out.partial = {};
        return;
    }
    keep_viable(in, partial, out);
}

}  // namespace detail

GrammarMatcher::GrammarMatcher(const Grammar& grammar)
    : core_(std::make_shared<detail::MatcherCore>(grammar)), state_(core_->initial()) {}

GrammarMatcher GrammarMatcher::from_gbnf(std::string_view text) { return GrammarMatcher(parse_gbnf(text)); }

bool GrammarMatcher::advance(uint8_t byte) {
    if (dead()) return false;
    detail::StackSet next;
    core_->step(state_, byte, next);
    state_ = std::move(next);
    return !dead();
}

bool GrammarMatcher::advance(std::string_view bytes) {
    for (const char c : bytes)
        if (!advance(static_cast<uint8_t>(c))) return false;
    return !dead();
}

bool GrammarMatcher::accepts() const {
    return state_.partial.remaining == 0 && !state_.stacks.empty() && state_.stacks.front() == 0;
}

void GrammarMatcher::reset() { state_ = core_->initial(); }

uint64_t GrammarMatcher::state_hash() const {
    uint64_t h = 0xcbf29ce484222325ull ^ core_->serial;
    auto mix = [&h](uint64_t v) {
        h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
        h *= 0x100000001b3ull;
    };
    mix(state_.partial.value);
    mix((uint64_t{state_.partial.remaining} << 8) | state_.partial.length);
    for (const uint32_t s : state_.stacks) mix(s);
    return h;
}

}  // namespace tandem::grammar
