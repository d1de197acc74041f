// Architecture fixtures: tiny random-weight GGUF files, one per supported architecture, with every variation of its
// block switched on (QK-norm, post-norms, GELU, a sliding window shorter than the test sequence, layers without
// RoPE, rope_freqs, a head size of its own, fused Q/K/V), written with llama.cpp's tensor names and keys. The files
// are committed in tests/data/arch/ with llama.cpp's logits for them (scripts/make-arch-references), so that each
// architecture's forward pass is checked against an independent implementation.
#pragma once
#include <string>
#include <vector>

namespace tandem {

// The fixtures' names ("llama3", "qwen3", "gemma3", "smollm3", ...).
std::vector<std::string> architecture_fixture_names();
// Writes fixture `name` to `path` (deterministic: the same bytes every time). Throws tandem::Error for an unknown
// name.
void write_architecture_fixture(const std::string& name, const std::string& path);

}  // namespace tandem
