// A loaded model: the mapped GGUF file, its hyperparameters, typed weight views and tokenizer. Backend-neutral;
// a Backend computes with it.
#pragma once
#include <memory>
#include <string>

#include "gguf/gguf.h"
#include "model/model_config.h"
#include "model/weights.h"
#include "text/tokenizer.h"

namespace tandem {

struct Model {
    std::unique_ptr<GgufFile> file;
    ModelConfig config;
    Weights weights;
    std::unique_ptr<Tokenizer> tokenizer;

    // Opens and validates `path`; `tokenizer_path` (a sentencepiece .model) overrides the GGUF's vocabulary.
    static std::unique_ptr<Model> load(const std::string& path, const std::string& tokenizer_path = "");
};

}  // namespace tandem
