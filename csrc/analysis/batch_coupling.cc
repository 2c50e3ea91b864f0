#include "analysis/batch_coupling.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "analysis/batch_dim.h"
#include "ops/node_rule.h"
#include "support/error.h"

namespace shardwise::analysis {

std::string_view loss_combination_name(LossCombination combination) {
  return combination == LossCombination::Sum ? "sum" : "mean";
}

std::string BatchCoupling::describe(std::size_t at_most) const {
  std::string out;
  for (std::size_t i = 0; i < sites.size() && i < at_most; ++i) {
    const CouplingSite& s = sites[i];
    if (i > 0) out += "; ";
    const std::string where = s.module_path.empty() ? "the top-level module" : fmt::format("module '{}'", s.module_path);
    out += fmt::format("{} in {} (node '{}') {}", s.op, where, s.node, s.reason);
  }
  if (sites.size() > at_most) out += fmt::format("; and {} more", sites.size() - at_most);
  return out;
}

namespace {

// Zero: Independent and known to be all zeros (ops::OpSpec::zeros), the neutral term of a sum.
// Positions: an arange as long as the batch (and views of it), perhaps row i's position,
// tracked as Rows are through data movement. Reading the batch dim of Rows at those positions
// reads each row itself (transformers' padding masks: mask[arange(b)[:, None, None, None], kv]),
// which a micro-batch's own arange does for its rows. Used otherwise it is a plain constant:
// torch.export keeps no record of where a length came from, and an arange as long as the
// batch is as often a sequence's (T5's relative positions at a decoder length equal to the
// batch), so it is taken for one, as the rewrite takes it.
enum class Kind : std::uint8_t { Independent, Zero, Positions, Rows, Sum, Mean, Coupled };

struct State {
  Kind kind = Kind::Independent;
  int dim = -1;             // Rows: the dim holding the batch
  std::int64_t outer = 1;   // Rows: elements of other indices major to the batch in that dim
};

bool reduced(Kind k) { return k == Kind::Sum || k == Kind::Mean; }

// The index of `dims` (one operand dim of `rule`) that holds the batch as its major factor
// when `outer` elements of other indices are major to it in the dim; -1 when none does (the
// batch is cut across indices, or sits inside one as a minor factor).
int batch_index(const ops::DimRule& rule, const ops::DimIndices& dims, std::int64_t outer, std::int64_t batch) {
  std::int64_t before = 1;
  for (int index : dims) {
    if (before > outer) return -1;
    const std::int64_t size = rule.indices[static_cast<std::size_t>(index)].size;
    if (before == outer) return size % batch == 0 ? index : -1;
    before *= size;
  }
  return -1;
}

// Follows the batch through the graph in node order (see the header).
class Follower {
 public:
  Follower(const ops::OpTable& table, const ir::Graph& graph, std::int64_t batch)
      : table_(table), graph_(graph), batch_(batch), states_(graph.values().size()) {
    // Inputs whose batch dim has the batch's size (a [1, s] position table marked at dim 0 is
    // the same for every micro-batch, not split).
    for (ir::ValueId in : graph.inputs()) {
      const ir::TensorType& type = graph.value(in).type;
      if (type.batch_dim && type.shape.at(static_cast<std::size_t>(*type.batch_dim)) == batch)
        states_[static_cast<std::size_t>(in)] = State{Kind::Rows, *type.batch_dim, 1};
    }
  }

  BatchCoupling run() {
    for (const ir::Node& node : graph_.nodes()) visit(node);
    // What the rows meet in first; writes into buffers (batch norm's counter beside its
    // statistics) after them.
    sites_.insert(sites_.end(), writes_.begin(), writes_.end());
    BatchCoupling out{.batch = batch_, .loss = LossCombination::Mean, .sites = std::move(sites_)};
    // The first output is the loss (a graph captured with it, as parallelize captures); others
    // are what a model returns beside it (logits, hidden states), each a micro-batch's own rows.
    if (!graph_.outputs().empty() && state(graph_.outputs().front()).kind == Kind::Sum) out.loss = LossCombination::Sum;
    return out;
  }

 private:
  const State& state(ir::ValueId id) const { return states_[static_cast<std::size_t>(id)]; }
  const std::string& name(ir::ValueId id) const { return graph_.value(id).name; }

  void set_outputs(const ir::Node& node, const State& s) {
    for (ir::ValueId o : node.outputs) states_[static_cast<std::size_t>(o)] = s;
  }

  void couple(const ir::Node& node, std::string reason, bool write = false) {
    const std::string first = node.outputs.empty() ? std::string() : name(node.outputs.front());
    (write ? writes_ : sites_).push_back({node.op, first, node.module_path, std::move(reason)});
    set_outputs(node, State{Kind::Coupled, -1, 1});
  }

