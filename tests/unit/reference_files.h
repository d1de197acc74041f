// Parsers for the reference files in tests/data (outputs of llama2.c, an independent implementation).
#pragma once
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace tandem::test {

struct GreedyCase {
    std::string prompt;
    std::vector<int> prompt_ids;
    std::vector<int> generated_ids;
    std::string text;  // the decoded continuation (Python repr unescaped)
};

inline std::vector<int> parse_ids(const std::string& s) {
    std::istringstream in(s);
    std::vector<int> ids;
    int v;
    while (in >> v) ids.push_back(v);
    return ids;
}

// Undoes the Python repr of a str: surrounding quotes and the escapes \n \t \\ \' \".
inline std::string unrepr(const std::string& r) {
    if (r.size() < 2) throw std::runtime_error("bad repr: " + r);
    std::string out;
    for (size_t i = 1; i + 1 < r.size(); ++i) {
        if (r[i] != '\\') {
            out += r[i];
            continue;
        }
        const char e = r[++i];
        out += e == 'n' ? '\n' : e == 't' ? '\t' : e;
    }
    return out;
}

inline std::vector<GreedyCase> read_greedy_reference(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open " + path);
    std::vector<GreedyCase> cases;
    std::string line;
    while (std::getline(in, line)) {
        auto value = [&](const char* key) { return line.substr(std::string(key).size()); };
        if (line.rfind("prompt: ", 0) == 0) {
            cases.push_back({});
            cases.back().prompt = value("prompt: ");
        } else if (line.rfind("prompt_ids: ", 0) == 0) {
            cases.back().prompt_ids = parse_ids(value("prompt_ids: "));
        } else if (line.rfind("generated_ids: ", 0) == 0) {
            cases.back().generated_ids = parse_ids(value("generated_ids: "));
        } else if (line.rfind("text: ", 0) == 0) {
            cases.back().text = unrepr(value("text: "));
        }
    }
    return cases;
}

// LOGITS lines: position → 512 floats.
inline std::map<int, std::vector<float>> read_reference_logits(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open " + path);
    std::map<int, std::vector<float>> out;
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("LOGITS pos=", 0) != 0) continue;
        std::istringstream ss(line.substr(11));
        int pos;
        ss >> pos;
        std::vector<float> v;
        float f;
        while (ss >> f) v.push_back(f);
        out[pos] = v;
    }
    return out;
}

}  // namespace tandem::test
