// Checks that several fuzz targets share: a loaded model's forward, and the streaming detokenizer's contract.
#pragma once
#include <string>
#include <vector>

#include "text/bpe_tokenizer.h"
#include "cpu/cpu_backend.h"
#include "fuzz_target.h"
#include "model/model.h"
#include "text/tokenizer.h"

namespace tandem::fuzz {

// A forward of the first and the last token with logits for both, on one CPU thread without repacking: a model
// the loader accepted must run without reading outside its tensors (the sanitizers check that).
inline void run_two_tokens(const Model& model) {
    const int n_vocab = model.config.n_vocab;
    CpuBackend backend(model, 1, 2, {.repack = false});
    auto cache = backend.new_cache(4);
    const int tokens[] = {0, n_vocab - 1};
    std::vector<float> logits(static_cast<size_t>(n_vocab) * 2);
    backend.forward(tokens, *cache, 2, logits.data());
}

// TokenStreamDecoder's contract (tokenizer.h): its pushes and flush concatenate to decode(ids), and each is whole
// UTF-8 characters.
inline void check_stream(const Tokenizer& tok, const std::vector<int>& ids) {
    const std::string whole = tok.decode(ids);
    TokenStreamDecoder stream(tok);
    std::string joined;
    for (size_t i = 0; i <= ids.size(); ++i) {
        const std::string part = i < ids.size() ? stream.push(ids[i]) : stream.flush();
        if (utf8::sanitize(part) != part)
            fail("a streamed piece is not whole UTF-8 characters, after id " + std::to_string(i));
        joined += part;
    }
    if (joined != whole) fail("streamed text differs from decode(): '" + joined + "' vs '" + whole + "'");
}

}  // namespace tandem::fuzz
