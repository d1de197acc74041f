// Model::load: file → config → weights → tokenizer, with the cross-checks between them.
#include "model/model.h"

#include "error.h"

namespace tandem {

std::unique_ptr<Model> Model::load(const std::string& path, const std::string& tokenizer_path) {
    auto m = std::make_unique<Model>();
    m->file = GgufFile::open(path);
    m->config = ModelConfig::from_gguf(*m->file);
    m->weights = Weights::from_gguf(*m->file, m->config);
    m->tokenizer = tokenizer_path.empty() ? Tokenizer::from_gguf(*m->file) : Tokenizer::from_model_file(tokenizer_path);
    if (m->tokenizer->n_vocab() > m->config.n_vocab)
        throw Error(path + ": the tokenizer has " + std::to_string(m->tokenizer->n_vocab()) +
                    " tokens but the model only " + std::to_string(m->config.n_vocab));
    return m;
}

}  // namespace tandem
