// A test-only GBNF reader and recogniser (llama.cpp's grammar syntax), independent of the decoding engine: Gbnf(text)
// parses a grammar (throwing std::runtime_error on bad syntax, a missing root or an undefined rule) and accepts(doc)
// says whether `root` matches the whole document, by sets of end positions with memoized rules (left recursion
// throws). For the JSON Schema converter's tests and its fuzz target; small inputs only (no performance goals).
#pragma once
#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace tandem::test {

struct Node {
    enum Kind { Alt, Seq, Lit, Cls, Ref, Rep } kind = Seq;
    std::vector<Node> kids;                             // Alt: sequences; Seq: items; Rep: the repeated item
    std::vector<uint32_t> text;                         // Lit
    std::vector<std::pair<uint32_t, uint32_t>> ranges;  // Cls
    bool negated = false;                               // Cls
    std::string ref;                                    // Ref
    uint64_t lo = 0, hi = 0;                            // Rep (hi UINT64_MAX: unbounded)
};

inline std::vector<uint32_t> decode_utf8(const std::string& s) {
    std::vector<uint32_t> out;
    for (size_t i = 0; i < s.size();) {
        const auto b = static_cast<unsigned char>(s[i]);
        const size_t n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
        uint32_t cp = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
        for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s.at(i + k)) & 0x3F);
        out.push_back(cp);
        i += n;
    }
    return out;
}

class Gbnf {
public:
    explicit Gbnf(const std::string& text) : src_(decode_utf8(text)) {
        for (;;) {
            skip_space(true);
            if (p_ >= src_.size()) break;
            const std::string name = identifier();
            if (name.empty()) bad("expected a rule name");
            skip_space(false);
            for (const char c : std::string("::=")) {
                if (p_ >= src_.size() || src_[p_] != static_cast<uint32_t>(c)) bad("expected ::=");
                ++p_;
            }
            if (rules_.count(name)) bad("rule defined twice: " + name);
            if (order_.empty() && name != "root") bad("the first rule is not root");
            order_.push_back(name);
            rules_[name] = alternatives(false);
            if (p_ < src_.size() && src_[p_] != '\n') bad("expected the end of the rule");
        }
        if (!rules_.count("root")) bad("no root rule");
        for (const std::string& name : refs_)
            if (!rules_.count(name)) bad("undefined rule " + name);
    }

    const std::vector<std::string>& rule_names() const { return order_; }

    bool accepts(const std::string& document) const {
        input_ = decode_utf8(document);
        memo_.clear();
        const std::set<size_t> ends = rule("root", 0);
        return ends.count(input_.size()) > 0;
    }

private:
    std::vector<uint32_t> src_;
    size_t p_ = 0;
    std::map<std::string, Node> rules_;
    std::vector<std::string> order_;
    std::set<std::string> refs_;
    mutable std::vector<uint32_t> input_;
    mutable std::map<std::pair<std::string, size_t>, std::set<size_t>> memo_;
    mutable std::set<std::pair<std::string, size_t>> active_;

