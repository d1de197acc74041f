// tandem's command line: flags → options, then a Session (model, draft, backends) and either the chat REPL, a
// one-shot answer streamed to stdout, or --batch's records. No logic of its own beyond that wiring.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <sstream>

#include "app/batch.h"
#include "app/environment.h"
#include "app/model_registry.h"
#include "app/one_shot.h"
#include "app/repl.h"
#include "app/session.h"
#include "cpu/cpu_backend.h"
#include "cpu/repack_cache.h"
#include "error.h"
#include "grammar/gbnf.h"
#include "prompt_cache/prompt_cache.h"

namespace {

struct Options {
    std::string prompt;
    std::string prompt_file;
    std::string batch;  // --batch FILE, "-" for stdin
    int parallel = 0;   // --parallel (0: the default)
    std::string system_prompt;
    std::string draft_requant = "q4_0";
    std::string kv_type = "f16";
    int n_predict = -1;
    int chunk = 256;
    int threads = 0;
    bool list_models = false;
    bool echo = false;
    bool stats = false;
    bool verbose = false;
    bool chat = false;  // --chat, or a terminal on stdin with no prompt
    std::string think;  // --think on|off ("" = the template's default)
    bool show_thinking = false;
    std::string grammar, grammar_file, json_schema;  // --grammar, --grammar-file, --json-schema
    std::string output_format = "text";              // --output-format text | jsonl
    bool seed_given = false;                         // --seed (else a random one)
    std::optional<std::string> prompt_cache;         // --prompt-cache DIR|off (else the environment's)
    tandem::SessionOptions session;
    tandem::GenerationParams gen;
};

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw tandem::Error(path + ": cannot open the prompt file: " + std::strerror(errno));
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

std::string read_stdin() {
    std::ostringstream ss;
    ss << std::cin.rdbuf();
    return ss.str();
}

int run(Options& opt) {
    // --batch reads its own input (a file now, so that a missing one fails before the model loads; stdin line by
    // line). Otherwise no prompt and a terminal on stdin opens the chat REPL; --chat runs the same loop over a pipe.
    const bool batch = !opt.batch.empty();
    std::optional<tandem::BatchInput> batch_input;
    if (batch) batch_input.emplace(opt.batch);
    const bool chat = !batch && (opt.chat || (opt.prompt.empty() && opt.prompt_file.empty() && isatty(STDIN_FILENO)));
    std::string prompt = opt.prompt;
    if (prompt.empty() && !opt.prompt_file.empty()) {
        prompt = read_file(opt.prompt_file);
    } else if (prompt.empty() && !chat && !batch) {
        prompt = read_stdin();
    }
    tandem::SessionOptions& so = opt.session;
    if (!opt.think.empty()) so.think = opt.think == "on";
    // jsonl is for scripts: a one-shot run or --chat over a pipe. Refused before any model is loaded.
    if (opt.output_format == "jsonl" && chat && isatty(STDIN_FILENO))
        throw tandem::Error(
            "--output-format jsonl is for scripts: give a prompt, or pipe the turns into --chat (the interactive chat "
            "writes text)");
    // The output's grammar, parsed (and a schema converted) before any model is loaded: a bad one fails at once.
    using tandem::GrammarSource;
    const GrammarSource grammar_source = !opt.json_schema.empty()    ? GrammarSource::JsonSchema
                                         : !opt.grammar_file.empty() ? GrammarSource::GbnfFile
                                                                     : GrammarSource::Gbnf;
    const std::string& grammar_arg = !opt.json_schema.empty()    ? opt.json_schema
                                     : !opt.grammar_file.empty() ? opt.grammar_file
                                                                 : opt.grammar;
    std::optional<tandem::grammar::Grammar> grammar;
    if (!grammar_arg.empty()) grammar = tandem::read_grammar(grammar_source, grammar_arg);
    so.draft_requant = tandem::parse_requant(opt.draft_requant);
    so.draft_vocab = opt.gen.speculative.draft_vocab;
    // The prompt cache: --prompt-cache, else TANDEM_PROMPT_CACHE, else under the cache root; "off" turns it off.
    so.prompt_cache.dir = opt.prompt_cache ? (*opt.prompt_cache == "off" ? "" : *opt.prompt_cache)
                                           : tandem::environment().prompt_cache_dir;
    so.backends =
        tandem::backend_settings("tandem", opt.threads, opt.chunk, opt.kv_type, /*long_lived=*/chat, opt.verbose);
    // Lines in flight together decode plainly: a draft would only take memory and, while its copies are checked
    // in the background, bandwidth from the batch (the 1.5B's decode ran 10-15% slower beside the unused default
    // draft). --parallel 1 runs the lines one after another with it.
    if (batch && opt.parallel != 1 && !so.no_draft) {
        if (!so.draft.empty())
            std::fprintf(stderr, "tandem: note: --draft is not used while batch lines run together (--parallel 1 "
                                 "runs them one after another with it)\n");
        so.no_draft = true;
    }
    tandem::Session session(so);

    tandem::GenerationParams params = opt.gen;
    params.n_predict = opt.n_predict;
    params.chunk = opt.chunk;
    if (batch)
        return tandem::run_batch(session, *batch_input,
                                 {.system = opt.system_prompt,
                                  .params = params,
                                  .seed_given = opt.seed_given,
                                  .grammar = grammar,
                                  .show_thinking = opt.show_thinking,
                                  .stats = opt.stats,
                                  .parallel = opt.parallel});
    if (chat) {
        tandem::ReplConfig rc;
        if (grammar)
            rc.grammar.emplace(
                tandem::AnswerGrammar{tandem::describe_grammar(grammar_source, grammar_arg),
                                      tandem::answer_constraint(session.model(), *grammar, session.chat_template())});
        rc.jsonl = opt.output_format == "jsonl";
        session.open_backends();
        rc.chat_template = session.chat_template();
        rc.system = opt.system_prompt;
        rc.params = params;
        rc.interactive = isatty(STDIN_FILENO);
        rc.show_thinking = opt.show_thinking;
        const std::string& name = session.model().config.name;
        rc.model_name = name.empty() ? session.model_path() : name;
        rc.prompts = &session.prompts();
        tandem::Generator generator(session.model(), session.backend(), session.cache(), session.draft());
        return tandem::run_repl(session.model(), generator, session.cache(), session.draft(), rc);
    }
    return tandem::run_one_shot(session, {.prompt = prompt,
                                          .system = opt.system_prompt,
                                          .echo = opt.echo,
                                          .stats = opt.stats,
                                          .show_thinking = opt.show_thinking,
                                          .params = params,
                                          .grammar = grammar,
                                          .jsonl = opt.output_format == "jsonl"});
}

// --list-models: the installed models, and where the disk space of the runs' repacked copies (cpu/repack_cache.h) and
// saved prompts (prompt_cache/prompt_cache.h) goes.
int list_models() {
    std::fputs(tandem::list_installed_table().c_str(), stdout);
    const std::string& cache_dir = tandem::environment().repack_cache_dir;
    if (const tandem::cpu::RepackCacheUsage u = tandem::cpu::repack_cache_usage(cache_dir); u.files > 0)
        std::printf(
            "repacked-weights cache: %zu file%s, %.1f GB in %s (TANDEM_REPACK_CACHE=0 turns it off; "
            "safe to delete)\n",
            u.files, u.files == 1 ? "" : "s", u.bytes / 1e9, cache_dir.c_str());
    const std::string& prompts_dir = tandem::environment().prompt_cache_dir;
    if (const auto u = tandem::prompt_cache::PromptCache({.dir = prompts_dir}).usage(); u.entries > 0)
        std::printf("prompt cache: %zu entr%s, %.2f GB in %s (TANDEM_PROMPT_CACHE=off turns it off; safe to delete)\n",
                    u.entries, u.entries == 1 ? "y" : "ies", u.bytes / 1e9, prompts_dir.c_str());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    std::signal(SIGPIPE, SIG_IGN);  // a closed stdout shows up as a failed write, which ends generation quietly
    Options opt;
    CLI::App app{"tandem: local LLM inference from a GGUF file (streams generated text to stdout)"};
    app.add_option("-m,--model", opt.session.model,
                   "GGUF model file or installed model name (default: " + tandem::default_target() + ")");
    app.add_flag("--no-draft", opt.session.no_draft, "do not use a draft model (not even the default one)");
    app.add_flag("--list-models", opt.list_models, "list the installed models and exit");
    app.add_flag("--raw", opt.session.raw, "feed the prompt as it is, without the model's chat template");
    app.add_option("--system", opt.system_prompt, "system prompt (instruct models)");
    app.add_option("--chat-template", opt.session.chat_template, "chat template family instead of the model's")
        ->check(CLI::IsMember(tandem::ChatTemplate::names()));
    app.add_option("--think", opt.think,
                   "reasoning models (Qwen3, DeepSeek-R1): on (the default) lets the model think before it answers; "
                   "off renders the template's no-thinking form (ignored, with a note, for other models)")
        ->check(CLI::IsMember({"on", "off"}));
    app.add_flag("--show-thinking", opt.show_thinking,
                 "print a reasoning model's thinking on stdout, as a <think>...</think> block before the answer "
                 "(default: on stderr, so that stdout carries only the answer)");
    app.add_option("-p,--prompt", opt.prompt, "prompt text");
    app.add_flag("--chat", opt.chat,
                 "chat: one user turn per line of stdin, one answer per line on stdout (a terminal on stdin with "
                 "no prompt opens the interactive chat)");
    app.add_option("-f,--file", opt.prompt_file, "read the prompt from a file")->check(CLI::ExistingFile);
    app.add_option("--batch", opt.batch,
                   "answer one JSON request per line of FILE (- for stdin), one JSONL record per line on stdout; the "
                   "lines run together by continuous batching, see --parallel (docs/batch.md)")
        ->type_name("FILE")
        ->check(CLI::Validator(
            [](const std::string& v) { return v.empty() ? std::string("needs a file name, or - for stdin") : ""; },
            ""));
    app.add_option("--parallel", opt.parallel,
                   "--batch: sequences in flight at most (default 8, fewer where 8 full KV caches of the context would "
                   "take over half the memory; 1 runs the lines one after another with the draft)")
        ->type_name("N")
        ->check(CLI::Range(1, 256));
    app.add_option("-n,--n-predict", opt.n_predict,
                   "new tokens to generate, per answer in a chat (-1: until EOS or a full context)")
        ->check(CLI::Range(-1, 1 << 30));
    app.add_option("--temp", opt.gen.sampler.temperature, "temperature (0 = greedy)")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 100.0));
    app.add_option("--top-k", opt.gen.sampler.top_k, "keep the k most likely tokens (0 = off)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    app.add_option("--top-p", opt.gen.sampler.top_p, "nucleus sampling threshold (1 = off)")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1.0));
    app.add_option("--min-p", opt.gen.sampler.min_p, "drop tokens below min-p × the top probability (0 = off)")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1.0));
    app.add_option("--repeat-penalty", opt.gen.sampler.repeat_penalty, "penalty for recent tokens (1 = off)")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--repeat-last-n", opt.gen.sampler.repeat_last_n, "how many recent tokens the penalty sees")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    auto* seed_opt = app.add_option("--seed", opt.gen.sampler.seed, "random seed (default: random)");
    app.add_option("--stop", opt.gen.stops, "stop before this string (repeatable)")->take_all();
    auto* output_format_opt =
        app.add_option("--output-format", opt.output_format,
                       "text: the answer as it streams; jsonl: one JSON record per answer (text, token counts, stop "
                       "reason, timings, drafting; docs/usage.md)")
            ->capture_default_str()
            ->check(CLI::IsMember({"text", "jsonl"}));
    auto* grammar_opt = app.add_option("--grammar", opt.grammar,
                                       "the output follows this grammar (llama.cpp's GBNF; root is the start)");
    auto* grammar_file_opt =
        app.add_option("--grammar-file", opt.grammar_file, "the output follows the GBNF grammar in this file")
            ->check(CLI::ExistingFile);
    auto* schema_opt = app.add_option("--json-schema", opt.json_schema,
                                      "the output is JSON valid against this schema (inline JSON, or @FILE; {} for any "
                                      "JSON value)");
    grammar_opt->excludes(grammar_file_opt)->excludes(schema_opt);
    grammar_file_opt->excludes(schema_opt);
    app.add_option("--prompt-cache", opt.prompt_cache,
                   "keep the keys and values of prompts of " + std::to_string(tandem::prompt_cache::kDefaultMinTokens) +
                       " tokens or more in DIR, and load a later prompt's longest saved prefix instead of prefilling "
                       "it (the same output); off: neither. Default: $TANDEM_PROMPT_CACHE, else "
                       "${XDG_CACHE_HOME:-~/.cache}/tandem/prompts, at most " +
                       std::to_string(tandem::prompt_cache::kDefaultMaxBytes >> 30) +
                       " GiB, least recently used entries evicted (docs/prompt-cache.md)")
        ->type_name("DIR|off")
        ->check(CLI::Validator(
            [](const std::string& v) { return v.empty() ? std::string("needs a directory, or off") : ""; }, ""));
    app.add_flag("--echo", opt.echo, "print the prompt before the generated text");
    app.add_flag("--stats", opt.stats, "print timing and throughput statistics to stderr");
    app.add_option("-t,--threads", opt.threads, "CPU threads (default: all cores)")->check(CLI::Range(1, 1024));
    app.add_option("-c,--ctx", opt.session.n_ctx, "context size in tokens (default: the model's, capped to memory)")
        ->check(CLI::Range(1, 1 << 24));
    app.add_option("--chunk", opt.chunk, "prompt tokens per prefill step")
        ->capture_default_str()
        ->check(CLI::Range(1, 1 << 16));
    app.add_option("--tokenizer", opt.session.tokenizer, "sentencepiece .model overriding the GGUF vocabulary")
        ->check(CLI::ExistingFile);
    app.add_option("--backend", opt.session.backend,
                   "compute backend: auto (CUDA when built with it and a GPU answers), cpu, cuda")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
    app.add_option("--kv-type", opt.kv_type,
                   "KV-cache storage: f16, f32 (CPU: the reference precision, twice the memory), or q8_0 (ggml Q8_0 "
                   "blocks, about half of f16's memory; the key/value width must be a multiple of 32)")
        ->capture_default_str()
        ->check(CLI::IsMember({"f32", "f16", "q8_0"}));
    app.add_option("--draft", opt.session.draft, "draft model (same vocabulary) for speculative decoding")
        ->check(CLI::ExistingFile);
    app.add_option("--draft-backend", opt.session.draft_backend, "backend of the draft model: auto, cpu, cuda")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
    app.add_option(
           "--draft-requant", opt.draft_requant,
           "a draft on the CPU reads its weights requantized to this type where that makes them smaller "
           "(q4_0: the 0.5B draft's Q5_0/Q8_0/Q6_K matrices, 279 MB of copies instead of 393 MB), or none; the output "
           "is the target's either way")
        ->capture_default_str()
        ->check(CLI::IsMember({"q4_0", "none"}));
    app.add_option("--draft-max", opt.gen.speculative.draft_max, "most tokens drafted per round")
        ->capture_default_str()
        ->check(CLI::Range(1, 64));
    app.add_option("--draft-min", opt.gen.speculative.draft_min,
                   "fewest tokens drafted per round (0 lets tandem fall back to plain decoding when drafting loses)")
        ->capture_default_str()
        ->check(CLI::Range(0, 64));
    app.add_option("--draft-p-min", opt.gen.speculative.p_min,
                   "stop drafting when the draft's top probability falls below this")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1.0));
    app.add_option("--draft-vocab", opt.gen.speculative.draft_vocab,
                   "the draft computes logits only for ids below this (a BPE vocabulary's frequent ones) and those in "
                   "the context (0: every id); the output is the target's either way")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    app.add_option("--draft-ahead", opt.gen.speculative.draft_ahead,
                   "draft steps taken while the target verifies, guessing that it accepts every draft: -1 while a GPU "
                   "target works, 0 never, n up to n every round; the output is the target's either way")
        ->capture_default_str()
        ->check(CLI::Range(-1, 65));
    app.add_flag(
        "--lookup", opt.gen.speculative.lookup,
        "prompt-lookup drafting: propose what followed the longest earlier match of the context's last tokens");
    app.add_option("--spec-sampling", opt.gen.speculative.sampling,
                   "how sampled speculative decoding verifies: coupled (the draft shares the target's noise; the "
                   "output is exactly --no-draft's for the seed) or rejection (accepts more where the draft is "
                   "weaker; the seed's output then varies with the draft lengths chosen)")
        ->transform(CLI::CheckedTransformer(std::map<std::string, tandem::SpecSampling>{
            {"coupled", tandem::SpecSampling::Coupled}, {"rejection", tandem::SpecSampling::Rejection}}))
        ->default_str("coupled");
    app.add_flag("--spec-trace", opt.gen.speculative.trace,
                 "one stderr line per speculative round (draft length, drafted, accepted, timings), for diagnosis");
    app.add_flag("-v,--verbose", opt.verbose, "log model details to stderr");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }
    opt.seed_given = seed_opt->count() > 0;
    if (!opt.seed_given) opt.gen.sampler.seed = std::random_device{}();
    if (!opt.list_models && opt.gen.speculative.draft_min > opt.gen.speculative.draft_max) {
        std::fprintf(stderr, "tandem: --draft-min must not exceed --draft-max\n");
        return 2;
    }
    if (!opt.list_models && opt.chat && (!opt.prompt.empty() || !opt.prompt_file.empty())) {
        std::fprintf(stderr, "tandem: --chat reads its turns from stdin: give no -p or -f\n");
        return 2;
    }
    if (!opt.list_models && !opt.prompt.empty() && !opt.prompt_file.empty()) {
        std::fprintf(stderr, "tandem: give either -p or -f, not both\n");
        return 2;
    }
    if (!opt.list_models && !opt.batch.empty()) {
        const char* clash = !opt.prompt.empty()                                             ? "-p/--prompt"
                            : !opt.prompt_file.empty()                                      ? "-f/--file"
                            : opt.chat                                                      ? "--chat"
                            : output_format_opt->count() > 0 && opt.output_format == "text" ? "--output-format text"
                                                                                            : nullptr;
        if (clash) {
            std::fprintf(stderr,
                         "tandem: --batch takes its prompts from the batch file and writes JSONL records: give no "
                         "%s\n",
                         clash);
            return 2;
        }
    }
    try {
        for (const std::string& note : tandem::environment().retired)  // read once, before anything runs
            std::fprintf(stderr, "tandem: warning: %s\n", note.c_str());
        if (opt.list_models) return list_models();
        tandem::Sampler::validate(opt.gen.sampler);
        return run(opt);
    } catch (const tandem::Error& e) {
        std::fflush(stdout);
        std::fprintf(stderr, "tandem: error: %s\n", e.what());
        return 1;
    } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "tandem: error: out of memory\n");
        return 1;
    }
}
