#include "ir/parser.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ir/printer.h"
#include "support/error.h"

namespace shardwise::ir {
namespace {

// Parsing runs in two steps: the text becomes a small syntax tree (statements with
// their source locations), then the tree becomes a Graph. The split exists because
// the header inputs cannot be created until the whole body is known: an input
// re-declared in the body (printer.h) is created there, not by the header.

struct Loc {
  int line = 1;
  int column = 1;
};

struct Decl {
  Loc loc;
  std::string name;
  TensorType type;
};

struct Ref {
  Loc loc;
  std::string name;
};

struct Statement {
  Loc loc;
  bool is_leaf = false;
  // Leaf declaration.
  Decl decl;
  ValueRole role = ValueRole::Parameter;
  // Node.
  std::vector<Decl> outputs;
  std::string op;
  std::vector<Ref> inputs;
  Attributes attrs;
  std::string module_path;
};

struct GraphAst {
  std::vector<Decl> header;
  std::vector<Statement> body;
  std::vector<Ref> outputs;
};

[[noreturn]] void fail(Loc loc, std::string_view what) {
  throw support::ParseError(fmt::format("line {}, column {}: {}", loc.line, loc.column, what));
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool is_alnum(char c) { return is_alpha(c) || is_digit(c); }
bool is_number_char(char c) { return is_alnum(c) || c == '.' || c == '+' || c == '-'; }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// A number as written in an attribute: int64 unless it has a '.', an exponent, or is
// inf / -inf / nan (the forms ir::attr_str writes).
struct Number {
  bool is_double = false;
  std::int64_t i = 0;
  double d = 0.0;
};

class TextParser {
 public:
  explicit TextParser(std::string_view text) : text_(text) {}

  GraphAst parse() {
    GraphAst ast;
    skip_space();
    const Loc start = loc_;
    if (take_while(is_alnum) != "graph") fail(start, "expected 'graph' at the start of the text");
    expect('(', "after 'graph'");
    parse_items(')', "to close the graph inputs", [&] { ast.header.push_back(parse_decl()); });
    expect('{', "to open the graph body");
    parse_body(ast);
    expect('}', "to close the graph body");
    skip_space();
    if (!at_end()) fail(loc_, fmt::format("unexpected {} after the end of the graph", describe_here()));
    return ast;
  }

 private:
  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }
  bool next_is(char c) const { return !at_end() && text_[pos_] == c; }

  void advance() {
    if (text_[pos_] == '\n') {
      ++loc_.line;
      loc_.column = 1;
    } else {
      ++loc_.column;
    }
    ++pos_;
  }

  std::string describe_here() const {
    if (at_end()) return "end of input";
    const char c = text_[pos_];
    if (c >= 0x20 && c < 0x7f) return fmt::format("'{}'", c);
    return fmt::format("byte 0x{:02x}", static_cast<unsigned>(static_cast<unsigned char>(c)));
  }

  [[noreturn]] void fail_here(std::string_view what) { fail(loc_, what); }

  // Whitespace and comments (`//` or `#` to the end of the line).
  void skip_space() {
    while (!at_end()) {
      const char c = text_[pos_];
      if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
        advance();
      } else if (c == '#' || (c == '/' && pos_ + 1 < text_.size() && text_[pos_ + 1] == '/')) {
        while (!at_end() && text_[pos_] != '\n') advance();
      } else {
        break;
      }
    }
  }

  bool try_consume(char c) {
    skip_space();
    if (!next_is(c)) return false;
    advance();
    return true;
  }

  void expect(char c, std::string_view context) {
    skip_space();
    if (!next_is(c)) fail_here(fmt::format("expected '{}' {}, found {}", c, context, describe_here()));
    advance();
  }

  // A comma-separated list whose opening bracket has just been read, up to `close`: a
  // `close` right away is an empty list; a missing one is an "expected" error ending in `context`.
  template <typename ReadItem>
  void parse_items(char close, std::string_view context, ReadItem read_item) {
    if (try_consume(close)) return;
    do {
      read_item();
    } while (try_consume(','));
    expect(close, context);
  }

