// TokenMasker: the vocabulary's byte trie, the masking walk over it and the per-state memo.
#include "grammar/token_mask.h"

#include <algorithm>
#include <cstring>
#include <numeric>

namespace tandem::grammar {

size_t TokenBitset::count() const {
    size_t n = 0;
    for (const uint64_t w : words) n += static_cast<size_t>(__builtin_popcountll(w));
    return n;
}

std::vector<int32_t> TokenBitset::ids() const {
    std::vector<int32_t> out;
    for (size_t w = 0; w < words.size(); ++w)
        for (uint64_t bits = words[w]; bits != 0; bits &= bits - 1)
            out.push_back(static_cast<int32_t>(w * 64 + static_cast<size_t>(__builtin_ctzll(bits))));
    return out;
}

TokenMasker::TokenMasker(const std::vector<std::string>& token_bytes) : vocab_size_(token_bytes.size()) {
    std::vector<int32_t> order;
    for (size_t id = 0; id < token_bytes.size(); ++id)
        if (!token_bytes[id].empty()) order.push_back(static_cast<int32_t>(id));
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        const int c = token_bytes[a].compare(token_bytes[b]);
        return c != 0 ? c < 0 : a < b;
    });
    // Sorted strings give the trie in depth-first order: each token shares its prefix with the previous one and
    // appends nodes for the rest. `path[d]` is the node at depth d of the previous token.
    nodes_.push_back({0, 0, 0, 0, 0});
    std::vector<uint32_t> path{0};
    const std::string* previous = nullptr;
    for (const int32_t id : order) {
        const std::string& bytes = token_bytes[id];
        size_t common = 0;
        if (previous != nullptr)
            while (common < bytes.size() && common < previous->size() && bytes[common] == (*previous)[common]) ++common;
        while (path.size() > common + 1) {  // close the previous token's nodes below the shared prefix
            nodes_[path.back()].subtree_end = static_cast<uint32_t>(nodes_.size());
            path.pop_back();
        }
        for (size_t d = common; d < bytes.size(); ++d) {
            const auto index = static_cast<uint32_t>(nodes_.size());
            const auto tokens_at = static_cast<uint32_t>(token_ids_.size());
            nodes_.push_back({static_cast<uint32_t>(d + 1), 0, tokens_at, tokens_at, static_cast<uint8_t>(bytes[d])});
            path.push_back(index);
        }
        // Tokens with equal bytes arrive one after another, so a node's tokens are contiguous.
        TrieNode& end = nodes_[path.back()];
        if (end.tokens_begin == end.tokens_end)
            end.tokens_begin = end.tokens_end = static_cast<uint32_t>(token_ids_.size());
        token_ids_.push_back(id);
        end.tokens_end = static_cast<uint32_t>(token_ids_.size());
        previous = &bytes;
    }
    while (!path.empty()) {
        nodes_[path.back()].subtree_end = static_cast<uint32_t>(nodes_.size());
        path.pop_back();
    }
}

std::shared_ptr<const TokenBitset> TokenMasker::allowed(const GrammarMatcher& state) {
    const detail::StackSet& s = state.state_;
    std::string key(sizeof(uint64_t) + sizeof(detail::Utf8Partial) + s.stacks.size() * sizeof(uint32_t), '\0');
    char* out = key.data();
    std::memcpy(out, &state.core_->serial, sizeof(uint64_t));
    out += sizeof(uint64_t);
    const detail::Utf8Partial partial = s.partial;  // its padding is zero: copied member by member below
    std::memcpy(out, &partial.value, sizeof partial.value);
    out[4] = static_cast<char>(partial.remaining);
    out[5] = static_cast<char>(partial.length);
    out += sizeof(detail::Utf8Partial);
    if (!s.stacks.empty()) std::memcpy(out, s.stacks.data(), s.stacks.size() * sizeof(uint32_t));
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
    std::shared_ptr<const TokenBitset> mask = walk(state);
    if (cache_.size() >= kMaxCachedMasks) cache_.clear();
    cache_.emplace(std::move(key), mask);
    return mask;
}

std::shared_ptr<const TokenBitset> TokenMasker::walk(const GrammarMatcher& state) {
    ++walks_;
    auto mask = std::make_shared<TokenBitset>();
    mask->size = vocab_size_;
    mask->words.assign((vocab_size_ + 63) / 64, 0);
    if (state.dead()) return mask;
    detail::MatcherCore& core = *state.core_;
    if (levels_.empty()) levels_.resize(1);
    levels_[0] = state.state_;
    for (uint32_t i = 1; i < nodes_.size();) {
        const TrieNode& node = nodes_[i];
        if (levels_.size() <= node.depth) levels_.resize(node.depth + 1);
        core.step(levels_[node.depth - 1], node.byte, levels_[node.depth]);
        if (levels_[node.depth].stacks.empty()) {
            i = node.subtree_end;  // no token with this prefix fits
            continue;
        }
        for (uint32_t t = node.tokens_begin; t < node.tokens_end; ++t) {
            const auto id = static_cast<size_t>(token_ids_[t]);
            mask->words[id >> 6] |= uint64_t{1} << (id & 63);
        }
        ++i;
    }
    return mask;
}

}  // namespace tandem::grammar