  void visit(const ir::Node& node) {
    const ops::OpSpec* spec = table_.find(node.op);
    if (writes_a_leaf(node)) {
      couple(node, fmt::format("writes into '{}' on every forward: m micro-batches would write it m times",
                               name(node.inputs.front())),
             true);
      return;
    }
    std::vector<std::size_t> rows, parts;  // rows: Rows and Positions operands
    for (std::size_t k = 0; k < node.inputs.size(); ++k) {
      const State& s = state(node.inputs[k]);
      if (s.kind == Kind::Coupled) {  // one origin is enough: the rest follows from it
        set_outputs(node, s);
        return;
      }
      if (s.kind == Kind::Rows || s.kind == Kind::Positions) rows.push_back(k);
      if (reduced(s.kind)) parts.push_back(k);
    }
    if (rows.empty() && parts.empty()) {  // Independent, zeros, or the batch's positions
      if (spec != nullptr && spec->zeros) set_outputs(node, State{Kind::Zero});
      if (spec != nullptr && counts_the_batch(node, *spec)) set_outputs(node, State{Kind::Positions, 0, 1});
      return;
    }
    if (!rows.empty() && !parts.empty()) {
      couple(node, fmt::format("combines '{}', a value reduced over the batch, with per-row values: each row would "
                               "see its micro-batch's value, not the batch's",
                               name(node.inputs[parts.front()])));
      return;
    }
    if (spec == nullptr) {
      couple(node, "has no dimension rule: how it reads the batch is unknown");
      return;
    }
    if (!parts.empty()) {
      follow_parts(node, *spec, parts);
      return;
    }
    std::optional<ops::DimRule> rule;
    try {
      rule = ops::dim_rule_for(table_, graph_, node);
    } catch (const support::ValidationError&) {
      rule.reset();  // shapes its rule cannot take: nothing known about it
    }
    if (!rule) {
      couple(node, "has no dimension rule for these shapes: how it reads the batch is unknown");
      return;
    }
    follow_rows(node, *spec, *rule, rows);
  }

  // An arange from 0 over the batch, step 1 (its rule is the arange template: data, not a name).
  bool counts_the_batch(const ir::Node& node, const ops::OpSpec& spec) const {
    if (!node.inputs.empty() || node.outputs.size() != 1 || spec.rule_text.rfind("arange(", 0) != 0) return false;
    const ir::TensorType& type = graph_.value(node.outputs.front()).type;
    if (type.shape != std::vector<std::int64_t>{batch_} || ir::is_floating(type.dtype)) return false;
    auto is = [&](const char* key, std::int64_t expected) {
      const auto it = node.attrs.find(key);
      if (it == node.attrs.end()) return true;  // the schema default: start 0, step 1
      const auto* v = std::get_if<std::int64_t>(&it->second);
      return v != nullptr && *v == expected;
    };
    return is("start", 0) && is("step", 1);
  }

  // An in-place op on a parameter or buffer (`num_batches_tracked += 1`, `buffer.copy_(...)`):
  // run once per micro-batch it is not the one write of the step.
  bool writes_a_leaf(const ir::Node& node) const {
    if (node.inputs.empty()) return false;
    const std::string_view base = ops::op_base_name(node.op);
    if (base.empty() || base.back() != '_') return false;
    const ir::ValueRole role = graph_.value(node.inputs.front()).role;
    return role == ir::ValueRole::Buffer || role == ir::ValueRole::Parameter;
  }

  // Operands reduced over the batch (Sum, Mean) at the positions `parts`, the others Independent.
  void follow_parts(const ir::Node& node, const ops::OpSpec& spec, const std::vector<std::size_t>& parts) {
    const Kind kind = state(node.inputs[parts.front()]).kind;
    for (std::size_t k : parts) {
      if (state(node.inputs[k]).kind != kind) {
        couple(node, fmt::format("adds a sum over the batch to a mean over it ('{}', '{}'): no one factor makes the "
                                 "micro-batches' values the batch's",
                                 name(node.inputs[parts.front()]), name(node.inputs[k])));
        return;
      }
    }
    std::size_t zeros = 0;  // zero terms of a sum change nothing
    for (ir::ValueId in : node.inputs) zeros += state(in).kind == Kind::Zero ? 1 : 0;
    if (spec.additive && parts.size() + zeros == node.inputs.size()) {
      set_outputs(node, State{kind});
      return;
    }
    if (parts.size() == 1 && parts.front() < 32 && (spec.linear_in >> parts.front()) & 1u) {
      set_outputs(node, State{kind});
      return;
    }
    if (spec.additive) {
      couple(node, fmt::format("adds a term that does not depend on the batch to '{}', a value reduced over it: m "
                               "micro-batches would add it m times",
                               name(node.inputs[parts.front()])));
      return;
    }
    couple(node, fmt::format("is not linear in '{}', a value reduced over the batch (a {}): the micro-batches' "
                             "values do not make the batch's",
                             name(node.inputs[parts.front()]), kind == Kind::Sum ? "sum" : "mean"));
  }

