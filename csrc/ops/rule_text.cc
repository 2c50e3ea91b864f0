#include "ops/rule_text.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>

#include "support/error.h"

namespace shardwise::ops {
namespace {

bool is_letter(char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0; }
bool is_ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; }

[[noreturn]] void fail(std::string_view text, std::size_t pos, std::string_view what) {
  throw support::ValidationError(fmt::format("rule \"{}\": {} (at column {})", text, what, pos + 1));
}

std::string strip_spaces(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c != ' ' && c != '\t') out += c;
  }
  return out;
}

// ---- patterns -------------------------------------------------------------

// Parses one operand of a side; `text` is the whole rule for messages, `base` the
// operand's column in it.
PatternOperand parse_operand(std::string_view rule, std::string_view operand, std::size_t base) {
  PatternOperand out;
  std::size_t i = 0;
  if (operand == "_") {
    out.metadata = true;
    return out;
  }
  if (operand == "()") return out;
  if (i < operand.size() && operand[i] == '+') {
    out.added = true;
    ++i;
  }
  if (i < operand.size() && operand[i] == '~') {
    out.broadcast = true;
    ++i;
  }
  std::size_t end = operand.size();
  if (end > i && operand[end - 1] == '?') {
    out.optional = true;
    --end;
  }
  if (operand.substr(i, end - i) == "_") {
    if (out.broadcast) fail(rule, base, "'_' (a metadata-only operand) does not broadcast");
    if (out.added) fail(rule, base, "'_' (a metadata-only operand) is no term of a sum");
    out.metadata = true;
    return out;
  }
  if (operand.substr(i, end - i) == "()") return out;
  std::set<char> seen;
  auto use_letter = [&](char c, std::size_t at) {
    if (!seen.insert(c).second) fail(rule, base + at, fmt::format("letter '{}' appears twice in one operand", c));
  };
  while (i < end) {
    const char c = operand[i];
    if (is_letter(c)) {
      use_letter(c, i);
      out.dims.push_back(PatternDim{std::string(1, c), false});
      ++i;
    } else if (c == '.') {
      if (operand.substr(i, 3) != "...") fail(rule, base + i, "'.' outside an ellipsis '...'");
      if (out.has_ellipsis()) fail(rule, base + i, "two ellipses in one operand");
      out.dims.push_back(PatternDim{"", true});
      i += 3;
    } else if (c == '(') {
      const auto close = operand.find(')', i);
      if (close == std::string_view::npos || close > end) fail(rule, base + i, "unclosed '('");
      std::string letters;
      for (std::size_t k = i + 1; k < close; ++k) {
        if (!is_letter(operand[k])) fail(rule, base + k, "a group '(...)' holds letters only");
        use_letter(operand[k], k);
        letters += operand[k];
      }
      if (letters.size() < 2) fail(rule, base + i, "a group '(...)' needs at least two letters");
      out.dims.push_back(PatternDim{letters, false});
      i = close + 1;
    } else {
      fail(rule, base + i, fmt::format("unexpected character '{}'", c));
    }
  }
  if (out.broadcast && out.has_ellipsis()) fail(rule, base, "'~' and '...' do not combine in one operand");
  return out;
}