  template <typename Pred>
  std::string_view take_while(Pred pred) {
    const std::size_t start = pos_;
    while (!at_end() && pred(text_[pos_])) advance();
    return text_.substr(start, pos_ - start);
  }

  // After whitespace, the word of `pred`'s characters and where it starts; no such word is
  // an error "expected <what>, found ...".
  template <typename Pred>
  std::pair<Loc, std::string_view> expect_word(Pred pred, std::string_view what) {
    skip_space();
    const Loc loc = loc_;
    const std::string_view word = take_while(pred);
    if (word.empty()) fail(loc, fmt::format("expected {}, found {}", what, describe_here()));
    return {loc, word};
  }

  // A JSON-style string; the cursor is on the opening quote.
  std::string parse_quoted() {
    const Loc start = loc_;
    advance();
    std::string out;
    while (true) {
      if (at_end()) fail(start, "unterminated string");
      const char c = text_[pos_];
      if (c == '"') {
        advance();
        return out;
      }
      if (c == '\n') fail(start, "unterminated string (a string cannot span lines)");
      if (c != '\\') {
        out += c;
        advance();
        continue;
      }
      const Loc escape = loc_;
      advance();
      if (at_end()) fail(start, "unterminated string");
      const char e = text_[pos_];
      advance();
      if (e == 'u') {
        append_utf8(out, parse_u_escape(escape));
      } else if (e == '/') {
        out += '/';  // JSON's escaped solidus; quote_string never writes it
      } else if (const std::optional<char> c = unescaped_char(e)) {
        out += *c;
      } else {
        fail(escape, fmt::format("unknown escape sequence '\\{}'",
                                 (e >= 0x20 && e < 0x7f) ? std::string(1, e) : std::string("?")));
      }
    }
  }

  // The code point of a `\uXXXX` escape whose `u` has just been read, joining a surrogate
  // pair written as two escapes.
  std::uint32_t parse_u_escape(Loc escape) {
    std::uint32_t cp = parse_hex4(escape);
    if (cp >= 0xDC00 && cp <= 0xDFFF) fail(escape, "unpaired low surrogate in \\u escape");
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      if (!(next_is('\\') && pos_ + 1 < text_.size() && text_[pos_ + 1] == 'u')) {
        fail(escape, "unpaired high surrogate in \\u escape");
      }
      advance();
      advance();
      const std::uint32_t low = parse_hex4(escape);
      if (low < 0xDC00 || low > 0xDFFF) fail(escape, "unpaired high surrogate in \\u escape");
      cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
    }
    return cp;
  }

  std::uint32_t parse_hex4(Loc escape) {
    std::uint32_t value = 0;
    for (int i = 0; i < 4; ++i) {
      const int h = at_end() ? -1 : hex_value(text_[pos_]);
      if (h < 0) fail(escape, "\\u escape needs four hex digits");
      value = value * 16 + static_cast<std::uint32_t>(h);
      advance();
    }
    return value;
  }

  // '%' followed by a bare or quoted value name.
  Ref parse_ref() {
    skip_space();
    Ref ref{loc_, {}};
    if (!next_is('%')) fail_here(fmt::format("expected a value ('%name'), found {}", describe_here()));
    advance();
    if (next_is('"')) {
      ref.name = parse_quoted();
      if (ref.name.empty()) fail(ref.loc, "empty value name");
    } else {
      ref.name = std::string(take_while(is_value_name_char));
      if (ref.name.empty()) fail(ref.loc, "expected a value name after '%'");
    }
    return ref;
  }

  Decl parse_decl() {
    Ref ref = parse_ref();
    expect(':', fmt::format("after {}", value_ref(ref.name)));
    return Decl{ref.loc, std::move(ref.name), parse_type()};
  }

