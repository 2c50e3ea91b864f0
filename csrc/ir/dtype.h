// Element types of tensors in the IR, spelled as in the text format ("f32", "bf16", ...).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace shardwise::ir {

enum class DType : std::uint8_t {
  F64, F32, F16, BF16, F8E4M3, F8E5M2,
  I64, I32, I16, I8, U8, Bool,
  C64, C128,
};

// Short name used in the text format and JSON: "f32", "bf16", "i64", "bool", ...
std::string_view dtype_name(DType dtype);
// Inverse of dtype_name; nullopt for an unknown spelling.
std::optional<DType> parse_dtype(std::string_view name);
// Bytes per element (bool counts as 1).
int dtype_bytes(DType dtype);
bool is_floating(DType dtype);

}  // namespace shardwise::ir
