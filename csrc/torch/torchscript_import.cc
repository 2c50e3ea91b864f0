// TorchScript importer (see torchscript_import.h for what it does and why).
//
// The walk is an abstract interpretation of the TorchScript graph: every jit::Value
// maps to an Item, which is either a tensor of the IR (a Value id), a value known at
// import time (None, bool, int, double, string, module reference, list/tuple/dict of
// Items) or an Opaque item that records why it is unknown. Non-tensor plumbing is
// evaluated on Items and never reaches the IR; only tensor ops become nodes. An Opaque
// item is an error only when something needs its value, so a scripted graph can carry
// unused runtime-only values (an error message string) without failing the import.
#include "torch/torchscript_import.h"

#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/frontend/source_range.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/passes/remove_mutation.h>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "support/enum_names.h"

namespace shardwise::torchbridge {
namespace {

namespace jit = ::torch::jit;

// fmt is not used here: torch bundles its own fmt headers, and which one an include
// picks in a torch translation unit depends on include order.
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// ---- known values ------------------------------------------------------------

struct Item {
  enum class Kind : std::uint8_t { Opaque, None, Bool, Int, Double, String, Tensor, Module, List, Tuple, Dict };

  Kind kind = Kind::Opaque;
  bool missing_shape = false;  // Opaque: unknown only because the graph records no shapes
  bool b = false;
  std::int64_t i = 0;
  double d = 0.0;
  std::string s;            // String: the text; Module: dotted path ("" = root); Opaque: why unknown
  ir::ValueId tensor = -1;  // Tensor: the IR value, or -1 while `lazy` names a constant not yet added
  int lazy = -1;            // Tensor: index into Importer::lazy_ (constants are added on first use)
  std::vector<Item> items;  // List / Tuple elements, Dict values
  std::vector<Item> keys;   // Dict keys

  // Each kind's item, its one field set (designated initializers, in declaration order).
  static Item none() { return Item{.kind = Kind::None}; }
  static Item boolean(bool v) { return Item{.kind = Kind::Bool, .b = v}; }
  static Item integer(std::int64_t v) { return Item{.kind = Kind::Int, .i = v}; }
  static Item real(double v) { return Item{.kind = Kind::Double, .d = v}; }
  static Item string(std::string v) { return Item{.kind = Kind::String, .s = std::move(v)}; }
  static Item opaque(std::string why, bool missing_shape = false) {
    return Item{.kind = Kind::Opaque, .missing_shape = missing_shape, .s = std::move(why)};
  }
  static Item module(std::string path) { return Item{.kind = Kind::Module, .s = std::move(path)}; }
  static Item value(ir::ValueId id) { return Item{.kind = Kind::Tensor, .tensor = id}; }
  static Item sequence(Kind kind, std::vector<Item> items) { return Item{.kind = kind, .items = std::move(items)}; }

  bool is_number() const { return kind == Kind::Bool || kind == Kind::Int || kind == Kind::Double; }
  double as_double() const { return kind == Kind::Double ? d : kind == Kind::Int ? static_cast<double>(i) : (b ? 1.0 : 0.0); }
  std::int64_t as_int() const { return kind == Kind::Int ? i : kind == Kind::Bool ? (b ? 1 : 0) : static_cast<std::int64_t>(d); }
};

std::string_view kind_name(Item::Kind kind) {
  switch (kind) {
    case Item::Kind::Opaque: return "unknown value";
    case Item::Kind::None: return "None";
    case Item::Kind::Bool: return "bool";
    case Item::Kind::Int: return "int";
    case Item::Kind::Double: return "float";
    case Item::Kind::String: return "str";
    case Item::Kind::Tensor: return "Tensor";
    case Item::Kind::Module: return "module";
    case Item::Kind::List: return "list";
    case Item::Kind::Tuple: return "tuple";
    case Item::Kind::Dict: return "dict";
  }
  return "?";
}

// A tensor leaf created on first use: a tensor constant of the graph, or a 0-dim tensor
// whose value the importer computed (prim::NumToTensor of a size, size arithmetic).
struct LazyConstant {
  ir::TensorType type;
  std::optional<Item> scalar;  // the value of a 0-dim tensor, when known
  std::string name_hint;
  std::optional<ir::ValueId> id;
};

// ---- dtypes and enums ------------------------------------------------------------

// Spelled as the export importer spells them (str() of the Python object).
constexpr auto kLayouts = support::enum_names<c10::Layout>({
    {c10::Layout::Strided, "torch.strided"},
    {c10::Layout::Sparse, "torch.sparse_coo"},
    {c10::Layout::SparseCsr, "torch.sparse_csr"},
    {c10::Layout::SparseCsc, "torch.sparse_csc"},
    {c10::Layout::SparseBsr, "torch.sparse_bsr"},
    {c10::Layout::SparseBsc, "torch.sparse_bsc"},
    {c10::Layout::Mkldnn, "torch._mkldnn"},
    {c10::Layout::Jagged, "torch.jagged"},
});
constexpr auto kMemoryFormats = support::enum_names<c10::MemoryFormat>({
    {c10::MemoryFormat::Contiguous, "torch.contiguous_format"},
    {c10::MemoryFormat::Preserve, "torch.preserve_format"},
    {c10::MemoryFormat::ChannelsLast, "torch.channels_last"},
    {c10::MemoryFormat::ChannelsLast3d, "torch.channels_last_3d"},
});

// The name of `v`, a value of a torch enum held as an int, or "<kind>(v)" for one the table lacks.
template <typename E, std::size_t N>
std::string torch_enum_name(const support::EnumNames<E, N>& names, std::int64_t v, const char* kind) {
  const std::optional<std::string_view> name = names.find(static_cast<E>(v));
  return name ? std::string(*name) : cat(kind, "(", v, ")");
}

std::string layout_name(std::int64_t v) { return torch_enum_name(kLayouts, v, "layout"); }

std::string memory_format_name(std::int64_t v) { return torch_enum_name(kMemoryFormats, v, "memory_format"); }

bool is_integral(ir::DType t) {
  switch (t) {
    case ir::DType::I64: case ir::DType::I32: case ir::DType::I16: case ir::DType::I8: case ir::DType::U8:
      return true;
    default:
      return false;
  }
}

// ---- where a node comes from ------------------------------------------------------

// The dotted nn.Module path of the module that ran `n`.
//
// Traced graphs record it in the scope: the tracer pushes "__module.<qualified name>"
// (its _trace_module_map names each submodule by its full path) on entering a
// submodule, so the innermost scope alone names the module
// ("__module.transformer/__module.transformer.h.0/__module.transformer.h.0.attn").
// Scripted graphs have no scope: the importer's own inlining records the path of every
// node it inlines in a PathTable (see Importer::inline_calls). Last resort, the
// callstack torch's inliner records: each call's target module, by the last attribute
// name of the target only (and nodes without outputs get none).
using PathTable = std::unordered_map<const jit::Node*, std::string>;

std::string join_path(const std::string& outer, const std::string& inner) {
  if (outer.empty()) return inner;
  if (inner.empty()) return outer;
  return cat(outer, ".", inner);
}

std::string module_path(const jit::Node* n, const PathTable* table = nullptr) {
  for (jit::ScopePtr scope = const_cast<jit::Node*>(n)->scope(); scope && !scope->isBlank();
       scope = scope->parent()) {
    std::string name = scope->name().toUnqualString();
    constexpr std::string_view kPrefix = "__module";
    if (name.rfind(kPrefix, 0) == 0) {
      name.erase(0, kPrefix.size());
      if (!name.empty() && name.front() == '.') name.erase(0, 1);
      return name;
    }
  }
  if (table) {
    if (auto it = table->find(n); it != table->end()) return it->second;
  }
  if (auto callstack = n->callstack()) {
    std::string path;
    for (const auto& entry : (*callstack)->vec()) {
      const auto& info = std::get<2>(entry);
      if (!info) continue;
      const std::string& instance = info->instance_name();
      // "SELF": a method of the caller's own module; no path step.
      if (instance.empty() || instance == "SELF" || instance == "INSTANCE_NAME_UNKNOWN") continue;
      if (!path.empty()) path += '.';
      path += instance;
    }
    return path;
  }
  return "";
}

// "file:line" of a node for error messages (the innermost Python frame for traced
// graphs, whose source range is the Python stack as text).
std::string location(const jit::Node* n) {
  const jit::SourceRange range = n->sourceRange();
  if (!range.source()) return "";
  if (auto flc = range.file_line_col()) return cat(std::get<0>(*flc), ":", std::get<1>(*flc));
  std::string text = range.text().str();
  text = text.substr(0, text.find('\n'));
  return text;
}

std::string describe(const jit::Node* n, const PathTable* table = nullptr) {
  std::string out = cat(n->kind().toQualString(), " in module '", module_path(n, table), "'");
  if (auto where = location(n); !where.empty()) out += cat(" at ", where);
  return out;
}

[[noreturn]] void fail(const jit::Node* n, const std::string& what, const PathTable* table = nullptr) {
  throw TorchScriptImportError(cat(describe(n, table), ": ", what));
}

std::string sanitize(std::string_view name) {
  std::string out;
  out.reserve(name.size());
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.';
    out.push_back(ok ? c : '_');
  }
  return out;
}

bool contains_tensor(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::TensorType) return true;
  for (const auto& inner : type->containedTypes()) {
    if (contains_tensor(inner)) return true;
  }
  return false;
}

