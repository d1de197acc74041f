// tandem-quantize: GGUF → GGUF with the weight matrices re-encoded as f32, f16, q8_0 or q4_0 (metadata copied,
// general.file_type updated, 1-D tensors kept). The work is requantize_gguf (src/quantize_model.*); this file
// is arguments, the summary on stderr and the exit status.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <string>

#include "error.h"
#include "gguf/gguf.h"
#include "convert/quantize_model.h"

namespace {

int run(const std::string& in_path, const std::string& out_path, const std::string& type_name) {
    // The type is checked before the input is read, so a typo fails fast and touches nothing.
    const std::optional<tandem::GgmlType> type = tandem::parse_output_type(type_name);
    if (!type) throw tandem::Error("unknown type '" + type_name + "' (can: " + tandem::output_type_names() + ")");
    if (std::filesystem::exists(out_path) && std::filesystem::equivalent(in_path, out_path))
        throw tandem::Error("the output would overwrite the input " + in_path);

    const auto in = tandem::GgufFile::open(in_path);
    tandem::QuantizeReport report;
    const tandem::GgufWriter writer = tandem::requantize_gguf(*in, *type, &report);
    writer.write(out_path);  // to a temporary name, renamed on success: a failure leaves no output file
    std::fprintf(stderr, "tandem-quantize: %s -> %s as %s\n%s", in_path.c_str(), out_path.c_str(),
                 tandem::ggml_type_name(*type), report.summary().c_str());
    std::fprintf(stderr, "tandem-quantize: file: %ju -> %ju bytes\n", static_cast<uintmax_t>(in->file_size()),
                 static_cast<uintmax_t>(std::filesystem::file_size(out_path)));
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    std::string in_path, out_path, type_name;
    CLI::App app{"tandem-quantize: rewrite a GGUF model with its weight matrices in another type"};
    app.add_option("input", in_path, "GGUF model to read")->required()->check(CLI::ExistingFile);
    app.add_option("output", out_path, "GGUF file to write")->required();
    app.add_option("type", type_name, "f32, f16, q8_0 or q4_0 (rows that are not whole blocks fall back to f16)")
        ->required();
    CLI11_PARSE(app, argc, argv);
    try {
        return run(in_path, out_path, type_name);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "tandem-quantize: error: %s\n", e.what());
        return 1;
    }
}