  TensorType parse_type() {
    const auto [loc, word] = expect_word(is_alnum, "a tensor type (like f32[2,8])");
    TensorType type;
    if (auto dtype = parse_dtype(word)) {
      type.dtype = *dtype;
    } else {
      fail(loc, fmt::format("unknown dtype '{}'", word));
    }
    expect('[', "after the dtype");
    if (try_consume(']')) return type;
    while (true) {
      skip_space();
      const Loc dim_loc = loc_;
      if (next_is('b')) {
        advance();
        if (type.batch_dim) fail(dim_loc, "a tensor type can have only one batch dimension ('b' prefix)");
        type.batch_dim = type.rank();
      }
      const std::string_view digits = take_while([](char c) { return is_digit(c) || c == '-'; });
      std::int64_t size = 0;
      const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), size);
      if (digits.empty()) fail_here(fmt::format("expected a dimension size, found {}", describe_here()));
      if (ec == std::errc::result_out_of_range) fail(dim_loc, fmt::format("dimension size '{}' is out of range", digits));
      if (ec != std::errc() || end != digits.data() + digits.size()) {
        fail(dim_loc, fmt::format("bad dimension size '{}'", digits));
      }
      type.shape.push_back(size);
      skip_space();
      if (try_consume(',')) continue;
      if (try_consume(']')) break;
      fail_here(fmt::format("expected ',' or ']' in the shape, found {}", describe_here()));
    }
    return type;
  }

  Number parse_number() {
    const auto [loc, token] = expect_word(is_number_char, "a number");
    Number n;
    if (token == "inf" || token == "-inf" || token == "nan") {
      n.is_double = true;
      n.d = token == "nan" ? std::numeric_limits<double>::quiet_NaN()
                           : (token == "inf" ? 1.0 : -1.0) * std::numeric_limits<double>::infinity();
      return n;
    }
    const char* first = token.data();
    const char* last = token.data() + token.size();
    n.is_double = token.find_first_of(".eE") != std::string_view::npos;
    std::from_chars_result r{};
    if (n.is_double) {
      r = std::from_chars(first, last, n.d, std::chars_format::general);
    } else {
      r = std::from_chars(first, last, n.i);
    }
    if (r.ec == std::errc::result_out_of_range) fail(loc, fmt::format("number '{}' is out of range", token));
    // from_chars accepts "inf"/"nan" spellings inside a longer token ("infinity");
    // only the exact forms above are part of the format.
    if (r.ec != std::errc() || r.ptr != last || !(is_digit(token[0]) || token[0] == '-') ||
        (n.is_double && (std::isinf(n.d) || std::isnan(n.d)))) {
      fail(loc, fmt::format("bad number '{}'", token));
    }
    return n;
  }

  AttrValue parse_attr_value() {
    skip_space();
    const Loc loc = loc_;
    if (at_end()) fail_here("expected an attribute value, found end of input");
    const char c = text_[pos_];
    if (c == '"') return parse_quoted();
    if (c == '[') {
      advance();
      std::vector<Number> items;
      parse_items(']', "to close the list", [&] { items.push_back(parse_number()); });
      bool any_double = false;
      for (const auto& n : items) any_double = any_double || n.is_double;
      if (!any_double) {
        std::vector<std::int64_t> ints;
        for (const auto& n : items) ints.push_back(n.i);
        return ints;
      }
      std::vector<double> doubles;
      for (const auto& n : items) doubles.push_back(n.is_double ? n.d : static_cast<double>(n.i));
      return doubles;
    }
    if (is_digit(c) || c == '-') {
      const Number n = parse_number();
      if (n.is_double) return n.d;
      return n.i;
    }
    if (is_alpha(c)) {
      const std::string_view word = take_while(is_alnum);
      if (word == "true") return true;
      if (word == "false") return false;
      if (word == "none") return NoneAttr{};
      if (word == "inf") return std::numeric_limits<double>::infinity();
      if (word == "nan") return std::numeric_limits<double>::quiet_NaN();
      fail(loc, fmt::format("unknown attribute value '{}' (expected a number, a string, a list, true, false or none)",
                            word));
    }
    fail(loc, fmt::format("expected an attribute value, found {}", describe_here()));
  }

  Attributes parse_attrs() {
    Attributes attrs;
    if (try_consume('}')) return attrs;
    while (true) {
      skip_space();
      const Loc key_loc = loc_;
      std::string key;
      if (next_is('"')) {
        key = parse_quoted();
      } else {
        key = std::string(take_while(is_module_path_char));
        if (key.empty()) fail_here(fmt::format("expected an attribute name, found {}", describe_here()));
      }
      expect('=', fmt::format("after attribute name '{}'", key));
      AttrValue value = parse_attr_value();
      if (!attrs.emplace(key, std::move(value)).second) fail(key_loc, fmt::format("duplicate attribute '{}'", key));
      if (try_consume(',')) continue;
      if (try_consume('}')) break;
      fail_here(fmt::format("expected ',' or '}}' in the attributes, found {}", describe_here()));
    }
    return attrs;
  }

  std::string parse_op() {
    skip_space();
    const Loc loc = loc_;
    if (next_is('"')) {
      std::string op = parse_quoted();
      if (op.empty()) fail(loc, "empty op name");
      return op;
    }
    std::string op(take_while(is_op_name_char));
    if (op.empty()) fail(loc, fmt::format("expected an op name, found {}", describe_here()));
    return op;
  }

  // Operands, attributes and module path of a node whose op has just been read.
  void parse_node_rest(Statement& s) {
    expect('(', fmt::format("after op '{}'", s.op));
    parse_items(')', "to close the operand list", [&] { s.inputs.push_back(parse_ref()); });
    if (try_consume('{')) s.attrs = parse_attrs();
    if (try_consume('@')) {
      const Loc loc = loc_;
      if (next_is('"')) {
        s.module_path = parse_quoted();
      } else {
        s.module_path = std::string(take_while(is_module_path_char));
        if (s.module_path.empty()) fail(loc, fmt::format("expected a module path after '@', found {}", describe_here()));
      }
    }
  }

  void parse_body(GraphAst& ast) {
    while (true) {
      skip_space();
      const Loc loc = loc_;
      if (at_end()) fail_here("unexpected end of input: expected a statement or 'return' (missing '}'?)");
      const char c = text_[pos_];
      if (c == '%') {
        ast.body.push_back(parse_value_statement());
      } else if (c == '"' || is_op_name_char(c)) {
        Statement s;
        s.loc = loc;
        if (c == '"') {
          s.op = parse_op();
        } else {
          s.op = std::string(take_while(is_op_name_char));
          if (s.op == "return") {
            expect('(', "after 'return'");
            parse_items(')', "to close the return list", [&] { ast.outputs.push_back(parse_ref()); });
            return;
          }
        }
        parse_node_rest(s);
        ast.body.push_back(std::move(s));
      } else if (c == '}') {
        fail_here("expected 'return (...)' before the closing '}'");
      } else {
        fail_here(fmt::format("expected a statement ('%name: type ...', an op, or 'return'), found {}",
                              describe_here()));
      }
    }
  }

  // A statement starting with '%': a leaf declaration or a node with outputs.
  Statement parse_value_statement() {
    Statement s;
    s.loc = loc_;
    Decl first = parse_decl();
    skip_space();
    if (next_is(',') || next_is('=')) {
      s.outputs.push_back(std::move(first));
      while (try_consume(',')) s.outputs.push_back(parse_decl());
      expect('=', "after the outputs of a node");
      s.op = parse_op();
      parse_node_rest(s);
      return s;
    }
    const Loc role_loc = loc_;
    const std::string_view word = take_while(is_alnum);
    const auto role = parse_role(word);
    if (!role || *role == ValueRole::Activation) {
      if (word == "activation") fail(role_loc, "an activation is defined by a node line ('= op(...)'), not a role");
      fail(role_loc, fmt::format("expected a role (parameter, buffer, constant, input) or '=' after the type of {}, "
                                 "found {}",
                                 value_ref(first.name), word.empty() ? describe_here() : fmt::format("'{}'", word)));
    }
    s.is_leaf = true;
    s.role = *role;
    s.decl = std::move(first);
    return s;
  }

  std::string_view text_;
  std::size_t pos_ = 0;
  Loc loc_;
};

