// Small clusters with round numbers for the cost tests, and a helper that returns the
// message of the exception a call throws.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "cost/cluster.h"

namespace shardwise::cost::testing {

inline DeviceType test_device(std::string name) {
  return DeviceType{std::move(name), PeakFlops{1e12, 2e12, 4e12, 4e12}, std::int64_t{16} << 30, 1e12};
}

// 1-level hierarchy: one node of n devices on a "bus" of 1 GB/s and 1 us per step.
inline Cluster flat_cluster(int n) {
  return Cluster("flat", {test_device("dev")}, {Node::uniform("dev", n)}, {LinkLevel{"bus", 0, 1e9, 1e-6, {}}});
}

// 2-level hierarchy: `nodes` nodes of `per_node` devices; "fast" inside a node
// (100 GB/s, 1 us), "net" between nodes (10 GB/s, 10 us).
inline Cluster two_level_cluster(int nodes, int per_node) {
  return Cluster("two-level", {test_device("dev")},
                 std::vector<Node>(static_cast<std::size_t>(nodes), Node::uniform("dev", per_node)),
                 {LinkLevel{"fast", 0, 1e11, 1e-6, {}}, LinkLevel{"net", 0, 1e10, 1e-5, {}}});
}

// The what() of the E that f() throws; a test failure (and "") when it throws nothing.
template <typename E, typename F>
std::string error_of(F&& f) {
  try {
    std::forward<F>(f)();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

}  // namespace shardwise::cost::testing
