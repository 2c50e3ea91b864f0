// Wall-time bounds in the tests catch an accidental change of complexity (a quadratic
// pass, a search that stopped pruning), not a budget. Under AddressSanitizer (the
// build/asan run of scripts/harden.sh) the same code runs several times slower, so the
// bounds are scaled by kTimeBoundScale there; elsewhere it is 1.
#pragma once

namespace shardwise::test_support {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr double kTimeBoundScale = 10.0;  // GCC's -fsanitize=address
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr double kTimeBoundScale = 10.0;  // Clang's -fsanitize=address
#else
inline constexpr double kTimeBoundScale = 1.0;
#endif
#else
inline constexpr double kTimeBoundScale = 1.0;
#endif

}  // namespace shardwise::test_support
