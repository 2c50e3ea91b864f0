#include "ir/tensor_type.h"

#include <fmt/format.h>

namespace shardwise::ir {

std::int64_t TensorType::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::string TensorType::str() const {
  std::string out = fmt::format("{}[", dtype_name(dtype));
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ',';
    if (batch_dim && *batch_dim == static_cast<int>(i)) out += 'b';
    out += fmt::format("{}", shape[i]);
  }
  out += ']';
  return out;
}

}  // namespace shardwise::ir
