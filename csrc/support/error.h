// Errors with context. Every exception the core throws is a shardwise::support::Error
// (or a subclass), whose message already names what went wrong and where: the op,
// the value, the module path, the line of a text file. The Python bindings map each
// subclass to a Python exception type of the same name.
#pragma once

#include <stdexcept>
#include <string>

namespace shardwise::support {

// Base of every error the core raises.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Malformed text or JSON input (IR text, plan files, cluster files).
// The message carries the line (and column where known) of the problem.
class ParseError : public Error {
 public:
  using Error::Error;
};

// A structurally valid object that breaks an invariant: a graph whose shapes
// disagree with its op rules, a dangling value id, a rule string that does not
// parse when registered.
class ValidationError : public Error {
 public:
  using Error::Error;
};

}  // namespace shardwise::support