// How an argument of an op schema is imported.
enum class ArgClass { Tensor, OptionalTensor, TensorList, OptionalTensorList, ScalarType, Layout, MemoryFormat, Device, Other };

ArgClass classify(const c10::Argument& arg) {
  // real_type() keeps what type() erases: ScalarType, Layout and MemoryFormat
  // arguments are ints in type() (and at run time).
  c10::TypePtr type = arg.real_type();
  bool optional = false;
  if (auto opt = type->cast<c10::OptionalType>()) {
    type = opt->getElementType();
    optional = true;
  }
  switch (type->kind()) {
    case c10::TypeKind::TensorType:
      return optional ? ArgClass::OptionalTensor : ArgClass::Tensor;
    case c10::TypeKind::ListType: {
      const auto elem = type->expectRef<c10::ListType>().getElementType();
      if (elem->kind() == c10::TypeKind::TensorType) return ArgClass::TensorList;
      if (auto opt_elem = elem->cast<c10::OptionalType>();
          opt_elem && opt_elem->getElementType()->kind() == c10::TypeKind::TensorType) {
        return ArgClass::OptionalTensorList;
      }
      return ArgClass::Other;
    }
    case c10::TypeKind::ScalarTypeType: return ArgClass::ScalarType;
    case c10::TypeKind::LayoutType: return ArgClass::Layout;
    case c10::TypeKind::MemoryFormatType: return ArgClass::MemoryFormat;
    case c10::TypeKind::DeviceObjType: return ArgClass::Device;
    default: return ArgClass::Other;
  }
}

// ---- scalar arithmetic ---------------------------------------------------------------

