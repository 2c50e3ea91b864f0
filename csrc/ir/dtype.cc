#include "ir/dtype.h"

#include <array>
#include <utility>

namespace shardwise::ir {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  int bytes;
  bool floating;
};

constexpr std::array<DTypeInfo, 14> kDTypes{{
    {DType::F64, "f64", 8, true},     {DType::F32, "f32", 4, true},
    {DType::F16, "f16", 2, true},     {DType::BF16, "bf16", 2, true},
    {DType::F8E4M3, "f8e4m3", 1, true}, {DType::F8E5M2, "f8e5m2", 1, true},
    {DType::I64, "i64", 8, false},    {DType::I32, "i32", 4, false},
    {DType::I16, "i16", 2, false},    {DType::I8, "i8", 1, false},
    {DType::U8, "u8", 1, false},      {DType::Bool, "bool", 1, false},
    {DType::C64, "c64", 8, true},     {DType::C128, "c128", 16, true},
}};

const DTypeInfo& info(DType dtype) { return kDTypes.at(static_cast<std::size_t>(dtype)); }

}  // namespace

std::string_view dtype_name(DType dtype) { return info(dtype).name; }
int dtype_bytes(DType dtype) { return info(dtype).bytes; }
bool is_floating(DType dtype) { return info(dtype).floating; }

std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& entry : kDTypes) {
    if (entry.name == name) return entry.dtype;
  }
  return std::nullopt;
}

}  // namespace shardwise::ir