// ---- syntax tree -> Graph ----------------------------------------------------

class GraphBuilder {
 public:
  explicit GraphBuilder(const GraphAst& ast) : ast_(ast) {}

  Graph build() {
    collect_definitions();
    const std::size_t first_body_input = order_body_inputs();
    for (std::size_t i = 0; i < first_body_input; ++i) add_leaf(ast_.header[i], ValueRole::Input);
    for (const Statement& s : ast_.body) {
      if (s.is_leaf) {
        add_leaf(s.decl, s.role);
        continue;
      }
      std::vector<ValueId> inputs;
      for (const Ref& r : s.inputs) inputs.push_back(resolve(r));
      std::vector<OutputSpec> outputs;
      for (const Decl& d : s.outputs) outputs.push_back(OutputSpec{d.name, d.type});
      try {
        graph_.add_node(s.op, std::move(inputs), std::move(outputs), s.attrs, s.module_path);
      } catch (const support::ValidationError& e) {
        fail(s.loc, e.what());
      }
    }
    std::vector<ValueId> outputs;
    for (const Ref& r : ast_.outputs) outputs.push_back(resolve(r));
    graph_.set_outputs(std::move(outputs));
    return std::move(graph_);
  }

 private:
  // Every definition site by name, so a duplicate names the first one and a use
  // before definition says where the definition is.
  void collect_definitions() {
    auto define = [&](const Decl& d) {
      auto [it, inserted] = defined_at_.emplace(d.name, d.loc);
      if (!inserted) {
        fail(d.loc, fmt::format("duplicate value name {} (first declared at line {}, column {})", value_ref(d.name),
                                it->second.line, it->second.column));
      }
    };
    for (std::size_t i = 0; i < ast_.header.size(); ++i) {
      define(ast_.header[i]);
      header_index_.emplace(ast_.header[i].name, i);
    }
    for (const Statement& s : ast_.body) {
      if (s.is_leaf && s.role == ValueRole::Input) continue;  // re-declares a header input
      if (s.is_leaf) define(s.decl);
      for (const Decl& d : s.outputs) define(d);
    }
  }

