// The schedule tests' check of a refusal: the message of the support::ValidationError a call
// throws, or "<no error>", so an assert states the whole message it expects.
#pragma once

#include <string>
#include <utility>

#include "support/error.h"

namespace shardwise::schedule::testing {

template <typename F>
std::string validation_error_of(F&& f) {
  try {
    std::forward<F>(f)();
  } catch (const support::ValidationError& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace shardwise::schedule::testing