  // Operands holding rows of the batch at the positions `rows`, the others Independent.
  // Operands holding rows of the batch (Rows) or the rows' positions (Positions) at `rows`,
  // the others Independent.
  void follow_rows(const ir::Node& node, const ops::OpSpec& spec, const ops::DimRule& rule,
                   const std::vector<std::size_t>& rows) {
    std::map<std::size_t, int> at;  // operand -> the rule index holding its batch
    bool any_rows = false;
    for (std::size_t k : rows) {
      if (metadata_only(rule, k)) continue;
      const State& s = state(node.inputs[k]);
      const auto& dims = rule.inputs[k];
      const int index = s.dim >= 0 && static_cast<std::size_t>(s.dim) < dims.size()
                            ? batch_index(rule, dims[static_cast<std::size_t>(s.dim)], s.outer, batch_)
                            : -1;
      if (index < 0) {
        couple(node, fmt::format("reshapes '{}' so that its batch dim is no longer one block: the micro-batch split "
                                 "cannot follow it",
                                 name(node.inputs[k])));
        return;
      }
      at[k] = index;
      any_rows = any_rows || s.kind == Kind::Rows;
    }
    if (at.empty()) return;  // only metadata read from the batch (type_as's second operand): Independent
    // A batch dim read at the rows' own positions is the rows themselves, at the positions'
    // index; positions read for anything else are values a micro-batch restarts at 0.
    std::set<std::size_t> addressing;
    for (auto& [k, index] : at) {
      if (state(node.inputs[k]).kind != Kind::Rows) continue;
      for (const ops::Addressing& a : rule.addressed) {
        const auto by = at.find(static_cast<std::size_t>(a.operand));
        if (a.index == index && by != at.end() && state(node.inputs[by->first]).kind == Kind::Positions) {
          index = by->second;
          addressing.insert(by->first);
        }
      }
    }
    // Positions put to any other use are constants (see Kind): not followed through this node.
    std::erase_if(at, [&](const auto& entry) {
      return state(node.inputs[entry.first]).kind == Kind::Positions && !addressing.contains(entry.first) &&
             (any_rows || !spec.linear);
    });
    if (at.empty()) return;  // Independent
    int index = -1;
    for (const auto& [k, at_k] : at) {
      if (index >= 0 && at_k != index) {
        couple(node, "pairs rows of the batch with each other (its operands' batch dims meet different indices)");
        return;
      }
      index = at_k;
    }
    const ops::Index& batch = rule.indices[static_cast<std::size_t>(index)];
    switch (batch.kind) {
      case ops::IndexKind::Spatial:
        for (std::size_t o = 0; o < node.outputs.size(); ++o) {
          State out = rows_of(rule.outputs[o], index, rule);
          if (!any_rows && out.kind == Kind::Rows) out.kind = Kind::Positions;  // moved positions
          states_[static_cast<std::size_t>(node.outputs[o])] = out;
        }
        return;
      case ops::IndexKind::Reduced:
        if (batch.reduction == ops::Reduction::Sum || batch.reduction == ops::Reduction::Mean) {
          set_outputs(node, State{batch.reduction == ops::Reduction::Sum ? Kind::Sum : Kind::Mean});
        } else {
          couple(node, fmt::format("takes a {} over the batch dim: a micro-batch's is not the batch's",
                                   ops::reduction_name(batch.reduction)));
        }
        return;
      case ops::IndexKind::Whole:
        if (batch.statistics > 0) {
          couple(node, "normalises over the batch dim (batch statistics, as batch norm in training mode): a "
                       "micro-batch's statistics are not the batch's");
        } else if (batch.lookup) {
          couple(node, "looks rows up along the batch dim: a micro-batch holds only its own rows");
        } else {
          couple(node, "needs the batch dim whole (it joins, orders or reduces along it): a micro-batch holds only "
                       "its own rows");
        }
        return;
    }
  }

  // Whether the node reads only metadata of input k (dtype, shape: type_as's second operand),
  // or nothing of it that an index names (ops/dim_rule.h).
  static bool metadata_only(const ops::DimRule& rule, std::size_t k) {
    const bool indexed = std::ranges::any_of(rule.inputs[k], [](const ops::DimIndices& dim) { return !dim.empty(); });
    return !indexed || rule.reads_metadata_only(k);
  }

  // An output with `dims` (its rule dims) carries the batch index `index`: Rows at that dim,
  // or Independent when it does not carry it (a read of metadata only).
  State rows_of(const ops::OperandDims& dims, int index, const ops::DimRule& rule) const {
    for (std::size_t d = 0; d < dims.size(); ++d) {
      std::int64_t before = 1;
      for (int i : dims[d]) {
        if (i == index) return State{Kind::Rows, static_cast<int>(d), before};
        before *= rule.indices[static_cast<std::size_t>(i)].size;
      }
    }
    return State{};
  }

  const ops::OpTable& table_;
  const ir::Graph& graph_;
  std::int64_t batch_;
  std::vector<State> states_;
  std::vector<CouplingSite> sites_;
  std::vector<CouplingSite> writes_;
};

}  // namespace

BatchCoupling batch_coupling(const ops::OpTable& table, const ir::Graph& graph) {
  const std::int64_t batch = input_batch(graph);
  if (batch < 2) return BatchCoupling{.batch = batch, .loss = LossCombination::Mean, .sites = {}};
  return Follower(table, graph, batch).run();
}

}  // namespace shardwise::analysis