std::int64_t floor_div(const jit::Node* n, std::int64_t a, std::int64_t b) {
  if (b == 0) fail(n, "integer division by zero while folding sizes");
  std::int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

std::int64_t py_mod(const jit::Node* n, std::int64_t a, std::int64_t b) {
  if (b == 0) fail(n, "integer modulo by zero while folding sizes");
  return ((a % b) + b) % b;
}

bool both_int(const Item& a, const Item& b) {
  return (a.kind == Item::Kind::Int || a.kind == Item::Kind::Bool) && (b.kind == Item::Kind::Int || b.kind == Item::Kind::Bool);
}

// Python semantics of `op` on known numbers; nullopt when `op` is not one the
// importer folds (the caller then treats the result as unknown).
std::optional<Item> fold_number_op(const jit::Node* n, std::string_view op, const std::vector<Item>& a) {
  auto numbers = [&](std::size_t count) {
    if (a.size() < count) return false;
    for (std::size_t k = 0; k < count; ++k) {
      if (!a[k].is_number()) return false;
    }
    return true;
  };
  if (a.size() >= 1 && numbers(1) && (a.size() == 1 || !a[1].is_number())) {
    const Item& x = a[0];
    if (op == "neg") return x.kind == Item::Kind::Double ? Item::real(-x.d) : Item::integer(-x.as_int());
    if (op == "abs") return x.kind == Item::Kind::Double ? Item::real(std::fabs(x.d)) : Item::integer(std::llabs(x.as_int()));
    if (op == "Int" || op == "floor" || op == "ceil") {
      if (x.kind != Item::Kind::Double) return Item::integer(x.as_int());
      const double v = op == "ceil" ? std::ceil(x.d) : op == "floor" ? std::floor(x.d) : std::trunc(x.d);
      return Item::integer(static_cast<std::int64_t>(v));
    }
    if (op == "Float") return Item::real(x.as_double());
    if (op == "Bool" || op == "__not__") {
      const bool truth = x.kind == Item::Kind::Double ? x.d != 0.0 : x.as_int() != 0;
      return Item::boolean(op == "Bool" ? truth : !truth);
    }
    if (op == "sqrt") return Item::real(std::sqrt(x.as_double()));
    if (op == "ScalarImplicit") return x;
  }
  if (!numbers(2)) return std::nullopt;
  const Item& x = a[0];
  const Item& y = a[1];
  const bool ints = both_int(x, y);
  if (op == "add") return ints ? Item::integer(x.as_int() + y.as_int()) : Item::real(x.as_double() + y.as_double());
  if (op == "sub") return ints ? Item::integer(x.as_int() - y.as_int()) : Item::real(x.as_double() - y.as_double());
  if (op == "mul") return ints ? Item::integer(x.as_int() * y.as_int()) : Item::real(x.as_double() * y.as_double());
  if (op == "div" || op == "truediv") {
    if (y.as_double() == 0.0) fail(n, "division by zero while folding sizes");
    return Item::real(x.as_double() / y.as_double());
  }
  if (op == "floordiv" || op == "floor_divide") {
    if (ints) return Item::integer(floor_div(n, x.as_int(), y.as_int()));
    return Item::real(std::floor(x.as_double() / y.as_double()));
  }
  if (op == "remainder" || op == "mod") {
    if (ints) return Item::integer(py_mod(n, x.as_int(), y.as_int()));
    const double q = std::floor(x.as_double() / y.as_double());
    return Item::real(x.as_double() - q * y.as_double());
  }
  if (op == "pow") {
    if (ints && y.as_int() >= 0) {
      std::int64_t r = 1;
      for (std::int64_t k = 0; k < y.as_int(); ++k) r *= x.as_int();
      return Item::integer(r);
    }
    return Item::real(std::pow(x.as_double(), y.as_double()));
  }
  if (op == "min") return (x.as_double() <= y.as_double()) ? x : y;
  if (op == "max") return (x.as_double() >= y.as_double()) ? x : y;
  if (op == "eq") return Item::boolean(ints ? x.as_int() == y.as_int() : x.as_double() == y.as_double());
  if (op == "ne") return Item::boolean(ints ? x.as_int() != y.as_int() : x.as_double() != y.as_double());
  if (op == "lt") return Item::boolean(x.as_double() < y.as_double());
  if (op == "le") return Item::boolean(x.as_double() <= y.as_double());
  if (op == "gt") return Item::boolean(x.as_double() > y.as_double());
  if (op == "ge") return Item::boolean(x.as_double() >= y.as_double());
  if (op == "__and__" || op == "__or__" || op == "__xor__") {
    if (!ints) return std::nullopt;
    const std::int64_t l = x.as_int(), r = y.as_int();
    const std::int64_t v = op == "__and__" ? (l & r) : op == "__or__" ? (l | r) : (l ^ r);
    if (x.kind == Item::Kind::Bool && y.kind == Item::Kind::Bool) return Item::boolean(v != 0);
    return Item::integer(v);
  }
  return std::nullopt;
}

// The dtype torch gives a tensor made from a Python number.
ir::DType number_dtype(const Item& x) {
  if (x.kind == Item::Kind::Double) return ir::DType::F64;
  if (x.kind == Item::Kind::Bool) return ir::DType::Bool;
  return ir::DType::I64;
}

bool same_known(const Item& x, const Item& y) {
  if (x.kind == Item::Kind::None || y.kind == Item::Kind::None) return x.kind == y.kind;
  if (x.is_number() && y.is_number()) return x.as_double() == y.as_double();
  if (x.kind == Item::Kind::String && y.kind == Item::Kind::String) return x.s == y.s;
  return false;
}

// ---- the importer -------------------------------------------------------------------

class Importer {
 public:
  explicit Importer(const TorchScriptImportOptions& options) : options_(options) {}

  // The free helpers, with this import's path table (members hide them in the class).
  std::string module_path(const jit::Node* n) const { return torchbridge::module_path(n, &call_paths_); }
  std::string describe(const jit::Node* n) const { return torchbridge::describe(n, &call_paths_); }
  [[noreturn]] void fail(const jit::Node* n, const std::string& what) const { torchbridge::fail(n, what, &call_paths_); }

  ir::Graph run(const std::shared_ptr<jit::Graph>& source) {
    if (!source) throw TorchScriptImportError("import_torchscript: the graph is null");
    std::shared_ptr<jit::Graph> graph = prepare(source);
    add_module_tensors();
    try {
      add_inputs(*graph);
      import_block(graph->block());
      std::vector<ir::ValueId> outputs;
      for (jit::Value* v : graph->outputs()) flatten_output(item(v), graph->return_node(), outputs);
      graph_.set_outputs(std::move(outputs));
    } catch (const TorchScriptImportError& e) {
      // A scripted graph usually lacks shapes *and* has control flow: the control flow
      // (or whatever else failed) is the real blocker, the missing shapes a note.
      if (first_shape_error_) throw TorchScriptImportError(cat(e.what(), "\n(besides, ", *first_shape_error_, ")"));
      throw;
    }
    if (first_shape_error_) throw TorchScriptImportError(*first_shape_error_);
    return std::move(graph_);
  }

 private:
  // A copy with calls inlined, in-place ops made functional where safe, dead code gone.
  std::shared_ptr<jit::Graph> prepare(const std::shared_ptr<jit::Graph>& source) {
    std::shared_ptr<jit::Graph> graph = source->copy();
    try {
      inline_calls(graph->block(), call_paths_);
      jit::Inline(*graph);  // whatever inline_calls left (nothing, normally)
      if (options_.remove_mutation) jit::RemoveTensorMutation(graph);
      jit::EliminateDeadCode(graph);
    } catch (const c10::Error& e) {
      throw TorchScriptImportError(cat("preparing the TorchScript graph (inlining calls, removing mutation) failed: ",
                                       e.what_without_backtrace()));
    }
    return graph;
  }

  // Inlines every prim::CallMethod / prim::CallFunction of `block`, callees first, on
  // copies of the callee graphs (the module's own graphs are never modified).
  //
  // Why not jit::Inline alone: the callstack it records names a called module by the
  // last prim::GetAttr of its call target only (`self.blocks.0.gate(x)` is recorded as
  // "gate" called from "0"), so scripted graphs, which have no scopes, would lose the
  // "blocks" step of their module paths. Collapsing each call target's GetAttr chain
  // into one GetAttr named by the dotted path first makes the recorded names complete;
  // get_attr() resolves a dotted name like any other.
  //
  // `paths` receives the module path (relative to the block's graph's module) of every
  // node inlined into `block`: inlineCallTo clones the callee's nodes in order right
  // where the call was, so they pair one to one with the callee's nodes.
  void inline_calls(jit::Block* block, PathTable& paths) {
    for (auto it = block->nodes().begin(); it != block->nodes().end();) {
      jit::Node* call = *it++;  // inlining inserts before `call` and destroys it
      for (jit::Block* sub : call->blocks()) inline_calls(sub, paths);
      if (call->kind() != c10::prim::CallMethod && call->kind() != c10::prim::CallFunction) continue;
      jit::GraphFunction* callee = jit::tryToGraphFunction(call);
      if (!callee) continue;  // reported when the importer reaches it
      std::string target;  // the called module, relative to this graph's module
      if (call->kind() == c10::prim::CallMethod) {
        target = collapse_getattr_chain(call);
      } else {
        call->removeInput(0);  // the function constant: not an argument of the callee
      }
      if (auto it_outer = paths.find(call); it_outer != paths.end()) target = join_path(it_outer->second, target);
      std::shared_ptr<jit::Graph> body = callee->graph()->copy();
      PathTable body_paths;  // keyed by the body's nodes, which die with `body`
      inline_calls(body->block(), body_paths);
      jit::Node* const before = call->prev();
      jit::Node* const after = call->next();
      jit::inlineCallTo(call, callee, body.get());
      record_paths(before->next(), after, body->block(), target, body_paths, paths);
    }
  }

  static void record_paths(jit::Node* first, jit::Node* end, jit::Block* source, const std::string& target,
                           const PathTable& source_paths, PathTable& paths) {
    auto src = source->nodes().begin();
    for (jit::Node* n = first; n != end && src != source->nodes().end(); n = n->next(), ++src) {
      if (n->kind() != src->kind() || n->blocks().size() != src->blocks().size()) return;  // not a clone: stop
      auto inner = source_paths.find(*src);
      const std::string path = join_path(target, inner == source_paths.end() ? std::string() : inner->second);
      if (!path.empty()) paths[n] = path;
      for (std::size_t b = 0; b < n->blocks().size(); ++b) {
        jit::Block* block = n->blocks()[b];
        record_paths(*block->nodes().begin(), block->return_node(), src->blocks()[b], target, source_paths, paths);
      }
    }
  }

  // Returns the dotted path of the call's target module relative to the graph's `self`
  // ("" for self), collapsing its GetAttr chain into one GetAttr of that path.
  static std::string collapse_getattr_chain(jit::Node* call) {
    jit::Value* target = call->input(0);
    std::vector<std::string> names;
    jit::Value* root = target;
    while (root->node()->kind() == c10::prim::GetAttr) {
      names.push_back(root->node()->s(c10::attr::name));
      root = root->node()->input(0);
    }
    std::string path;
    for (auto name = names.rbegin(); name != names.rend(); ++name) path += (path.empty() ? "" : ".") + *name;
    if (names.size() < 2) return path;
    jit::Graph* graph = call->owningGraph();
    jit::WithInsertPoint guard(call);
    jit::Node* get = graph->create(c10::prim::GetAttr, {root}, 1);
    get->s_(c10::attr::name, path);
    get->output()->setType(target->type());
    graph->insertNode(get);
    call->replaceInput(0, get->output());
    return path;
  }

  void add_module_tensors() {
    std::unordered_map<std::string, ir::ValueId> canonical_ids;
    for (const ModuleTensor& t : options_.module_tensors) {
      if (t.role != ir::ValueRole::Parameter && t.role != ir::ValueRole::Buffer) {
        throw TorchScriptImportError(cat("module tensor '", t.name, "': role must be parameter or buffer"));
      }
      const std::string& canonical = t.canonical.empty() ? t.name : t.canonical;
      auto it = canonical_ids.find(canonical);
      if (it == canonical_ids.end()) {
        it = canonical_ids.emplace(canonical, graph_.add_value(canonical, t.type, t.role)).first;
      }
      tensor_by_name_[t.name] = it->second;
      tensor_by_name_.emplace(canonical, it->second);
    }
  }

  void add_inputs(const jit::Graph& graph) {
    std::size_t next_name = 0;
    for (std::size_t k = 0; k < graph.inputs().size(); ++k) {
      const jit::Value* in = graph.inputs()[k];
      if (auto cls = in->type()->cast<c10::ClassType>(); cls && cls->is_module()) {
        env_[in] = Item::module("");  // `self`: the root of every prim::GetAttr chain
        continue;
      }
      std::string name;
      if (next_name < options_.input_names.size()) {
        name = options_.input_names[next_name];
      } else {
        name = in->debugName();
        // The graph uniquifies names with a ".N" suffix: "input_ids.1" is `input_ids`.
        if (auto dot = name.rfind('.'); dot != std::string::npos && dot + 1 < name.size() &&
                                         name.find_first_not_of("0123456789", dot + 1) == std::string::npos) {
          name.erase(dot);
        }
        if (name.empty() || std::isdigit(static_cast<unsigned char>(name.front()))) name = cat("input_", next_name);
      }
      ++next_name;
      env_[in] = bind_input(in->type(), sanitize(name), in);
    }
  }

  // A graph input: tensors become Input values, tuples/lists of tensors are flattened
  // ("<name>_<i>", as the export importer names them); anything else is unknown.
  Item bind_input(const c10::TypePtr& type, const std::string& name, const jit::Value* v) {
    if (type->kind() == c10::TypeKind::TensorType) {
      bool unknown = false;
      ir::TensorType t = tensor_type(type, [&] { return cat("graph input '", name, "'"); }, unknown);
      if (t.rank() >= 1) t.batch_dim = 0;
      const ir::ValueId id = graph_.add_value(unique(name), std::move(t), ir::ValueRole::Input);
      if (unknown) unknown_shape_.insert(id);
      return Item::value(id);
    }
    if (auto tuple = type->cast<c10::TupleType>()) {
      std::vector<Item> items;
      for (std::size_t k = 0; k < tuple->elements().size(); ++k) {
        items.push_back(bind_input(tuple->elements()[k], cat(name, "_", k), v));
      }
      return Item::sequence(Item::Kind::Tuple, std::move(items));
    }
    return Item::opaque(cat("graph input '", name, "' of type ", type->repr_str(), " (its value is only known at run time)"));
  }

  // The IR type of a TorchScript tensor type, which must be complete (sizes and
  // dtype). When it is not, the import goes on with a placeholder so that a more
  // fundamental problem further on (control flow) is the one reported, and fails at
  // the end: `unknown` says so.
  template <typename Describe>
  ir::TensorType tensor_type(const c10::TypePtr& type, Describe&& what, bool& unknown) {
    auto tt = type->cast<c10::TensorType>();
    if (!tt) throw TorchScriptImportError(cat(what(), " is not a tensor (", type->repr_str(), ")"));
    auto sizes = tt->sizes().concrete_sizes();
    auto st = tt->scalarType();
    if (!sizes || !st) {
      if (!first_shape_error_) {
        first_shape_error_ = cat(
            what(), " has no static shape and dtype in the TorchScript graph (type ", type->repr_str(),
            "); the importer needs them: capture the model with torch.jit.trace (scripted graphs carry no shapes)");
      }
      unknown = true;
      return ir::TensorType{};
    }
    auto dtype = to_ir_dtype(*st);
    if (!dtype) throw TorchScriptImportError(cat(what(), " has dtype ", c10::toString(*st), ", which the IR does not support"));
    return ir::TensorType{*dtype, std::vector<std::int64_t>(sizes->begin(), sizes->end()), std::nullopt};
  }

  ir::TensorType output_type(const jit::Value* v, const jit::Node* n, bool& unknown) {
    return tensor_type(v->type(), [&] { return cat("output '%", v->debugName(), "' of ", describe(n)); }, unknown);
  }

  std::string unique(const std::string& wanted) {
    std::string base = wanted.empty() ? std::string("v") : wanted;
    std::string name = base;
    for (int k = 1; graph_.find_value(name); ++k) name = cat(base, "_", k);
    return name;
  }

  Item& item(const jit::Value* v) {
    auto it = env_.find(v);
    if (it == env_.end()) {
      throw TorchScriptImportError(cat("internal: value %", v->debugName(), " used before it was imported"));
    }
    return it->second;
  }

  // ---- walking -----------------------------------------------------------------

  void import_block(jit::Block* block) {
    for (jit::Node* n : block->nodes()) import_node(n);
  }

  void import_node(jit::Node* n) {
    const std::string_view kind = n->kind().toQualString();
    if (kind == "prim::Constant") return constant(n);
    if (kind == "prim::GetAttr") return get_attr(n);
    if (kind == "prim::ListConstruct" || kind == "prim::TupleConstruct") {
      std::vector<Item> items;
      for (jit::Value* in : n->inputs()) items.push_back(item(in));
      env_[n->output()] = Item::sequence(kind == "prim::ListConstruct" ? Item::Kind::List : Item::Kind::Tuple, std::move(items));
      return;
    }
    if (kind == "prim::DictConstruct") {
      Item dict{Item::Kind::Dict};
      for (std::size_t k = 0; k + 1 < n->inputs().size(); k += 2) {
        dict.keys.push_back(item(n->input(k)));
        dict.items.push_back(item(n->input(k + 1)));
      }
      env_[n->output()] = std::move(dict);
      return;
    }
    if (kind == "prim::ListUnpack" || kind == "prim::TupleUnpack") return unpack(n);
    if (kind == "prim::TupleIndex") return index(n, item(n->input(0)), item(n->input(1)));
    if (kind == "prim::NumToTensor") return num_to_tensor(n);
    if (kind == "prim::unchecked_cast") {
      env_[n->output()] = item(n->input(0));
      return;
    }
    if (kind == "prim::If") return if_node(n);
    if (kind == "prim::Loop") {
      fail(n, "a loop (prim::Loop) cannot be expressed in the IR, which has no control flow; "
              "capture with torch.jit.trace (which unrolls loops) or torch.export");
    }
    if (kind == "prim::Uninitialized") {
      env_[n->output()] = Item::opaque("prim::Uninitialized");
      return;
    }
    if (kind == "prim::RaiseException") fail(n, "the program raises an exception on this path (prim::RaiseException)");
    if (kind == "aten::warn" || kind == "prim::Print") return;  // side effect only: nothing to shard
    if (kind == "prim::CallMethod" || kind == "prim::CallFunction") {
      fail(n, "a call that could not be inlined (is the method's module still alive?)");
    }
    if (kind == "prim::PythonOp") {
      if (n->hasAttribute(jit::attr::Subgraph)) return inline_python_op(n);
      fail(n, "a Python function the tracer could not see into (a torch.autograd.Function or "
              "@torch.jit.ignore'd code); it has no ATen schema, so it cannot be imported");
    }
    if (kind == "prim::dtype" || kind == "prim::device") return tensor_property(n, kind);
    if (kind == "aten::size" || kind == "aten::sym_size" || kind == "aten::dim" || kind == "aten::numel" ||
        kind == "aten::is_floating_point" || kind == "aten::len" || kind == "aten::__getitem__" ||
        kind == "aten::__is__" || kind == "aten::__isnot__" || kind == "aten::Int" || kind == "aten::Float" ||
        kind == "aten::ScalarImplicit" || kind == "aten::Bool") {
      if (special_scalar(n, kind)) return;
    }
    if (fold_known_tensor_arithmetic(n)) return;
    bool tensors = false;
    for (jit::Value* v : n->inputs()) tensors = tensors || contains_tensor(v->type());
    for (jit::Value* v : n->outputs()) tensors = tensors || contains_tensor(v->type());
    if (!tensors) return scalar_op(n);
    if (n->kind().is_prim()) fail(n, "this TorchScript construct has no counterpart in the IR");
    if (options_.elide_no_ops && elide_no_op(n, kind)) return;
    tensor_op(n);
  }

  // A torch.autograd.Function (Bloom's GeLUFunction): the tracer records its forward as the
  // PythonOp's Subgraph, whose inputs are the op's tensor inputs. The IR takes the forward's
  // ATen ops, as torch.export does; the function's own backward is not kept (the rank
  // program differentiates the forward ops, which is exact for a correct backward).
  void inline_python_op(jit::Node* n) {
    const std::shared_ptr<jit::Graph> sub = n->g(jit::attr::Subgraph);
    if (sub->inputs().size() != n->inputs().size() || sub->outputs().size() != n->outputs().size()) {
      fail(n, cat("a torch.autograd.Function whose traced forward takes ", sub->inputs().size(), " inputs and gives ",
                  sub->outputs().size(), " outputs where the call has ", n->inputs().size(), " and ",
                  n->outputs().size()));
    }
    const std::string path = module_path(n);
    for (jit::Node* inner : sub->nodes()) call_paths_.emplace(inner, path);  // when its scope is blank
    for (std::size_t i = 0; i < n->inputs().size(); ++i) env_[sub->inputs()[i]] = item(n->input(i));
    import_block(sub->block());
    for (std::size_t o = 0; o < n->outputs().size(); ++o) env_[n->output(o)] = item(sub->outputs()[o]);
  }

  // Ops that return their input unchanged: `x[:, :, :]` (the tracer records a full-range
  // aten::slice per `:`) and aten::contiguous (a memory layout request, not a value
  // change). torch.export records neither, so eliding them keeps both importers alike.
  bool elide_no_op(jit::Node* n, std::string_view kind) {
    if (kind != "aten::slice" && kind != "aten::contiguous") return false;
    const c10::FunctionSchema* schema = n->maybeSchema();
    if (!schema || n->outputs().size() != 1) return false;
    const Item& self = item(n->input(0));
    if (self.kind != Item::Kind::Tensor || (self.tensor >= 0 && unknown_shape_.count(self.tensor))) return false;
    if (kind == "aten::slice") {
      if (schema->overload_name() != "Tensor" || n->inputs().size() != 5) return false;
      const ir::TensorType& t = type_of(self);
      const Item& dim = item(n->input(1));
      const Item& start = item(n->input(2));
      const Item& end = item(n->input(3));
      const Item& step = item(n->input(4));
      if (!dim.is_number() || !step.is_number() || step.as_int() != 1 || t.rank() == 0) return false;
      std::int64_t d = dim.as_int();
      if (d < 0) d += t.rank();
      if (d < 0 || d >= t.rank()) return false;
      const bool from_start = start.kind == Item::Kind::None || (start.is_number() && start.as_int() == 0);
      const std::int64_t size = t.shape[static_cast<std::size_t>(d)];
      const bool to_end = end.kind == Item::Kind::None || (end.is_number() && end.as_int() >= size);
      if (!from_start || !to_end) return false;
    } else {
      const Item& format = item(n->input(1));
      if (!(format.kind == Item::Kind::Int && static_cast<c10::MemoryFormat>(format.i) == c10::MemoryFormat::Contiguous)) {
        return false;
      }
    }
    Item same = self;
    env_[n->output()] = std::move(same);
    return true;
  }

  void constant(jit::Node* n) {
    jit::Value* out = n->output();
    auto value = jit::toIValue(out);
    if (!value) fail(n, "constant without a value");
    env_[out] = from_ivalue(*value, n);
  }

  Item from_ivalue(const c10::IValue& v, const jit::Node* n) {
    if (v.isNone()) return Item::none();
    if (v.isBool()) return Item::boolean(v.toBool());
    if (v.isInt()) return Item::integer(v.toInt());
    if (v.isDouble()) return Item::real(v.toDouble());
    if (v.isString()) return Item::string(v.toStringRef());
    if (v.isDevice()) return Item::string(v.toDevice().str());
    if (v.isTensor()) return tensor_constant(v.toTensor(), n);
    if (v.isIntList()) {
      std::vector<Item> items;
      for (std::int64_t x : v.toIntVector()) items.push_back(Item::integer(x));
      return Item::sequence(Item::Kind::List, std::move(items));
    }
    if (v.isDoubleList()) {
      std::vector<Item> items;
      for (double x : v.toDoubleVector()) items.push_back(Item::real(x));
      return Item::sequence(Item::Kind::List, std::move(items));
    }
    if (v.isBoolList()) {
      std::vector<Item> items;
      for (bool x : v.toBoolList()) items.push_back(Item::boolean(x));
      return Item::sequence(Item::Kind::List, std::move(items));
    }
    if (v.isList() || v.isTuple()) {
      std::vector<Item> items;
      if (v.isList()) {
        for (const c10::IValue& x : v.toListRef()) items.push_back(from_ivalue(x, n));
      } else {
        for (const c10::IValue& x : v.toTupleRef().elements()) items.push_back(from_ivalue(x, n));
      }
      return Item::sequence(v.isList() ? Item::Kind::List : Item::Kind::Tuple, std::move(items));
    }
    return Item::opaque(cat("constant of type ", v.tagKind()));
  }

  Item tensor_constant(const at::Tensor& t, const jit::Node* n) {
    auto dtype = to_ir_dtype(t.scalar_type());
    if (!dtype) fail(n, cat("tensor constant of dtype ", c10::toString(t.scalar_type()), ", which the IR does not support"));
    LazyConstant c;
    c.type = ir::TensorType{*dtype, t.sizes().vec(), std::nullopt};
    c.name_hint = cat("const_", sanitize(n->output()->debugName()));
    // A 0-dim constant is most often a Python number the tracer wrapped (`x * 0.5`).
    if (t.dim() == 0 && !t.is_meta()) {
      if (t.scalar_type() == c10::ScalarType::Bool) {
        c.scalar = Item::boolean(t.item<bool>());
      } else if (c10::isIntegralType(t.scalar_type(), /*includeBool=*/false)) {
        c.scalar = Item::integer(t.item<std::int64_t>());
      } else if (c10::isFloatingType(t.scalar_type())) {
        c.scalar = Item::real(t.item<double>());
      }
    }
    return lazy(std::move(c));
  }

  Item lazy(LazyConstant c) {
    Item it{Item::Kind::Tensor};
    it.lazy = static_cast<int>(lazy_.size());
    lazy_.push_back(std::move(c));
    return it;
  }

  // The known value of a tensor item (a 0-dim constant or a folded size), if any.
  const std::optional<Item>& known_scalar(const Item& it) const {
    static const std::optional<Item> kNone;
    if (it.kind == Item::Kind::Tensor && it.lazy >= 0) return lazy_[static_cast<std::size_t>(it.lazy)].scalar;
    return kNone;
  }

  // The IR value of a tensor item, adding a lazily created constant on first use.
  ir::ValueId tensor_id(Item& it) {
    if (it.tensor >= 0) return it.tensor;
    LazyConstant& c = lazy_.at(static_cast<std::size_t>(it.lazy));
    if (!c.id) c.id = graph_.add_value(unique(c.name_hint), c.type, ir::ValueRole::Constant);
    it.tensor = *c.id;
    return *c.id;
  }

  std::string tensor_label(const Item& it) const {
    if (it.tensor >= 0) return graph_.value(it.tensor).name;
    return lazy_.at(static_cast<std::size_t>(it.lazy)).name_hint;
  }

  const ir::TensorType& type_of(const Item& it) const {
    if (it.tensor >= 0) return graph_.value(it.tensor).type;
    return lazy_.at(static_cast<std::size_t>(it.lazy)).type;
  }

  void get_attr(jit::Node* n) {
    const Item& owner = item(n->input(0));
    const std::string attr = n->s(c10::attr::name);
    if (owner.kind != Item::Kind::Module) {
      fail(n, cat("attribute '", attr, "' read from a ", kind_name(owner.kind), ", not a module"));
    }
    const std::string path = owner.s.empty() ? attr : cat(owner.s, ".", attr);
    const c10::TypePtr& type = n->output()->type();
    if (auto cls = type->cast<c10::ClassType>(); cls && cls->is_module()) {
      env_[n->output()] = Item::module(path);
      return;
    }
    if (auto it = tensor_by_name_.find(path); it != tensor_by_name_.end()) {
      env_[n->output()] = Item::value(it->second);
      return;
    }
    if (auto it = options_.module_constants.find(path); it != options_.module_constants.end()) {
      env_[n->output()] = from_attr(it->second);
      return;
    }
    if (contains_tensor(type)) {
      fail(n, cat("module attribute '", path, "' is a tensor that is neither a parameter nor a buffer of the module "
                  "(the parameter/buffer table passed to the importer does not list it)"));
    }
    env_[n->output()] = Item::opaque(cat("module attribute '", path, "' (", type->repr_str(),
                                         "), whose value the importer was not given"));
  }

  static Item from_attr(const ir::AttrValue& a) {
    return std::visit(
        [](const auto& v) -> Item {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, ir::NoneAttr>) return Item::none();
          else if constexpr (std::is_same_v<T, bool>) return Item::boolean(v);
          else if constexpr (std::is_same_v<T, std::int64_t>) return Item::integer(v);
          else if constexpr (std::is_same_v<T, double>) return Item::real(v);
          else if constexpr (std::is_same_v<T, std::string>) return Item::string(v);
          else if constexpr (std::is_same_v<T, std::vector<std::int64_t>>) {
            std::vector<Item> items;
            for (auto x : v) items.push_back(Item::integer(x));
            return Item::sequence(Item::Kind::List, std::move(items));
          } else {
            std::vector<Item> items;
            for (auto x : v) items.push_back(Item::real(x));
            return Item::sequence(Item::Kind::List, std::move(items));
          }
        },
        a);
  }

  void unpack(jit::Node* n) {
    const Item& seq = item(n->input(0));
    if (seq.kind != Item::Kind::List && seq.kind != Item::Kind::Tuple) {
      fail(n, cat("cannot unpack a ", kind_name(seq.kind), seq.kind == Item::Kind::Opaque ? cat(" (", seq.s, ")") : ""));
    }
    if (seq.items.size() != n->outputs().size()) {
      fail(n, cat("unpacks ", n->outputs().size(), " values from a sequence of ", seq.items.size()));
    }
    const std::vector<Item> items = seq.items;  // copy: env_ may rehash below
    for (std::size_t k = 0; k < items.size(); ++k) env_[n->output(k)] = items[k];
  }

  void index(jit::Node* n, const Item& seq, const Item& key) {
    if (seq.kind == Item::Kind::Dict) {
      for (std::size_t k = 0; k < seq.keys.size(); ++k) {
        if (same_known(seq.keys[k], key)) {
          env_[n->output()] = seq.items[k];
          return;
        }
      }
      fail(n, "key not found in a dict the importer folded");
    }
    if ((seq.kind != Item::Kind::List && seq.kind != Item::Kind::Tuple) || !key.is_number()) {
      env_[n->output()] = Item::opaque(cat("element of a ", kind_name(seq.kind), " (", n->kind().toQualString(), ")"));
      return;
    }
    std::int64_t k = key.as_int();
    const auto size = static_cast<std::int64_t>(seq.items.size());
    if (k < 0) k += size;
    if (k < 0 || k >= size) fail(n, cat("index ", key.as_int(), " out of range for a sequence of ", size));
    Item picked = seq.items[static_cast<std::size_t>(k)];
    env_[n->output()] = std::move(picked);
  }

  void num_to_tensor(jit::Node* n) {
    const Item& x = item(n->input(0));
    LazyConstant c;
    c.name_hint = cat("const_", sanitize(n->output()->debugName()));
    ir::DType dtype = number_dtype(x);
    if (auto tt = n->output()->type()->cast<c10::TensorType>(); tt && tt->scalarType()) {
      if (auto d = to_ir_dtype(*tt->scalarType())) dtype = *d;
    }
    c.type = ir::TensorType{dtype, {}, std::nullopt};
    if (x.is_number()) {
      c.scalar = x;
    } else {
      fail(n, cat("converts a ", kind_name(x.kind), x.kind == Item::Kind::Opaque ? cat(" (", x.s, ")") : "",
                  " to a tensor; only numbers known at import time can be folded"));
    }
    env_[n->output()] = lazy(std::move(c));
  }

  void tensor_property(jit::Node* n, std::string_view kind) {
    Item& x = item(n->input(0));
    if (x.kind != Item::Kind::Tensor) fail(n, cat("expects a tensor, got a ", kind_name(x.kind)));
    if (kind == "prim::dtype" && x.tensor >= 0 && unknown_shape_.count(x.tensor)) {
      env_[n->output()] = Item::opaque(cat("the dtype of '", tensor_label(x), "', which the graph does not record"), true);
      return;
    }
    if (kind == "prim::dtype") {
      // The ScalarType enum value, as TorchScript passes dtypes around.
      const ir::DType d = type_of(x).dtype;
      static const std::pair<ir::DType, c10::ScalarType> kMap[] = {
          {ir::DType::F64, c10::ScalarType::Double}, {ir::DType::F32, c10::ScalarType::Float},
          {ir::DType::F16, c10::ScalarType::Half},   {ir::DType::BF16, c10::ScalarType::BFloat16},
          {ir::DType::F8E4M3, c10::ScalarType::Float8_e4m3fn}, {ir::DType::F8E5M2, c10::ScalarType::Float8_e5m2},
          {ir::DType::I64, c10::ScalarType::Long},   {ir::DType::I32, c10::ScalarType::Int},
          {ir::DType::I16, c10::ScalarType::Short},  {ir::DType::I8, c10::ScalarType::Char},
          {ir::DType::U8, c10::ScalarType::Byte},    {ir::DType::Bool, c10::ScalarType::Bool},
          {ir::DType::C64, c10::ScalarType::ComplexFloat}, {ir::DType::C128, c10::ScalarType::ComplexDouble}};
      for (const auto& [ir_type, st] : kMap) {
        if (ir_type == d) env_[n->output()] = Item::integer(static_cast<std::int64_t>(st));
      }
      return;
    }
    std::string device = "cpu";
    if (auto tt = n->input(0)->type()->cast<c10::TensorType>(); tt && tt->device()) device = tt->device()->str();
    env_[n->output()] = Item::string(device);
  }

  // Ops on tensors whose results are known from static types, and conversions of known
  // numbers. Returns false to let the generic paths handle the node.
  bool special_scalar(jit::Node* n, std::string_view kind) {
    const std::string_view op = kind.substr(kind.find("::") + 2);
    if (op == "__is__" || op == "__isnot__") {
      const Item& x = item(n->input(0));
      const Item& y = item(n->input(1));
      bool same;
      if (x.kind == Item::Kind::None || y.kind == Item::Kind::None) {
        if (x.kind == Item::Kind::Opaque || y.kind == Item::Kind::Opaque) {
          env_[n->output()] = Item::opaque(cat("identity test on an unknown value (", n->kind().toQualString(), ")"));
          return true;
        }
        same = x.kind == y.kind;
      } else {
        same = same_known(x, y);
      }
      env_[n->output()] = Item::boolean(op == "__is__" ? same : !same);
      return true;
    }
    if (op == "len") {
      const Item& x = item(n->input(0));
      if (x.kind == Item::Kind::List || x.kind == Item::Kind::Tuple || x.kind == Item::Kind::Dict) {
        env_[n->output()] = Item::integer(static_cast<std::int64_t>(x.items.size()));
        return true;
      }
      if (x.kind == Item::Kind::Tensor) {
        const ir::TensorType& t = type_of(x);
        if (t.rank() == 0) fail(n, "len() of a 0-dim tensor");
        env_[n->output()] = Item::integer(t.shape[0]);
        return true;
      }
      return false;
    }
    if (op == "__getitem__") {
      const Item& seq = item(n->input(0));
      if (seq.kind == Item::Kind::Tensor) return false;  // a tensor index: a real op
      index(n, seq, item(n->input(1)));
      return true;
    }
    Item& x = item(n->input(0));
    if (x.kind == Item::Kind::Tensor) {
      const ir::TensorType& t = type_of(x);
      const bool shape_query = op == "size" || op == "sym_size" || op == "dim" || op == "numel" || op == "is_floating_point";
      if (shape_query && x.tensor >= 0 && unknown_shape_.count(x.tensor)) {
        for (jit::Value* v : n->outputs()) {
          env_[v] = Item::opaque(cat("the shape of '", tensor_label(x), "', which the graph does not record"), true);
        }
        return true;
      }
      if (op == "size" || op == "sym_size") {
        if (n->inputs().size() == 1) {
          std::vector<Item> dims;
          for (auto d : t.shape) dims.push_back(Item::integer(d));
          env_[n->output()] = Item::sequence(Item::Kind::List, std::move(dims));
          return true;
        }
        const Item& dim = item(n->input(1));
        if (!dim.is_number()) fail(n, cat("size() of a dimension not known at import time (", kind_name(dim.kind), ")"));
        std::int64_t d = dim.as_int();
        if (d < 0) d += t.rank();
        if (d < 0 || d >= t.rank()) fail(n, cat("dimension ", dim.as_int(), " out of range for a tensor of rank ", t.rank()));
        env_[n->output()] = Item::integer(t.shape[static_cast<std::size_t>(d)]);
        return true;
      }
      if (op == "dim") {
        env_[n->output()] = Item::integer(t.rank());
        return true;
      }
      if (op == "numel") {
        env_[n->output()] = Item::integer(t.numel());
        return true;
      }
      if (op == "is_floating_point") {
        env_[n->output()] = Item::boolean(ir::is_floating(t.dtype));
        return true;
      }
      // Int / Float / ScalarImplicit / Bool of a tensor: foldable only if its value is known.
      if (const auto& known = known_scalar(x)) {
        const std::string_view conv = op == "ScalarImplicit" ? std::string_view("ScalarImplicit") : op;
        auto folded = fold_number_op(n, conv, {*known});
        if (folded) {
          env_[n->output()] = *folded;
          return true;
        }
      }
      env_[n->output()] = Item::opaque(cat("the value of tensor '", tensor_label(x), "', computed at run time (",
                                           describe(n), ")"));
      return true;
    }
    if (x.is_number()) {
      if (auto folded = fold_number_op(n, op, {x})) {
        env_[n->output()] = *folded;
        return true;
      }
    }
    return false;
  }

  // Size arithmetic the tracer records on 0-dim tensors (x.size(3) // 2 becomes
  // NumToTensor + aten::floor_divide + aten::Int): folded when every tensor operand's
  // value is known, the result becoming another known 0-dim tensor.
  bool fold_known_tensor_arithmetic(jit::Node* n) {
    static const char* const kOps[] = {"aten::add", "aten::sub", "aten::mul", "aten::div", "aten::floor_divide",
                                       "aten::remainder", "aten::neg", "aten::rsub", "aten::to", "aten::detach",
                                       "aten::clone", "aten::contiguous", "aten::alias", "aten::floordiv",
                                       "aten::pow", "aten::sqrt"};
    const std::string_view kind = n->kind().toQualString();
    bool listed = false;
    for (const char* k : kOps) listed = listed || kind == k;
    if (!listed || n->outputs().size() != 1) return false;
    auto out_type = n->output()->type()->cast<c10::TensorType>();
    if (!out_type) return false;
    auto rank = out_type->sizes().size();
    if (rank && *rank != 0) return false;
    const c10::FunctionSchema* schema = n->maybeSchema();
    if (!schema) return false;
    std::vector<Item> operands;
    std::optional<Item> alpha;
    std::optional<std::string> rounding;
    bool saw_tensor = false;
    for (std::size_t k = 0; k < schema->arguments().size() && k < n->inputs().size(); ++k) {
      const c10::Argument& arg = schema->arguments()[k];
      const Item& x = item(n->input(k));
      if (classify(arg) == ArgClass::Tensor) {
        const auto& known = known_scalar(x);
        if (!known) return false;
        operands.push_back(*known);
        saw_tensor = true;
      } else if ((arg.name() == "other" || arg.name() == "exponent" || arg.name() == "self") && x.is_number()) {
        operands.push_back(x);
      } else if (arg.name() == "alpha") {
        alpha = x;
      } else if (arg.name() == "rounding_mode" && x.kind == Item::Kind::String) {
        rounding = x.s;
      }
    }
    if (!saw_tensor || operands.empty()) return false;
    const std::string_view op = kind.substr(6);  // after "aten::"
    std::optional<Item> result;
    if (op == "to" || op == "detach" || op == "clone" || op == "contiguous" || op == "alias") {
      result = operands[0];
    } else if (op == "neg" || op == "sqrt") {
      result = fold_number_op(n, op, {operands[0]});
    } else if (operands.size() == 2) {
      Item lhs = operands[0], rhs = operands[1];
      if (alpha && alpha->is_number() && !(alpha->as_double() == 1.0)) {
        auto scaled = fold_number_op(n, "mul", {op == "rsub" ? lhs : rhs, *alpha});
        if (!scaled) return false;
        (op == "rsub" ? lhs : rhs) = *scaled;
      }
      if (op == "rsub") {
        result = fold_number_op(n, "sub", {rhs, lhs});
      } else if (op == "div" && rounding) {
        auto q = fold_number_op(n, "div", {lhs, rhs});
        if (!q) return false;
        const double v = *rounding == "floor" ? std::floor(q->d) : std::trunc(q->d);
        result = both_int(lhs, rhs) ? Item::integer(static_cast<std::int64_t>(v)) : Item::real(v);
      } else {
        result = fold_number_op(n, op, {lhs, rhs});
      }
    }
    if (!result) return false;
    LazyConstant c;
    c.name_hint = cat("const_", sanitize(n->output()->debugName()));
    ir::DType dtype = number_dtype(*result);
    if (out_type->scalarType()) {
      if (auto d = to_ir_dtype(*out_type->scalarType())) dtype = *d;
    }
    // The result takes the tensor's dtype (a Long tensor floor-divided stays integral).
    if (dtype == ir::DType::Bool) {
      result = Item::boolean(result->as_double() != 0.0);
    } else if (is_integral(dtype)) {
      result = Item::integer(result->kind == Item::Kind::Double ? static_cast<std::int64_t>(result->d) : result->as_int());
    } else if (ir::is_floating(dtype)) {
      result = Item::real(result->as_double());
    }
    c.type = ir::TensorType{dtype, {}, std::nullopt};
    c.scalar = std::move(result);
    env_[n->output()] = lazy(std::move(c));
    return true;
  }

  // A node with no tensor in or out: evaluated if its inputs are known, else unknown.
  void scalar_op(jit::Node* n) {
    std::vector<Item> args;
    const Item* unknown_input = nullptr;
    for (jit::Value* v : n->inputs()) {
      args.push_back(item(v));
      if (!unknown_input && args.back().kind == Item::Kind::Opaque) unknown_input = &item(v);
    }
    if (unknown_input) {
      // Unknown because an input is: keep the root cause (a missing shape, a runtime value).
      for (jit::Value* v : n->outputs()) env_[v] = *unknown_input;
      return;
    }
    const std::string_view kind = n->kind().toQualString();
    const std::string_view op = kind.substr(kind.find("::") + 2);
    if (n->outputs().size() == 1) {
      if (op == "eq" || op == "ne") {
        if (args.size() == 2 && !(args[0].is_number() && args[1].is_number())) {
          const bool same = same_known(args[0], args[1]);
          env_[n->output()] = Item::boolean(op == "eq" ? same : !same);
          return;
        }
      }
      if ((op == "min" || op == "max") && args.size() == 1 && args[0].kind == Item::Kind::List && !args[0].items.empty()) {
        Item best = args[0].items[0];
        for (const Item& x : args[0].items) {
          if (!x.is_number()) break;
          if (op == "min" ? x.as_double() < best.as_double() : x.as_double() > best.as_double()) best = x;
        }
        env_[n->output()] = best;
        return;
      }
      if (op == "list" && args.size() == 1) {
        env_[n->output()] = args[0];
        return;
      }
      if (auto folded = fold_number_op(n, op, args)) {
        env_[n->output()] = *folded;
        return;
      }
    }
    for (jit::Value* v : n->outputs()) {
      env_[v] = Item::opaque(cat("the result of ", describe(n), ", which the importer does not fold"));
    }
  }

  // prim::If: the IR has no control flow, so the condition must be known at import
  // time (a static shape, a None check, a module flag); the branch taken is inlined.
  void if_node(jit::Node* n) {
    const Item& cond = item(n->input(0));
    if (cond.kind == Item::Kind::Opaque && cond.missing_shape) {
      fail(n, cat("the condition of this `if` depends on ", cond.s,
                  "; capture the model with torch.jit.trace, which records shapes (scripted graphs carry none)"));
    }
    if (!cond.is_number()) {
      fail(n, cat("data-dependent control flow: the condition of this `if` is ",
                  cond.kind == Item::Kind::Opaque ? cond.s : cat("a ", kind_name(cond.kind)),
                  ", not known at import time; the IR has no control flow. Capture with torch.jit.trace "
                  "(which records the branch taken) or torch.export"));
    }
    jit::Block* block = n->blocks().at(cond.as_int() != 0 ? 0 : 1);
    import_block(block);
    for (std::size_t k = 0; k < n->outputs().size(); ++k) {
      Item picked = item(block->outputs()[k]);
      env_[n->output(k)] = std::move(picked);
    }
  }

  // ---- tensor ops -------------------------------------------------------------------

  static std::string op_name(const c10::FunctionSchema& schema) {
    const std::string& overload = schema.overload_name();
    if (overload.empty() || overload == "default") return schema.name();
    return cat(schema.name(), ".", overload);
  }

  ir::AttrValue to_attr(const jit::Node* n, const std::string& arg, const Item& x) {
    switch (x.kind) {
      case Item::Kind::None: return ir::NoneAttr{};
      case Item::Kind::Bool: return x.b;
      case Item::Kind::Int: return x.i;
      case Item::Kind::Double: return x.d;
      case Item::Kind::String: return x.s;
      case Item::Kind::Tensor:
        if (const auto& known = known_scalar(x)) return to_attr(n, arg, *known);
        fail(n, cat("argument '", arg, "' wants a number but gets tensor '", tensor_label(x),
                    "', computed at run time; the IR cannot express data-dependent arguments"));
      case Item::Kind::List:
      case Item::Kind::Tuple: {
        bool all_int = true, all_number = true;
        std::vector<Item> numbers;
        for (const Item& e : x.items) {
          const Item* v = &e;
          if (e.kind == Item::Kind::Tensor && known_scalar(e)) v = &*known_scalar(e);
          numbers.push_back(*v);
          all_number = all_number && v->is_number();
          all_int = all_int && (v->kind == Item::Kind::Int || v->kind == Item::Kind::Bool);
        }
        if (all_int) {
          std::vector<std::int64_t> out;
          for (const Item& v : numbers) out.push_back(v.as_int());
          return out;
        }
        if (all_number) {
          std::vector<double> out;
          for (const Item& v : numbers) out.push_back(v.as_double());
          return out;
        }
        // e.g. a list holding None: kept readable (as the export importer does), never fatal.
        std::string text = "[";
        for (std::size_t k = 0; k < numbers.size(); ++k) {
          if (k) text += ", ";
          const Item& v = numbers[k];
          // An unknown element says why (its root cause), for the rule that reads the list.
          text += v.kind == Item::Kind::None ? std::string("None") : v.is_number() ? ir::attr_str(to_attr(n, arg, v))
                  : v.kind == Item::Kind::String ? v.s
                  : v.kind == Item::Kind::Opaque ? cat("<", v.s, ">") : std::string(kind_name(v.kind));
        }
        return text + "]";
      }
      case Item::Kind::Opaque:
        fail(n, cat("argument '", arg, "' is ", x.s, ", not known at import time"));
      default:
        fail(n, cat("argument '", arg, "' is a ", kind_name(x.kind), ", which cannot be an attribute"));
    }
  }

  std::string scalar_type_attr(std::int64_t v) {
    const auto st = static_cast<c10::ScalarType>(v);
    if (auto d = to_ir_dtype(st)) return std::string(ir::dtype_name(*d));
    return c10::toString(st);
  }

  // scalars_as_attrs: whether a known 0-dim tensor operand becomes a number attribute
  // (only next to a real tensor operand: a wrapped Python number; an op on known
  // scalars alone that was not folded keeps them as Constant values, so it still has
  // its operands).
  void add_operand(const jit::Node* n, const c10::Argument& arg, Item& x, std::vector<ir::ValueId>& inputs,
                   ir::Attributes& attrs, bool scalars_as_attrs) {
    const std::string& name = arg.name();
    switch (classify(arg)) {
      case ArgClass::OptionalTensor:
        if (x.kind == Item::Kind::None) {
          // Omitted from the inputs, but recorded (as the export importer does): with two
          // optional tensors (layer_norm's weight and bias) the inputs alone are ambiguous.
          attrs[name] = ir::NoneAttr{};
          return;
        }
        [[fallthrough]];
      case ArgClass::Tensor:
        if (x.kind != Item::Kind::Tensor) {
          if (x.is_number()) {  // a number where the schema wants a tensor (scripted code)
            attrs[name] = to_attr(n, name, x);
            return;
          }
          fail(n, cat("argument '", name, "' wants a tensor but gets a ", kind_name(x.kind),
                      x.kind == Item::Kind::Opaque ? cat(" (", x.s, ")") : ""));
        }
        if (scalars_as_attrs && known_scalar(x)) {
          attrs[name] = to_attr(n, name, *known_scalar(x));
          return;
        }
        inputs.push_back(tensor_id(x));
        return;
      case ArgClass::TensorList:
      case ArgClass::OptionalTensorList: {
        if (x.kind != Item::Kind::List && x.kind != Item::Kind::Tuple) {
          fail(n, cat("argument '", name, "' wants a list of tensors but gets a ", kind_name(x.kind)));
        }
        std::vector<std::int64_t> present;
        bool all_present = true;
        for (Item& e : x.items) {
          if (e.kind == Item::Kind::None) {
            present.push_back(0);
            all_present = false;
            continue;
          }
          if (e.kind != Item::Kind::Tensor) fail(n, cat("argument '", name, "' holds a ", kind_name(e.kind), ", not a tensor"));
          inputs.push_back(tensor_id(e));
          present.push_back(1);
        }
        // index.Tensor's [None, idx]: where the tensors sit (same key as the export importer).
        if (!all_present) attrs[name + "_present"] = std::move(present);
        return;
      }
      case ArgClass::ScalarType:
        if (x.kind == Item::Kind::None) attrs[name] = ir::NoneAttr{};
        else if (x.kind == Item::Kind::Int) attrs[name] = scalar_type_attr(x.i);
        else attrs[name] = to_attr(n, name, x);
        return;
      case ArgClass::Layout:
        if (x.kind == Item::Kind::Int) attrs[name] = layout_name(x.i);
        else attrs[name] = to_attr(n, name, x);
        return;
      case ArgClass::MemoryFormat:
        if (x.kind == Item::Kind::Int) attrs[name] = memory_format_name(x.i);
        else attrs[name] = to_attr(n, name, x);
        return;
      case ArgClass::Device:
      case ArgClass::Other:
        attrs[name] = to_attr(n, name, x);
        return;
    }
  }

  void tensor_op(jit::Node* n) {
    const c10::FunctionSchema* schema = n->maybeSchema();
    if (!schema) fail(n, "this op has no registered schema, so its arguments cannot be named");
    const auto& args = schema->arguments();
    if (args.size() != n->inputs().size() || schema->is_vararg()) {
      fail(n, cat("has ", n->inputs().size(), " inputs but its schema ", op_name(*schema), " takes ", args.size()));
    }
    std::string op = op_name(*schema);
    std::vector<ir::ValueId> inputs;
    ir::Attributes attrs;
    bool real_tensor = false;
    for (std::size_t k = 0; k < args.size(); ++k) {
      const Item& x = item(n->input(k));
      const ArgClass c = classify(args[k]);
      if ((c == ArgClass::Tensor || c == ArgClass::OptionalTensor) && x.kind == Item::Kind::Tensor) {
        real_tensor = real_tensor || !known_scalar(x);
      } else if (c == ArgClass::TensorList || c == ArgClass::OptionalTensorList) {
        for (const Item& e : x.items) real_tensor = real_tensor || (e.kind == Item::Kind::Tensor && !known_scalar(e));
      }
    }
    const bool scalars_as_attrs = options_.scalar_constants_as_attributes && real_tensor;
    for (std::size_t k = 0; k < args.size(); ++k) {
      add_operand(n, args[k], item(n->input(k)), inputs, attrs, scalars_as_attrs);
    }

    // Outputs: tensors, and lists of tensors (aten::split, aten::unbind) whose size and
    // element types come from the prim::ListUnpack that consumes them.
    std::vector<ir::OutputSpec> specs;
    std::vector<bool> unknown;  // per spec: shape missing from the graph
    struct Slot { std::size_t output; std::vector<const jit::Value*> elements; };
    std::vector<Slot> slots;
    for (std::size_t k = 0; k < n->outputs().size(); ++k) {
      const jit::Value* out = n->output(k);
      const c10::TypePtr& type = out->type();
      if (type->kind() == c10::TypeKind::TensorType) {
        bool u = false;
        specs.push_back({unique(sanitize(out->debugName())), output_type(out, n, u)});
        unknown.push_back(u);
        slots.push_back({k, {out}});
        continue;
      }
      if (auto list = type->cast<c10::ListType>(); list && list->getElementType()->kind() == c10::TypeKind::TensorType) {
        const jit::Node* unpack = nullptr;
        for (const jit::Use& use : out->uses()) {
          if (use.user->kind() == c10::prim::ListUnpack) {
            unpack = use.user;
            break;
          }
        }
        if (!unpack) {
          fail(n, cat("returns a list of tensors that is not unpacked (no prim::ListUnpack), so the number and "
                      "shapes of its elements are unknown"));
        }
        Slot slot{k, {}};
        for (const jit::Value* e : unpack->outputs()) {
          bool u = false;
          specs.push_back({unique(sanitize(e->debugName())), output_type(e, unpack, u)});
          unknown.push_back(u);
          slot.elements.push_back(e);
        }
        slots.push_back(std::move(slot));
        continue;
      }
      env_[out] = Item::opaque(cat("non-tensor result of ", describe(n)));
    }
    if (specs.empty()) {
      // e.g. aten::_assert_tensor_metadata, aten::item: nothing to shard; a use of a
      // result fails with the Opaque reason.
      return;
    }
    if (options_.canonicalize_convolution && op == "aten::_convolution") canonicalize_convolution(op, inputs, attrs);
    const ir::NodeId id = graph_.add_node(std::move(op), std::move(inputs), std::move(specs), std::move(attrs), module_path(n));
    const auto& outs = graph_.node(id).outputs;
    for (std::size_t k = 0; k < outs.size(); ++k) {
      if (unknown[k]) unknown_shape_.insert(outs[k]);
    }
    std::size_t next = 0;
    for (const Slot& slot : slots) {
      const jit::Value* out = n->output(slot.output);
      if (out->type()->kind() == c10::TypeKind::TensorType) {
        env_[out] = Item::value(outs[next++]);
        continue;
      }
      std::vector<Item> items;
      for (std::size_t e = 0; e < slot.elements.size(); ++e) items.push_back(Item::value(outs[next++]));
      env_[out] = Item::sequence(Item::Kind::List, std::move(items));
    }
  }

  // aten::_convolution(input, weight, bias?, stride, padding, dilation, transposed,
  // output_padding, groups, benchmark, deterministic, cudnn_enabled, allow_tf32) ->
  // aten::conv<N>d / aten::conv_transpose<N>d, the ops nn.ConvNd calls.
  void canonicalize_convolution(std::string& op, const std::vector<ir::ValueId>& inputs, ir::Attributes& attrs) {
    if (inputs.size() < 2) return;
    const int spatial = graph_.value(inputs[1]).type.rank() - 2;
    auto transposed = attrs.find("transposed");
    if (spatial < 1 || spatial > 3 || transposed == attrs.end() || !std::holds_alternative<bool>(transposed->second)) return;
    const bool is_transposed = std::get<bool>(transposed->second);
    ir::Attributes out;
    for (const char* key : {"stride", "padding", "dilation", "groups"}) {
      if (auto it = attrs.find(key); it != attrs.end()) out[key] = it->second;
    }
    if (is_transposed) {
      if (auto it = attrs.find("output_padding"); it != attrs.end()) out["output_padding"] = it->second;
    }
    op = cat("aten::", is_transposed ? "conv_transpose" : "conv", spatial, "d");
    attrs = std::move(out);
  }

  void flatten_output(Item& x, const jit::Node* ret, std::vector<ir::ValueId>& out) {
    switch (x.kind) {
      case Item::Kind::Tensor: out.push_back(tensor_id(x)); return;
      case Item::Kind::List:
      case Item::Kind::Tuple:
      case Item::Kind::Dict:
        for (Item& e : x.items) flatten_output(e, ret, out);
        return;
      case Item::Kind::Opaque:
        fail(ret, cat("the model returns ", x.s));
      default:
        return;  // None, numbers, strings: not part of the computation to shard
    }
  }

  const TorchScriptImportOptions& options_;
  ir::Graph graph_;
  std::unordered_map<const jit::Value*, Item> env_;
  std::vector<LazyConstant> lazy_;
  std::unordered_map<std::string, ir::ValueId> tensor_by_name_;
  PathTable call_paths_;  // module paths of inlined nodes (what scripted graphs have instead of scopes)
  std::unordered_set<ir::ValueId> unknown_shape_;   // values whose shape the graph does not record
  std::optional<std::string> first_shape_error_;  // reported at the end, or as a note
};

}  // namespace

