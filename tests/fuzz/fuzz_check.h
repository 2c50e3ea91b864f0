// Shared by the fuzz targets of tests/fuzz: what counts as a finding besides the crashes,
// sanitizer reports, leaks and timeouts libFuzzer catches itself.
//  - A reader may reject its input only with the exception types its header documents;
//    each target catches exactly those. Anything else (a nlohmann::json exception, a
//    std::out_of_range, ...) is not caught, so libFuzzer reports it as a deadly signal.
//  - FUZZ_CHECK: a promise of a header that the input broke (a round trip that does
//    not give back an equal value); prints what and aborts.
//  - must(): a call that the contract says cannot throw here (writing back what was
//    just read, reading back what was just written); prints the exception and aborts.
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "ir/graph.h"

#define FUZZ_CHECK(cond, ...)                                                          \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      std::fprintf(stderr, "\nFUZZ_CHECK failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      ::shardwise::fuzz::print_context(__VA_ARGS__);                                   \
      std::abort();                                                                    \
    }                                                                                  \
  } while (0)

namespace shardwise::fuzz {

inline void print_context() {}
inline void print_context(std::string_view a) { std::fprintf(stderr, "---\n%.*s\n", static_cast<int>(a.size()), a.data()); }
inline void print_context(std::string_view a, std::string_view b) {
  print_context(a);
  print_context(b);
}

template <typename F>
auto must(const char* what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\nFUZZ: %s threw (it must not): %s\n", what, e.what());
    std::abort();
  }
}

// Graph == compares doubles with ==, so a NaN attribute never equals itself (a loss
// printer.h and json.h document); the round trips compare the text instead then.
inline bool has_nan_attribute(const ir::Graph& graph) {
  for (const ir::Node& node : graph.nodes()) {
    for (const auto& [key, value] : node.attrs) {
      if (const auto* d = std::get_if<double>(&value); d && std::isnan(*d)) return true;
      if (const auto* list = std::get_if<std::vector<double>>(&value)) {
        for (double x : *list)
          if (std::isnan(x)) return true;
      }
    }
  }
  return false;
}

}  // namespace shardwise::fuzz
