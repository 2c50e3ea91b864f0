// Rule templates: dimension rules whose shape depends on a node's attributes (which dim a
// softmax runs over, which dims a view splits), called from the op table as
// "name(arg, ...)" (see rule_text.h for the argument syntax).
//
// The templates, their parameters (a default in brackets; none = required) and meaning.
// "dim" parameters accept negative dims; a list parameter also accepts one integer.
//
//   elementwise()                      n-ary numpy broadcasting; every output the broadcast shape
//   expand(size)                       broadcast input 0 to `size` (-1 keeps a dim); new dims Spatial
//   whole(dim, statistics[0])          as elementwise, but the listed dims Whole (softmax, cumsum,
//                                      flip, triu); outputs keep input 0's shape. `statistics`
//                                      (ops::Index::statistics) goes on the listed dims: softmax's
//                                      2 (max and sum) make its dim splittable; 0 = never split
//   whole_resized(dim[-1])             as whole, but outputs may resize the listed dims (diff, topk)
//   reduce_sum(dim[none], keepdim[false])   listed dims (none or [] = all) Reduced(sum); also
//   reduce_mean / reduce_max / reduce_min   Reduced(mean / max / min), and reduce_whole: the
//   reduce_whole                            reduced dims Whole (var, argmax: no partial form)
//   transpose(dim0, dim1)              swap two dims (a rank < 2 tensor passes through)
//   permute(dims[none])                reorder dims; none reverses them all (numpy's x.T)
//   reshape(size[none])                view / reshape by factorisation (reshape_factorisation.h);
//                                      with no size, a second input gives the shape (view_as)
//   flatten(start_dim[0], end_dim[-1]), unflatten(dim, sizes), unsqueeze(dim),
//   squeeze(dim[none])                 the same factorisation, output shape from the attrs
//   slice(dim[0], start[none], end[none], step[1])   the sliced dim Whole (unless kept whole)
//   narrow(dim, length)                as slice
//   select(dim)                        the dim Whole on the input, gone from the output
//   cat(dim[0]), stack(dim[0])         the joined dim Whole; when cat's inputs are equal along
//                                      it, the output dim is (P c): P Whole parts, c Spatial,
//                                      so a fused q|k|v tensor stays splittable (strided)
//   split(split_size, dim[0]), split_sizes(split_sizes, dim[0]), chunk(chunks, dim[0]),
//   unbind(dim[0])                     the reverse of cat: equal parts give input dim (P c)
//   index_select(dim), gather(dim), scatter(dim)   the indexed dim Whole in the source
//                                      (index_select's with `lookup`: Index::lookup)
//   embedding()                        [V, e] weight, ids of any rank -> [..., e]: V Whole
//                                      with `lookup`, e and the ids' dims Spatial
//   index(indices_present[none])       advanced indexing (index tensors, Nones omitted): the
//                                      indexed dims Whole, index tensors' dims Spatial, placed
//                                      where the indexed dims were when adjacent, else first
//                                      (numpy). indices_present: 1 per entry of the index list
//                                      that is a tensor, 0 per None (x[..., [-2], :] is
//                                      [0, 0, 1]); none: the tensors index the leading dims
//   index_put(indices_present[none])   indexed dims of self Whole; index and value dims Whole
//   conv(groups[1], transposed[false]) N Spatial, in-channels Reduced, out-channels Spatial,
//                                      groups (when > 1) a Spatial major factor of both,
//                                      windows and kernel dims Whole
//   window(rank)                       pooling over the last `rank` dims: those Whole, the rest
//                                      Spatial
//   norm_last(normalized_shape, statistics[0])
//                                      layer/rms norm: the last len(normalized_shape) dims Whole,
//                                      with `statistics` (layer norm 2: mean and variance; rms
//                                      norm 1: the mean square)
//   batch_norm(training[false])        [N, C, ...]: C Spatial, the rest Whole; N Spatial in
//                                      evaluation, Whole with 2 statistics (mean, variance) in
//                                      training, so a batch split combines them across ranks
//                                      (SyncBatchNorm: the single-device result)
//   group_norm()                       [N, C, ...]: N Spatial, the rest Whole
//   attention(enable_gqa[false], is_causal[false])   scaled dot-product attention, see below
//   cross_entropy(reduction[1], statistics[0])
//                                      [N, C, d...] logits: C Whole; N and d... Spatial when
//                                      reduction is none (0), else Reduced(mean (1) / sum (2)).
//                                      Partial(mean) is exact for equal shards with no ignored
//                                      targets. C carries `statistics`: the per-row values a
//                                      vocabulary-parallel loss combines across ranks (cross
//                                      entropy 3: max, sum of exponentials, the target's logit;
//                                      nll_loss 1: the target's value); 0 keeps C unsplittable
//   loss(reduction[1])                 elementwise loss (mse, l1): broadcast dims Spatial or
//                                      Reduced by the reduction, as cross_entropy
//   create(size[none])                 no data inputs (full, zeros, new_ones): every output dim
//                                      a new Spatial index; tensor inputs are metadata only
//   arange(end, start[0], step[1])     1-D creation with its length computed
//   pad(pad)                           the padded dims Whole
//   repeat(repeats)                    output dim = (r n): repeat count r (Spatial, output only)
//                                      major, input dim n minor
//   repeat_interleave(repeats, dim[none])   output dim = (n r)
//   matmul()                           torch.matmul: 1-D promotion and broadcasting batch dims
//   einsum(equation)                   the equation as a pattern (uppercase labels Whole)
//
// Attention: q [..., s, d], k [..., t, d], v [..., t, e], optional mask broadcastable to
// [..., s, t]; out [..., s, e]. Batch dims (usually b, h) and s are Spatial, e is Spatial
// (split v's columns), d and t are Whole: splitting d leaves partial scores, but a softmax
// of partial sums is not a partial sum of softmaxes; splitting t needs a log-sum-exp
// rescaling (ring or flash-decoding attention) that is not a plain Partial. With
// enable_gqa, q's heads are (g r) and k/v's heads (g): the kv groups g stay splittable.
// With is_causal, s is Whole too: the causal mask is by position within the call.
// A k or v batch dim of 1 where q's is larger broadcasts (multi-query attention's one
// k/v head): a unit dim tied to no index.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ir/attribute.h"
#include "ops/dim_rule.h"
#include "ops/rule_operands.h"
#include "ops/rule_text.h"

namespace shardwise::ops {

struct TemplateParam {
  std::string name;
  std::optional<ir::AttrValue> default_value;  // nullopt: the rule must bind it
};

struct RuleTemplateInfo {
  std::string name;
  std::vector<TemplateParam> params;
};

// Every template, in the order listed above.
const std::vector<RuleTemplateInfo>& rule_templates();

// Whether the template's rules have an Index::lookup (embedding, index_select): the op's
// backward scatters into a dense gradient the size of input 0.
bool template_has_lookup(std::string_view name);

// Throws support::ValidationError for an unknown template, more arguments than
// parameters, or a required parameter left unbound.
void check_template_call(const TemplateCall& call);

// Builds the rule for one node (see rule_operands.h for the two modes). Throws
// support::ValidationError when an attribute is missing or malformed, or the operands
// cannot fit the template.
std::optional<DimRule> instantiate_template(const TemplateCall& call, const RuleOperands& operands);

}  // namespace shardwise::ops
