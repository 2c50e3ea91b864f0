// The static type of a tensor value: element type, shape and (optionally) which
// dimension is the batch dimension.
//
// Text form: dtype[dims] where the batch dimension carries a 'b' prefix:
//   f32[b8,128,768]   batch dimension 0 of size 8
//   i64[]             a scalar
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ir/dtype.h"

namespace shardwise::ir {

struct TensorType {
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;
  std::optional<int> batch_dim;  // index into shape, if this tensor has one

  int rank() const { return static_cast<int>(shape.size()); }
  std::int64_t numel() const;
  std::int64_t bytes() const { return numel() * dtype_bytes(dtype); }
  std::string str() const;  // the text form above

  friend bool operator==(const TensorType&, const TensorType&) = default;
};

}  // namespace shardwise::ir