std::vector<PatternOperand> parse_side(std::string_view rule, std::string_view side, std::size_t base) {
  std::vector<PatternOperand> out;
  if (side.empty()) return out;
  std::size_t start = 0;
  while (true) {
    const auto comma = side.find(',', start);
    const auto piece = side.substr(start, comma == std::string_view::npos ? side.size() - start : comma - start);
    if (piece.empty()) fail(rule, base + start, "empty operand (write a rank-0 operand as '()')");
    out.push_back(parse_operand(rule, piece, base + start));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

void check_pattern(std::string_view rule, const EinsumPattern& pattern) {
  bool seen_optional = false;
  for (const auto& in : pattern.inputs) {
    if (in.optional) seen_optional = true;
    if (!in.optional && seen_optional) fail(rule, 0, "a required operand follows an optional one");
  }
  for (const auto& out : pattern.outputs) {
    if (out.added || out.broadcast || out.optional || out.metadata) {
      fail(rule, rule.find("->"), "outputs take no '+', '~', '?' or '_' markers");
    }
  }
  // Letters in both cases would read as two indices that look like one.
  std::set<char> letters;
  auto all = pattern.inputs;
  all.insert(all.end(), pattern.outputs.begin(), pattern.outputs.end());
  for (const auto& operand : all) {
    for (const auto& dim : operand.dims) letters.insert(dim.letters.begin(), dim.letters.end());
  }
  for (char c : letters) {
    if (std::islower(static_cast<unsigned char>(c)) &&
        letters.count(static_cast<char>(std::toupper(static_cast<unsigned char>(c))))) {
      fail(rule, 0, fmt::format("letter '{}' is used in both cases", c));
    }
  }
  // Every factor of a group needs a size from somewhere: a single-letter dim, or being the
  // last unknown factor of a group whose other factors are known.
  std::set<char> sized;
  for (const auto& operand : all) {
    for (const auto& dim : operand.dims) {
      if (dim.letters.size() == 1) sized.insert(dim.letters[0]);
    }
  }
  for (bool progress = true; progress;) {
    progress = false;
    for (const auto& operand : all) {
      for (const auto& dim : operand.dims) {
        if (dim.letters.size() < 2) continue;
        const auto unknown =
            std::count_if(dim.letters.begin(), dim.letters.end(), [&](char c) { return !sized.count(c); });
        if (unknown == 1) {
          for (char c : dim.letters) progress |= sized.insert(c).second;
        }
      }
    }
  }
  for (char c : letters) {
    if (!sized.count(c)) fail(rule, 0, fmt::format("nothing determines the size of factor '{}'", c));
  }
}

// ---- template calls -------------------------------------------------------

std::optional<ir::AttrValue> parse_literal(std::string_view text) {
  if (text == "true") return ir::AttrValue{true};
  if (text == "false") return ir::AttrValue{false};
  if (text == "none") return ir::AttrValue{ir::NoneAttr{}};
  auto parse_int = [](std::string_view s) -> std::optional<std::int64_t> {
    if (s.empty()) return std::nullopt;
    std::size_t i = s[0] == '-' ? 1 : 0;
    if (i == s.size()) return std::nullopt;
    std::int64_t v = 0;
    for (; i < s.size(); ++i) {
      if (!std::isdigit(static_cast<unsigned char>(s[i]))) return std::nullopt;
      v = v * 10 + (s[i] - '0');
    }
    return s[0] == '-' ? -v : v;
  };
  if (auto v = parse_int(text)) return ir::AttrValue{*v};
  if (text.size() >= 2 && text.front() == '[' && text.back() == ']') {
    std::vector<std::int64_t> values;
    auto inner = text.substr(1, text.size() - 2);
    std::size_t start = 0;
    while (!inner.empty()) {
      const auto comma = inner.find(',', start);
      auto v = parse_int(inner.substr(start, comma == std::string_view::npos ? inner.size() - start : comma - start));
      if (!v) return std::nullopt;
      values.push_back(*v);
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
    return ir::AttrValue{std::move(values)};
  }
  return std::nullopt;
}

bool is_identifier(std::string_view s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  return std::all_of(s.begin(), s.end(), is_ident_char);
}

// Splits on commas that are not inside brackets.
std::vector<std::pair<std::string_view, std::size_t>> split_args(std::string_view text) {
  std::vector<std::pair<std::string_view, std::size_t>> out;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || (text[i] == ',' && depth == 0)) {
      out.emplace_back(text.substr(start, i - start), start);
      start = i + 1;
    } else if (text[i] == '[') {
      ++depth;
    } else if (text[i] == ']') {
      --depth;
    }
  }
  return out;
}

TemplateCall parse_template(std::string_view rule, std::string_view text) {
  const auto open = text.find('(');
  TemplateCall call;
  call.name = std::string(text.substr(0, open));
  if (!is_identifier(call.name)) fail(rule, 0, "a template call starts with a name");
  if (text.back() != ')') fail(rule, text.size() - 1, "a template call ends with ')'");
  const auto inner = text.substr(open + 1, text.size() - open - 2);
  if (inner.empty()) return call;
  for (auto [arg, at] : split_args(inner)) {
    const std::size_t column = open + 1 + at;
    if (arg.empty()) fail(rule, column, "empty template argument");
    TemplateArg out;
    const auto eq = arg.find('=');
    if (eq != std::string_view::npos) {
      out.attr = std::string(arg.substr(0, eq));
      if (!is_identifier(out.attr)) fail(rule, column, fmt::format("'{}' is not an attribute name", out.attr));
      out.literal = parse_literal(arg.substr(eq + 1));
      if (!out.literal) fail(rule, column + eq + 1, fmt::format("'{}' is not a literal", arg.substr(eq + 1)));
    } else if (auto literal = parse_literal(arg)) {
      out.literal = std::move(literal);
    } else if (is_identifier(arg)) {
      out.attr = std::string(arg);
    } else {
      fail(rule, column, fmt::format("'{}' is neither an attribute name nor a literal", arg));
    }
    call.args.push_back(std::move(out));
  }
  return call;
}

}  // namespace

