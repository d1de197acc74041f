// The table behind ggml_types.h.
#include "gguf/ggml_types.h"

#include <algorithm>
#include <cctype>
#include <strings.h>

namespace tandem {
namespace {

struct Entry {
    uint32_t id;
    GgmlTypeInfo info;
};

// Block geometry from ggml's type traits (QK4_0 = 32, QK_K = 256, ...).
constexpr Entry kTypes[] = {
    {0, {"f32", 1, 4, true}},          {1, {"f16", 1, 2, true}},          {2, {"q4_0", 32, 18, true}},
    {3, {"q4_1", 32, 20, true}},       {6, {"q5_0", 32, 22, true}},       {7, {"q5_1", 32, 24, true}},
    {8, {"q8_0", 32, 34, true}},       {9, {"q8_1", 32, 36, false}},      {10, {"q2_K", 256, 84, true}},
    {11, {"q3_K", 256, 110, true}},    {12, {"q4_K", 256, 144, true}},    {13, {"q5_K", 256, 176, true}},
    {14, {"q6_K", 256, 210, true}},    {15, {"q8_K", 256, 292, false}},   {16, {"iq2_xxs", 256, 66, false}},
    {17, {"iq2_xs", 256, 74, false}},  {18, {"iq3_xxs", 256, 98, false}}, {19, {"iq1_s", 256, 50, false}},
    {20, {"iq4_nl", 32, 18, false}},   {21, {"iq3_s", 256, 110, false}},  {22, {"iq2_s", 256, 82, false}},
    {23, {"iq4_xs", 256, 136, false}}, {24, {"i8", 1, 1, false}},         {25, {"i16", 1, 2, false}},
    {26, {"i32", 1, 4, false}},        {27, {"i64", 1, 8, false}},        {28, {"f64", 1, 8, false}},
    {29, {"iq1_m", 256, 56, false}},   {30, {"bf16", 1, 2, true}},        {34, {"tq1_0", 256, 54, false}},
    {35, {"tq2_0", 256, 66, false}},   {39, {"mxfp4", 32, 17, false}},
};

}  // namespace

std::optional<GgmlTypeInfo> ggml_type_info(uint32_t type_id) {
    for (const Entry& e : kTypes)
        if (e.id == type_id) return e.info;
    return std::nullopt;
}

GgmlTypeInfo ggml_type_info(GgmlType type) { return *ggml_type_info(static_cast<uint32_t>(type)); }

const char* ggml_type_name(GgmlType type) {
    auto info = ggml_type_info(static_cast<uint32_t>(type));
    return info ? info->name : "unknown";
}

std::optional<GgmlType> ggml_type_from_name(const std::string& name) {
    for (const Entry& e : kTypes)
        if (strcasecmp(e.info.name, name.c_str()) == 0) return static_cast<GgmlType>(e.id);
    return std::nullopt;
}

std::vector<size_t> ggml_fp16_scale_offsets(GgmlType type) {
    switch (type) {
        case GgmlType::Q4_0:
        case GgmlType::Q5_0:
        case GgmlType::Q8_0: return {0};
        case GgmlType::Q4_1:
        case GgmlType::Q5_1:
        case GgmlType::Q4_K:
        case GgmlType::Q5_K: return {0, 2};
        case GgmlType::Q2_K: return {80, 82};
        case GgmlType::Q3_K: return {108};
        case GgmlType::Q6_K: return {208};
        default: return {};
    }
}

}  // namespace tandem