  // Inputs re-declared in the body must be the tail of the header list, in order,
  // because Graph::inputs() is the creation order. Returns the first such index.
  std::size_t order_body_inputs() {
    std::vector<const Statement*> redeclared;
    for (const Statement& s : ast_.body) {
      if (s.is_leaf && s.role == ValueRole::Input) redeclared.push_back(&s);
    }
    const std::size_t first = ast_.header.size() - std::min(redeclared.size(), ast_.header.size());
    for (std::size_t k = 0; k < redeclared.size(); ++k) {
      const Decl& d = redeclared[k]->decl;
      auto it = header_index_.find(d.name);
      if (it == header_index_.end()) {
        fail(d.loc, fmt::format("{} is declared as an input but is not listed in the graph header", value_ref(d.name)));
      }
      const Decl& h = ast_.header[it->second];
      if (!(h.type == d.type)) {
        fail(d.loc, fmt::format("input {} is declared as {} here but as {} in the graph header", value_ref(d.name),
                                d.type.str(), h.type.str()));
      }
      if (it->second != first + k) {
        fail(d.loc, fmt::format("input {} is re-declared out of order: inputs declared in the body must be the last "
                                "inputs of the header, once each, in header order",
                                value_ref(d.name)));
      }
    }
    return first;
  }

  void add_leaf(const Decl& d, ValueRole role) {
    try {
      graph_.add_value(d.name, d.type, role);
    } catch (const support::ValidationError& e) {
      fail(d.loc, e.what());
    }
  }

  ValueId resolve(const Ref& r) const {
    if (auto id = graph_.find_value(r.name)) return *id;
    auto it = defined_at_.find(r.name);
    if (it != defined_at_.end()) {
      fail(r.loc, fmt::format("value {} is used before its definition at line {}, column {}", value_ref(r.name),
                              it->second.line, it->second.column));
    }
    fail(r.loc, fmt::format("undefined value {}", value_ref(r.name)));
  }

  const GraphAst& ast_;
  Graph graph_;
  std::unordered_map<std::string, Loc> defined_at_;
  std::unordered_map<std::string, std::size_t> header_index_;
};

}  // namespace

Graph parse_graph(std::string_view text) {
  const GraphAst ast = TextParser(text).parse();
  return GraphBuilder(ast).build();
}

}  // namespace shardwise::ir