std::optional<ir::DType> to_ir_dtype(c10::ScalarType st) {
  switch (st) {
    case c10::ScalarType::Double: return ir::DType::F64;
    case c10::ScalarType::Float: return ir::DType::F32;
    case c10::ScalarType::Half: return ir::DType::F16;
    case c10::ScalarType::BFloat16: return ir::DType::BF16;
    case c10::ScalarType::Float8_e4m3fn: return ir::DType::F8E4M3;
    case c10::ScalarType::Float8_e5m2: return ir::DType::F8E5M2;
    case c10::ScalarType::Long: return ir::DType::I64;
    case c10::ScalarType::Int: return ir::DType::I32;
    case c10::ScalarType::Short: return ir::DType::I16;
    case c10::ScalarType::Char: return ir::DType::I8;
    case c10::ScalarType::Byte: return ir::DType::U8;
    case c10::ScalarType::Bool: return ir::DType::Bool;
    case c10::ScalarType::ComplexFloat: return ir::DType::C64;
    case c10::ScalarType::ComplexDouble: return ir::DType::C128;
    default: return std::nullopt;
  }
}

ir::Graph import_torchscript(const std::shared_ptr<torch::jit::Graph>& graph, const TorchScriptImportOptions& options) {
  return Importer(options).run(graph);
}

}  // namespace shardwise::torchbridge
