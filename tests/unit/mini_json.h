// A small JSON reader for the test fixtures (reference files of independent implementations): objects, arrays,
// strings with every escape (\uXXXX and surrogate pairs included), numbers, true/false/null. Throws on bad input.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "text/utf8.h"

namespace tandem::test {

struct Json {
    enum Kind { Null, Bool, Number, String, Array, Object } kind = Null;
    bool b = false;
    double num = 0;
    std::string str;
    std::vector<Json> arr;
    std::map<std::string, Json> obj;

    const Json& operator[](const std::string& key) const {
        auto it = obj.find(key);
        if (kind != Object || it == obj.end()) throw std::runtime_error("json: no key '" + key + "'");
        return it->second;
    }
    const Json& operator[](size_t i) const { return arr.at(i); }
    bool has(const std::string& key) const { return kind == Object && obj.count(key) > 0; }
    size_t size() const { return kind == Array ? arr.size() : obj.size(); }
    std::vector<int> ints() const {
        std::vector<int> v;
        for (const Json& j : arr) v.push_back(static_cast<int>(j.num));
        return v;
    }

    static Json parse(const std::string& text) {
        size_t pos = 0;
        Json j = parse_value(text, pos);
        skip_ws(text, pos);
        if (pos != text.size()) throw std::runtime_error("json: trailing characters");
        return j;
    }

private:
    static void skip_ws(const std::string& s, size_t& p) {
        while (p < s.size() && (s[p] == ' ' || s[p] == '\n' || s[p] == '\r' || s[p] == '\t')) ++p;
    }
    static void expect(const std::string& s, size_t& p, char c) {
        skip_ws(s, p);
        if (p >= s.size() || s[p] != c) throw std::runtime_error(std::string("json: expected '") + c + "'");
        ++p;
    }
    static uint32_t hex4(const std::string& s, size_t& p) {
        if (p + 4 > s.size()) throw std::runtime_error("json: short \\u escape");
        const uint32_t v = static_cast<uint32_t>(std::stoul(s.substr(p, 4), nullptr, 16));
        p += 4;
        return v;
    }
    static std::string parse_string(const std::string& s, size_t& p) {
        expect(s, p, '"');
        std::string out;
        while (p < s.size() && s[p] != '"') {
            if (s[p] != '\\') {
                out += s[p++];
                continue;
            }
            ++p;
            const char e = s.at(p++);
            switch (e) {
                case 'n': out += '\n'; break;
                case 't': out += '\t'; break;
                case 'r': out += '\r'; break;
                case 'b': out += '\b'; break;
                case 'f': out += '\f'; break;
                case 'u': {
                    uint32_t cp = hex4(s, p);
                    if (cp >= 0xD800 && cp < 0xDC00 && p + 1 < s.size() && s[p] == '\\' && s[p + 1] == 'u') {
                        p += 2;
                        const uint32_t lo = hex4(s, p);
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    }
                    utf8::append(out, cp);
                    break;
                }
                default: out += e;  // \" \\ \/
            }
        }
        if (p >= s.size()) throw std::runtime_error("json: unterminated string");
        ++p;
        return out;
    }
    static Json parse_value(const std::string& s, size_t& p) {
        skip_ws(s, p);
        if (p >= s.size()) throw std::runtime_error("json: unexpected end");
        Json j;
        const char c = s[p];
        if (c == '{') {
            j.kind = Object;
            ++p;
            skip_ws(s, p);
            if (s[p] == '}') return ++p, j;
            for (;;) {
                std::string key = parse_string(s, p);
                expect(s, p, ':');
                j.obj[key] = parse_value(s, p);
                skip_ws(s, p);
                if (s[p] == ',') { ++p; continue; }
                expect(s, p, '}');
                return j;
            }
        }
        if (c == '[') {
            j.kind = Array;
            ++p;
            skip_ws(s, p);
            if (s[p] == ']') return ++p, j;
            for (;;) {
                j.arr.push_back(parse_value(s, p));
                skip_ws(s, p);
                if (s[p] == ',') { ++p; continue; }
                expect(s, p, ']');
                return j;
            }
        }
        if (c == '"') {
            j.kind = String;
            j.str = parse_string(s, p);
            return j;
        }
        if (s.compare(p, 4, "true") == 0) return p += 4, j.kind = Bool, j.b = true, j;
        if (s.compare(p, 5, "false") == 0) return p += 5, j.kind = Bool, j;
        if (s.compare(p, 4, "null") == 0) return p += 4, j;
        size_t used = 0;
        j.kind = Number;
        j.num = std::stod(s.substr(p, 32), &used);
        p += used;
        return j;
    }
};

}  // namespace tandem::test
