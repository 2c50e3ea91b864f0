// FNV-1a, 64 bits: the project's stable hash of text (a plan's hash, a graph's fingerprint).
// Stable across runs, machines and builds, unlike std::hash; not cryptographic.
//
//   fnv1a64("")  == 14695981039346656037 (the offset basis)
//   fnv1a64("b", fnv1a64("a")) == fnv1a64("ab")   (hashing can continue where it stopped)
#pragma once

#include <cstdint>
#include <string_view>

namespace shardwise::support {

inline constexpr std::uint64_t kFnv1aOffsetBasis = 14695981039346656037ULL;

constexpr std::uint64_t fnv1a64(std::string_view text, std::uint64_t hash = kFnv1aOffsetBasis) {
  for (const char c : text) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 1099511628211ULL;  // the FNV-1a 64 prime
  }
  return hash;
}

}  // namespace shardwise::support
