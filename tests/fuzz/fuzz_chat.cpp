// Fuzz target: the chat REPL's conversation files (/load) and the chat templates.
// Byte 0 picks the mode:
//   even: the payload is a conversation JSON. Parsing either works or throws tandem::Error; what parses writes
//         back (/save) to JSON that parses to the same conversation and writes the same text again;
//   odd:  the payload is a conversation for a template (byte 0 / 2 picks it among ChatTemplate::names()): messages
//         separated by 0x00, each message's first byte its role. Rendering either works or throws tandem::Error,
//         and render(m) == render(normalized(m)) (chat_template.h), with and without the generation prompt. The
//         payload is also given to ChatTemplate::detect as a template's Jinja source.
#include <string>
#include <string_view>
#include <vector>

#include "text/chat_template.h"
#include "error.h"
#include "fuzz_target.h"
#include "app/repl_session.h"

namespace {

using tandem::ChatMessage;

bool same(const std::vector<ChatMessage>& a, const std::vector<ChatMessage>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
        if (a[i].role != b[i].role || a[i].content != b[i].content) return false;
    return true;
}

void conversation_json(std::string_view json) {
    std::string system;
    std::vector<ChatMessage> messages;
    try {
        tandem::conversation_from_json(json, &system, &messages);
    } catch (const tandem::Error&) {
        return;
    }
    const std::string saved = tandem::conversation_to_json(system, messages);
    std::string system2;
    std::vector<ChatMessage> messages2;
    try {
        tandem::conversation_from_json(saved, &system2, &messages2);
    } catch (const tandem::Error& e) {
        tandem::fuzz::fail(std::string("a saved conversation does not load: ") + e.what());
    }
    if (system2 != system || !same(messages2, messages)) tandem::fuzz::fail("a saved conversation loads differently");
    if (tandem::conversation_to_json(system2, messages2) != saved) tandem::fuzz::fail("saving is not stable");
}

void render(std::string_view payload, unsigned selector) {
    const std::vector<std::string> names = tandem::ChatTemplate::names();
    const tandem::ChatTemplate tmpl = *tandem::ChatTemplate::by_name(names[selector % names.size()]);
    static const char* const kRoles[] = {"system", "user", "assistant"};
    std::vector<ChatMessage> messages;
    for (size_t at = 0; at <= payload.size();) {
        const size_t end = std::min(payload.find('\0', at), payload.size());
        const std::string_view part = payload.substr(at, end - at);
        if (!part.empty())
            messages.push_back({kRoles[static_cast<unsigned char>(part[0]) % 3], std::string(part.substr(1))});
        at = end + 1;
    }
    for (bool generation_prompt : {false, true}) {
        std::string text;
        try {
            text = tmpl.render(messages, generation_prompt);
        } catch (const tandem::Error&) {
            return;
        }
        if (tmpl.render(tmpl.normalized(messages), generation_prompt) != text)
            tandem::fuzz::fail(tmpl.name() + ": render(normalized(m)) != render(m)");
    }
    std::string warning;
    (void)tandem::ChatTemplate::detect(std::string(payload), &warning);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1) return 0;
    const std::string_view payload(reinterpret_cast<const char*>(data + 1), size - 1);
    if (data[0] % 2 == 0) conversation_json(payload);
    else render(payload, data[0] / 2u);
    return 0;
}

namespace tandem::fuzz {

std::vector<std::pair<std::string, std::string>> fuzz_seeds() {
    std::vector<std::pair<std::string, std::string>> out;
    const std::vector<ChatMessage> conversation = {
        {"user", "Hi \"there\"\n\\ caf\xc3\xa9 \xf0\x9f\x98\x80"}, {"assistant", "  <think>x</think> Hello!  "},
        {"user", "\x01\x1f tab\t"}};
    out.emplace_back("json-saved", std::string(1, '\0') + conversation_to_json("Be brief.", conversation));
    out.emplace_back("json-others",
                     std::string(1, '\0') + R"({"model": {"a": [1, -2.5e3, true, null, "\u00e9\ud83d\ude00"]},)"
                                            R"( "messages": [{"role": "system", "content": "s"},)"
                                            R"( {"role": "user", "content": "q", "extra": {}}], "system": null})");
    const size_t n_templates = ChatTemplate::names().size();
    for (size_t t = 0; t < n_templates; ++t) {
        std::string turns;
        // Role bytes 3 (system: 3 % 3; 0 is the separator), 1 (user), 2 (assistant).
        for (const char* message : {"\x03 Be brief. ", "\x01Hi  ", "\x02<think>a</think>\nHello", "\x01 and?"}) {
            if (!turns.empty()) turns += '\0';
            turns += message;
        }
        out.emplace_back("render-" + ChatTemplate::names()[t], std::string(1, static_cast<char>(1 + 2 * t)) + turns);
    }
    return out;
}

}  // namespace tandem::fuzz