bool PatternOperand::has_ellipsis() const {
  return std::any_of(dims.begin(), dims.end(), [](const PatternDim& d) { return d.ellipsis; });
}

RuleText parse_rule_text(std::string_view raw) {
  const std::string text = strip_spaces(raw);
  const auto arrow = text.find("->");
  if (arrow == std::string::npos) {
    if (text.find('(') != std::string::npos && !text.empty() && text.front() != '(') {
      return parse_template(text, text);
    }
    fail(text, 0, "expected a pattern 'inputs->outputs' or a template call 'name(args)'");
  }
  if (text.find("->", arrow + 2) != std::string::npos) fail(text, text.find("->", arrow + 2), "a second '->'");
  EinsumPattern pattern;
  pattern.inputs = parse_side(text, std::string_view(text).substr(0, arrow), 0);
  pattern.outputs = parse_side(text, std::string_view(text).substr(arrow + 2), arrow + 2);
  check_pattern(text, pattern);
  return pattern;
}

EinsumPattern parse_einsum_equation(std::string_view raw) {
  const std::string text = strip_spaces(raw);
  std::string lhs = text;
  std::optional<std::string> rhs;
  if (const auto arrow = text.find("->"); arrow != std::string::npos) {
    lhs = text.substr(0, arrow);
    rhs = text.substr(arrow + 2);
  }
  if (!rhs) {
    // Implicit output: letters used exactly once, in alphabetical order, after any ellipsis.
    std::map<char, int> counts;
    for (char c : lhs) {
      if (is_letter(c)) ++counts[c];
    }
    rhs = lhs.find("...") != std::string::npos ? "..." : "";
    for (auto [c, n] : counts) {
      if (n == 1) *rhs += c;
    }
  }
  // torch allows 'a' and 'A' as two labels; the rule language reads case as a kind, so an
  // uppercase label whose lowercase is also used moves to a free uppercase letter.
  std::set<char> used;
  for (char c : lhs + *rhs) {
    if (is_letter(c)) used.insert(c);
  }
  for (char c : std::set<char>(used)) {
    const char lower = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (!std::isupper(static_cast<unsigned char>(c)) || !used.count(lower)) continue;
    char free = 'A';
    while (free <= 'Z' && (used.count(free) || used.count(static_cast<char>(free - 'A' + 'a')))) ++free;
    if (free > 'Z') throw support::ValidationError(fmt::format("einsum \"{}\": too many labels", text));
    used.insert(free);
    std::replace(lhs.begin(), lhs.end(), c, free);
    std::replace(rhs->begin(), rhs->end(), c, free);
  }
  // An einsum operand of rank 0 is written as nothing; the rule language spells it "()".
  std::string rule;
  std::size_t start = 0;
  while (true) {
    const auto comma = lhs.find(',', start);
    const auto piece = lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    rule += piece.empty() ? "()" : piece;
    if (comma == std::string::npos) break;
    rule += ',';
    start = comma + 1;
  }
  rule += "->";
  rule += rhs->empty() ? "()" : *rhs;
  auto parsed = parse_rule_text(rule);
  return std::get<EinsumPattern>(std::move(parsed));
}

}  // namespace shardwise::ops