    [[noreturn]] void bad(const std::string& what) const {
        throw std::runtime_error("GBNF: " + what + " at " + std::to_string(p_));
    }
    void skip_space(bool newlines) {
        while (p_ < src_.size()) {
            const uint32_t c = src_[p_];
            if (c == ' ' || c == '\t' || (newlines && (c == '\n' || c == '\r')))
                ++p_;
            else if (c == '#')
                while (p_ < src_.size() && src_[p_] != '\n') ++p_;
            else
                break;
        }
    }
    static bool word_char(uint32_t c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
    }
    std::string identifier() {
        std::string out;
        while (p_ < src_.size() && word_char(src_[p_])) out += static_cast<char>(src_[p_++]);
        return out;
    }
    uint32_t hex(int n) {
        uint32_t v = 0;
        for (int i = 0; i < n; ++i) {
            if (p_ >= src_.size()) bad("short escape");
            const uint32_t c = src_[p_++];
            v <<= 4;
            if (c >= '0' && c <= '9')
                v |= c - '0';
            else if (c >= 'a' && c <= 'f')
                v |= c - 'a' + 10;
            else if (c >= 'A' && c <= 'F')
                v |= c - 'A' + 10;
            else
                bad("bad hex digit");
        }
        return v;
    }
    uint32_t character() {
        if (p_ >= src_.size()) bad("unexpected end");
        const uint32_t c = src_[p_++];
        if (c != '\\') return c;
        if (p_ >= src_.size()) bad("unexpected end");
        switch (src_[p_++]) {
            case 'x': return hex(2);
            case 'u': return hex(4);
            case 'U': return hex(8);
            case 't': return '\t';
            case 'r': return '\r';
            case 'n': return '\n';
            case '\\': return '\\';
            case '"': return '"';
            case '[': return '[';
            case ']': return ']';
            default: bad("unknown escape");
        }
    }
    uint64_t number() {
        uint64_t v = 0;
        const size_t start = p_;
        while (p_ < src_.size() && src_[p_] >= '0' && src_[p_] <= '9') v = v * 10 + (src_[p_++] - '0');
        if (p_ == start) bad("expected a number");
        return v;
    }
    Node alternatives(bool nested) {
        Node alt;
        alt.kind = Node::Alt;
        alt.kids.push_back(sequence(nested));
        while (p_ < src_.size() && src_[p_] == '|') {
            ++p_;
            alt.kids.push_back(sequence(nested));
        }
        return alt;
    }
    Node sequence(bool nested) {
        Node seq;
        seq.kind = Node::Seq;
        for (;;) {
            skip_space(nested);
            if (p_ >= src_.size()) break;
            const uint32_t c = src_[p_];
            if (c == '|' || c == ')' || c == '\n') break;
            Node item;
            if (c == '"') {
                ++p_;
                item.kind = Node::Lit;
                while (p_ < src_.size() && src_[p_] != '"') item.text.push_back(character());
                if (p_ >= src_.size()) bad("unterminated literal");
                ++p_;
            } else if (c == '[') {
                ++p_;
                item.kind = Node::Cls;
                if (p_ < src_.size() && src_[p_] == '^') item.negated = true, ++p_;
                while (p_ < src_.size() && src_[p_] != ']') {
                    const uint32_t lo = character();
                    uint32_t hi = lo;
                    if (p_ + 1 < src_.size() && src_[p_] == '-' && src_[p_ + 1] != ']') {
                        ++p_;
                        hi = character();
                    }
                    item.ranges.emplace_back(lo, hi);
                }
                if (p_ >= src_.size()) bad("unterminated class");
                ++p_;
            } else if (c == '(') {
                ++p_;
                item = alternatives(true);
                skip_space(true);
                if (p_ >= src_.size() || src_[p_] != ')') bad("expected )");
                ++p_;
            } else if (word_char(c)) {
                item.kind = Node::Ref;
                item.ref = identifier();
                refs_.insert(item.ref);
            } else if (c == '.') {
                ++p_;
                item.kind = Node::Cls;
                item.negated = true;
            } else {
                bad("unexpected character");
            }
            // Postfix operators.
            while (p_ < src_.size() && (src_[p_] == '*' || src_[p_] == '+' || src_[p_] == '?' || src_[p_] == '{')) {
                Node rep;
                rep.kind = Node::Rep;
                const uint32_t op = src_[p_++];
                if (op == '*')
                    rep.lo = 0, rep.hi = UINT64_MAX;
                else if (op == '+')
                    rep.lo = 1, rep.hi = UINT64_MAX;
                else if (op == '?')
                    rep.lo = 0, rep.hi = 1;
                else {
                    rep.lo = rep.hi = number();
                    if (p_ < src_.size() && src_[p_] == ',') {
                        ++p_;
                        rep.hi = (p_ < src_.size() && src_[p_] == '}') ? UINT64_MAX : number();
                    }
                    if (p_ >= src_.size() || src_[p_] != '}') bad("expected }");
                    ++p_;
                }
                rep.kids.push_back(std::move(item));
                item = std::move(rep);
            }
            seq.kids.push_back(std::move(item));
        }
        return seq;
    }

    std::set<size_t> rule(const std::string& name, size_t pos) const {
        const auto key = std::make_pair(name, pos);
        if (const auto it = memo_.find(key); it != memo_.end()) return it->second;
        if (!active_.insert(key).second) throw std::runtime_error("GBNF: left recursion through " + name);
        std::set<size_t> out = match(rules_.at(name), pos);
        active_.erase(key);
        memo_[key] = out;
        return out;
    }

    std::set<size_t> match(const Node& n, size_t pos) const {
        std::set<size_t> out;
        switch (n.kind) {
            case Node::Alt:
                for (const Node& k : n.kids) {
                    const std::set<size_t> e = match(k, pos);
                    out.insert(e.begin(), e.end());
                }
                return out;
            case Node::Seq: {
                std::set<size_t> cur = {pos};
                for (const Node& k : n.kids) {
                    std::set<size_t> next;
                    for (const size_t p : cur) {
                        const std::set<size_t> e = match(k, p);
                        next.insert(e.begin(), e.end());
                    }
                    cur = std::move(next);
                    if (cur.empty()) break;
                }
                return cur;
            }
            case Node::Lit:
                if (pos + n.text.size() <= input_.size() &&
                    std::equal(n.text.begin(), n.text.end(), input_.begin() + static_cast<std::ptrdiff_t>(pos)))
                    out.insert(pos + n.text.size());
                return out;
            case Node::Cls: {
                if (pos >= input_.size()) return out;
                bool in = false;
                for (const auto& [lo, hi] : n.ranges) in = in || (input_[pos] >= lo && input_[pos] <= hi);
                if (in != n.negated) out.insert(pos + 1);
                return out;
            }
            case Node::Ref: return rule(n.ref, pos);
            case Node::Rep: {
                std::set<size_t> cur = {pos};
                for (uint64_t i = 0;; ++i) {
                    if (i >= n.lo) out.insert(cur.begin(), cur.end());
                    if (i == n.hi || cur.empty()) break;
                    std::set<size_t> next;
                    for (const size_t p : cur) {
                        const std::set<size_t> e = match(n.kids[0], p);
                        next.insert(e.begin(), e.end());
                    }
                    if (n.hi == UINT64_MAX && i >= n.lo)
                        for (const size_t p : out) next.erase(p);
                    cur = std::move(next);
                }
                return out;
            }
        }
        return out;
    }
};

}  // namespace tandem::test
