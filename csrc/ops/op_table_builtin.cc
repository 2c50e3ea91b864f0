// The builtin op table: one row per op, read once into an OpTable (validated as it goes in).
//
// FLOPs constants (forward, multiply-add = 2; see FlopsKind in op_table.h):
//   pointwise ops              1 per output element, whatever their transcendental cost (as
//                              PyTorch's flop counter and MFU calculators, which ignore them)
//   sum / mean / max / pools   1 per input element
//   var / std                  3 per input element (mean, squared deviation, sum)
//   softmax / log_softmax      5 per input element (max, subtract, exp, sum, divide)
//   layer / batch / group norm 5 per input element (mean, variance, normalise, scale, shift)
//   rms norm                   4 per input element (square, mean, normalise, scale)
//   cross entropy              5 per logit (log_softmax, then a gather); nll_loss 1
//   attention                  2*B*s*t*(d+e) for its two products, plus the softmax: 5 per score
//   views, copies, casts, indexing, creation: 0
// Contractions and convolutions count 2 per multiply-add; a bias adds 1 per output element.
#include "ops/op_table.h"

#include <fmt/format.h>

#include <string_view>

#include "support/error.h"

namespace shardwise::ops {

namespace {

// One op: its rule, and its forward FLOPs (FlopsKind, per element where it counts them).
struct Row {
  std::string_view name;
  std::string_view rule;
  FlopsKind flops;
  int per_element;
};
using enum FlopsKind;
constexpr Row kRows[] = {
    // ---- contractions ----------------------------------------------------
    {"aten::mm", "mk,kn->mn", Contraction, 0},
    {"aten::bmm", "bmk,bkn->bmn", Contraction, 0},
    {"aten::addmm", "+~mn,mk,kn->mn", Contraction, 0},  // GPT-2's Conv1D: bias, x, w
    {"aten::baddbmm", "+~bmn,bmk,bkn->bmn", Contraction, 0},
    {"aten::addbmm", "+~mn,bmk,bkn->mn", Contraction, 0},
    {"aten::linear", "...k,nk,+n?->...n", Contraction, 0},
    {"aten::matmul", "matmul()", Contraction, 0},
    {"aten::mv", "mk,k->m", Contraction, 0},
    {"aten::addmv", "+~m,mk,k->m", Contraction, 0},
    {"aten::dot", "k,k->()", Contraction, 0},
    {"aten::vdot", "k,k->()", Contraction, 0},
    {"aten::einsum", "einsum(equation)", Contraction, 0},
    {"aten::outer", "m,n->mn", PerOutputElement, 1},
    {"aten::conv1d", "conv(groups=1)", Convolution, 0},
    {"aten::conv2d", "conv(groups=1)", Convolution, 0},
    {"aten::conv3d", "conv(groups=1)", Convolution, 0},
    {"aten::conv_transpose1d", "conv(groups=1, true)", Convolution, 0},
    {"aten::conv_transpose2d.input", "conv(groups=1, true)", Convolution, 0},
    {"aten::conv_transpose3d.input", "conv(groups=1, true)", Convolution, 0},
    {"aten::convolution", "conv(groups, transposed)", Convolution, 0},
    {"aten::_convolution", "conv(groups, transposed)", Convolution, 0},
    {"aten::scaled_dot_product_attention", "attention(enable_gqa=false, is_causal=false)", Attention, 5},
    {"aten::_scaled_dot_product_flash_attention_for_cpu", "attention(is_causal=false)", Attention, 5},
    {"aten::_scaled_dot_product_efficient_attention", "attention(is_causal=false)", Attention, 5},
    {"aten::_scaled_dot_product_attention_math", "attention(enable_gqa=false, is_causal=false)", Attention, 5},

    // ---- pointwise ---------------------------------------------------------
    {"aten::add.Tensor", "elementwise()", PerOutputElement, 1},
    {"aten::add_.Tensor", "elementwise()", PerOutputElement, 1},
    {"aten::add.Scalar", "elementwise()", PerOutputElement, 1},
    {"aten::sub.Tensor", "elementwise()", PerOutputElement, 1},
    {"aten::sub_.Tensor", "elementwise()", PerOutputElement, 1},
    {"aten::sub.Scalar", "elementwise()", PerOutputElement, 1},
    {"aten::rsub.Tensor", "elementwise()", PerOutputElement, 1},
    {"aten::rsub.Scalar", "elementwise()", PerOutputElement, 1},
    {"aten::mul.Tensor", "elementwise()", PerOutputElement, 1},
    {"aten::mul_.Tensor", "elementwise()", PerOutputElement, 1},
    {"aten::mul.Scalar", "elementwise()", PerOutputElement, 1},
    {"aten::div.Tensor", "elementwise()", PerOutputElement, 1},
    {"aten::div_.Tensor", "elementwise()", PerOutputElement, 1},
    {"aten::div.Scalar", "elementwise()", PerOutputElement, 1},
    {"aten::div.Tensor_mode", "elementwise()", PerOutputElement, 1},
    {"aten::div.Scalar_mode", "elementwise()", PerOutputElement, 1},
    {"aten::floor_divide", "elementwise()", PerOutputElement, 1},
    {"aten::remainder.Tensor", "elementwise()", PerOutputElement, 1},
    {"aten::remainder.Scalar", "elementwise()", PerOutputElement, 1},
    {"aten::fmod.Tensor", "elementwise()", PerOutputElement, 1},
    {"aten::fmod.Scalar", "elementwise()", PerOutputElement, 1},
    {"aten::pow.Tensor_Scalar", "elementwise()", PerOutputElement, 1},
    {"aten::pow.Tensor_Tensor", "elementwise()", PerOutputElement, 1},
    {"aten::pow.Scalar", "elementwise()", PerOutputElement, 1},
    {"aten::neg", "elementwise()", PerOutputElement, 1},
    {"aten::abs", "elementwise()", PerOutputElement, 1},
    {"aten::exp", "elementwise()", PerOutputElement, 1},
    {"aten::exp2", "elementwise()", PerOutputElement, 1},
    {"aten::expm1", "elementwise()", PerOutputElement, 1},
    {"aten::log", "elementwise()", PerOutputElement, 1},
    {"aten::log2", "elementwise()", PerOutputElement, 1},
    {"aten::log10", "elementwise()", PerOutputElement, 1},
    {"aten::log1p", "elementwise()", PerOutputElement, 1},
    {"aten::sqrt", "elementwise()", PerOutputElement, 1},
    {"aten::rsqrt", "elementwise()", PerOutputElement, 1},
    {"aten::reciprocal", "elementwise()", PerOutputElement, 1},
    {"aten::square", "elementwise()", PerOutputElement, 1},
    {"aten::sin", "elementwise()", PerOutputElement, 1},
    {"aten::cos", "elementwise()", PerOutputElement, 1},
    {"aten::tan", "elementwise()", PerOutputElement, 1},
    {"aten::tanh", "elementwise()", PerOutputElement, 1},
    {"aten::sigmoid", "elementwise()", PerOutputElement, 1},
    {"aten::sign", "elementwise()", PerOutputElement, 1},
    {"aten::floor", "elementwise()", PerOutputElement, 1},
    {"aten::ceil", "elementwise()", PerOutputElement, 1},
    {"aten::round", "elementwise()", PerOutputElement, 1},
    {"aten::trunc", "elementwise()", PerOutputElement, 1},
    {"aten::erf", "elementwise()", PerOutputElement, 1},
    {"aten::erfc", "elementwise()", PerOutputElement, 1},
    {"aten::relu", "elementwise()", PerOutputElement, 1},
    {"aten::relu_", "elementwise()", PerOutputElement, 1},
    {"aten::relu6", "elementwise()", PerOutputElement, 1},
    {"aten::gelu", "elementwise()", PerOutputElement, 1},
    {"aten::gelu_", "elementwise()", PerOutputElement, 1},
    {"aten::silu", "elementwise()", PerOutputElement, 1},
    {"aten::silu_", "elementwise()", PerOutputElement, 1},
    {"aten::elu", "elementwise()", PerOutputElement, 1},
    {"aten::selu", "elementwise()", PerOutputElement, 1},
    {"aten::leaky_relu", "elementwise()", PerOutputElement, 1},
    {"aten::hardtanh", "elementwise()", PerOutputElement, 1},
    {"aten::hardtanh_", "elementwise()", PerOutputElement, 1},
    {"aten::hardswish", "elementwise()", PerOutputElement, 1},
    {"aten::hardsigmoid", "elementwise()", PerOutputElement, 1},
    {"aten::softplus", "elementwise()", PerOutputElement, 1},
    {"aten::mish", "elementwise()", PerOutputElement, 1},
    {"aten::clamp", "elementwise()", PerOutputElement, 1},
    {"aten::clamp_", "elementwise()", PerOutputElement, 1},
    {"aten::clamp.Tensor", "elementwise()", PerOutputElement, 1},
    {"aten::clamp_min", "elementwise()", PerOutputElement, 1},
    {"aten::clamp_max", "elementwise()", PerOutputElement, 1},
    {"aten::maximum", "elementwise()", PerOutputElement, 1},
    {"aten::minimum", "elementwise()", PerOutputElement, 1},
    // torch.max(a, b) / torch.min(a, b) (T5's relative position buckets): binary
    // pointwise. Without these rows they would borrow aten::max's full reduction.
    {"aten::max.other", "elementwise()", PerOutputElement, 1},
    {"aten::min.other", "elementwise()", PerOutputElement, 1},
    {"aten::fmax", "elementwise()", PerOutputElement, 1},
    {"aten::fmin", "elementwise()", PerOutputElement, 1},
    {"aten::lerp.Scalar", "elementwise()", PerOutputElement, 1},
    {"aten::lerp.Tensor", "elementwise()", PerOutputElement, 1},
    {"aten::addcmul", "elementwise()", PerOutputElement, 1},
    {"aten::addcdiv", "elementwise()", PerOutputElement, 1},
    {"aten::nan_to_num", "elementwise()", PerOutputElement, 1},
    {"aten::eq.Tensor", "elementwise()", PerOutputElement, 1},
    {"aten::eq.Scalar", "elementwise()", PerOutputElement, 1},
    {"aten::ne.Tensor", "elementwise()", PerOutputElement, 1},
    {"aten::ne.Scalar", "elementwise()", PerOutputElement, 1},
    {"aten::lt.Tensor", "elementwise()", PerOutputElement, 1},
    {"aten::lt.Scalar", "elementwise()", PerOutputElement, 1},
    {"aten::le.Tensor", "elementwise()", PerOutputElement, 1},
    {"aten::le.Scalar", "elementwise()", PerOutputElement, 1},
    {"aten::gt.Tensor", "elementwise()", PerOutputElement, 1},
    {"aten::gt.Scalar", "elementwise()", PerOutputElement, 1},
    {"aten::ge.Tensor", "elementwise()", PerOutputElement, 1},
    {"aten::ge.Scalar", "elementwise()", PerOutputElement, 1},
    {"aten::isnan", "elementwise()", PerOutputElement, 1},
    {"aten::isinf", "elementwise()", PerOutputElement, 1},
    {"aten::isfinite", "elementwise()", PerOutputElement, 1},
    {"aten::logical_not", "elementwise()", PerOutputElement, 1},
    {"aten::logical_and", "elementwise()", PerOutputElement, 1},
    {"aten::logical_or", "elementwise()", PerOutputElement, 1},
    {"aten::logical_xor", "elementwise()", PerOutputElement, 1},
    {"aten::bitwise_not", "elementwise()", PerOutputElement, 1},
    {"aten::bitwise_and.Tensor", "elementwise()", PerOutputElement, 1},
    {"aten::bitwise_or.Tensor", "elementwise()", PerOutputElement, 1},
    {"aten::bitwise_xor.Tensor", "elementwise()", PerOutputElement, 1},
    {"aten::__and__.Tensor", "elementwise()", PerOutputElement, 1},
    {"aten::__or__.Tensor", "elementwise()", PerOutputElement, 1},
    {"aten::__xor__.Tensor", "elementwise()", PerOutputElement, 1},
    {"aten::masked_fill.Scalar", "elementwise()", PerOutputElement, 1},
    {"aten::masked_fill.Tensor", "elementwise()", PerOutputElement, 1},
    {"aten::masked_fill_.Scalar", "elementwise()", PerOutputElement, 1},
    {"aten::masked_fill_.Tensor", "elementwise()", PerOutputElement, 1},
    {"aten::where.self", "elementwise()", PerOutputElement, 1},
    {"aten::where.ScalarSelf", "elementwise()", PerOutputElement, 1},
    {"aten::where.ScalarOther", "elementwise()", PerOutputElement, 1},
    {"aten::where.Scalar", "elementwise()", PerOutputElement, 1},
    // Dropout draws a mask and scales: counted as one op per element; ranks draw
    // independent masks, which is what data parallel training does too.
    {"aten::dropout", "elementwise()", PerOutputElement, 1},
    {"aten::dropout_", "elementwise()", PerOutputElement, 1},
    {"aten::native_dropout", "elementwise()", PerOutputElement, 1},
    {"aten::feature_dropout", "elementwise()", PerOutputElement, 1},

    // ---- identity, casts, copies, metadata -------------------------------------
    {"aten::alias", "...->...", Zero, 0},
    {"aten::contiguous", "...->...", Zero, 0},
    {"aten::clone", "...->...", Zero, 0},
    {"aten::detach", "...->...", Zero, 0},
    {"aten::detach_", "...->...", Zero, 0},
    {"aten::lift_fresh_copy", "...->...", Zero, 0},
    {"aten::resolve_conj", "...->...", Zero, 0},
    {"aten::resolve_neg", "...->...", Zero, 0},
    {"aten::_to_copy", "...->...", Zero, 0},
    {"aten::to.dtype", "...,_?->...", Zero, 0},  // first: TorchScript's aten::to finds it
    {"aten::to.dtype_layout", "...,_?->...", Zero, 0},
    {"aten::to.device", "...,_?->...", Zero, 0},
    {"aten::to.other", "...,_?->...", Zero, 0},
    {"aten::type_as", "...,_->...", Zero, 0},
    {"aten::copy_", "elementwise()", Zero, 0},
    {"aten::fill_.Scalar", "...->...", Zero, 0},
    {"aten::fill_.Tensor", "...,_->...", Zero, 0},
    {"aten::fill.Scalar", "...->...", Zero, 0},  // functional forms (capture's of a write into a tensor)
    {"aten::fill.Tensor", "...,_->...", Zero, 0},
    {"aten::zero_", "...->...", Zero, 0},
    {"aten::zero", "...->...", Zero, 0},
    {"aten::ones_like", "...->...", Zero, 0},
    {"aten::zeros_like", "...->...", Zero, 0},
    {"aten::empty_like", "...->...", Zero, 0},
    {"aten::full_like", "...->...", Zero, 0},
    {"aten::rand_like", "...->...", Zero, 0},
    {"aten::randn_like", "...->...", Zero, 0},
    {"aten::bernoulli", "...->...", Zero, 0},
    // Complex numbers (rotary embeddings as the Llama reference code and torchtitan
    // write them): a complex tensor is its real view less the trailing (re, im) pair,
    // which stays whole: half of it is not a complex number. Not in kLinear although
    // they move data only: a partial sum reaching them is reduced before, in the real
    // dtype, since collectives on complex tensors are not supported by every backend.
    {"aten::view_as_complex", "...K->...", Zero, 0},
    {"aten::view_as_real", "...->...K", Zero, 0},
    {"aten::real", "...->...", Zero, 0},
    {"aten::imag", "...->...", Zero, 0},
    {"aten::conj", "...->...", Zero, 0},
    {"aten::_conj", "...->...", Zero, 0},
    {"aten::conj_physical", "...->...", Zero, 0},
    {"aten::complex", "elementwise()", PerOutputElement, 1},
    {"aten::polar", "elementwise()", PerOutputElement, 1},
    {"aten::angle", "elementwise()", PerOutputElement, 1},
    {"aten::_assert_tensor_metadata", "_->", Zero, 0},
    {"aten::_assert_async", "_->", Zero, 0},
    {"aten::_assert_async.msg", "_->", Zero, 0},
    {"aten::_assert_scalar", "->", Zero, 0},

    // ---- reductions ------------------------------------------------------------
    // The overload-less spellings bind dim too: TorchScript may name sum(x, dim) "aten::sum".
    {"aten::sum", "reduce_sum(dim, keepdim=false)", PerInputElement, 1},
    {"aten::sum.dim_IntList", "reduce_sum(dim, keepdim=false)", PerInputElement, 1},
    {"aten::nansum", "reduce_sum(dim, keepdim=false)", PerInputElement, 1},
    {"aten::count_nonzero.dim_IntList", "reduce_sum(dim)", PerInputElement, 1},
    {"aten::mean", "reduce_mean(dim, keepdim=false)", PerInputElement, 1},
    {"aten::mean.dim", "reduce_mean(dim, keepdim=false)", PerInputElement, 1},
    {"aten::amax", "reduce_max(dim=[], keepdim=false)", PerInputElement, 1},
    {"aten::amin", "reduce_min(dim=[], keepdim=false)", PerInputElement, 1},
    {"aten::max", "reduce_max()", PerInputElement, 1},
    {"aten::min", "reduce_min()", PerInputElement, 1},
    {"aten::any", "reduce_max(dim, keepdim=false)", PerInputElement, 1},
    {"aten::any.dim", "reduce_max(dim, keepdim=false)", PerInputElement, 1},
    {"aten::any.dims", "reduce_max(dim, keepdim=false)", PerInputElement, 1},
    {"aten::all", "reduce_min(dim, keepdim=false)", PerInputElement, 1},
    {"aten::all.dim", "reduce_min(dim, keepdim=false)", PerInputElement, 1},
    {"aten::all.dims", "reduce_min(dim, keepdim=false)", PerInputElement, 1},
    // Values with their indices, or statistics with no partial form: the dims stay whole.
    {"aten::max.dim", "reduce_whole(dim, keepdim=false)", PerInputElement, 1},
    {"aten::min.dim", "reduce_whole(dim, keepdim=false)", PerInputElement, 1},
    {"aten::argmax", "reduce_whole(dim, keepdim=false)", PerInputElement, 1},
    {"aten::argmin", "reduce_whole(dim, keepdim=false)", PerInputElement, 1},
    {"aten::prod", "reduce_whole(dim, keepdim=false)", PerInputElement, 1},
    {"aten::prod.dim_int", "reduce_whole(dim, keepdim=false)", PerInputElement, 1},
    {"aten::var.correction", "reduce_whole(dim, keepdim=false)", PerInputElement, 3},
    {"aten::var.dim", "reduce_whole(dim, keepdim=false)", PerInputElement, 3},
    {"aten::var", "reduce_whole(dim, keepdim=false)", PerInputElement, 3},
    {"aten::var_mean.correction", "reduce_whole(dim, keepdim=false)", PerInputElement, 3},
    {"aten::std.correction", "reduce_whole(dim, keepdim=false)", PerInputElement, 3},
    {"aten::std.dim", "reduce_whole(dim, keepdim=false)", PerInputElement, 3},
    {"aten::std", "reduce_whole(dim, keepdim=false)", PerInputElement, 3},
    {"aten::logsumexp", "reduce_whole(dim, keepdim=false)", PerInputElement, 3},
    {"aten::norm.ScalarOpt_dim", "reduce_whole(dim, keepdim=false)", PerInputElement, 2},
    {"aten::linalg_vector_norm", "reduce_whole(dim, keepdim=false)", PerInputElement, 2},

    // ---- ops that need one dim whole -------------------------------------------
    // Softmax's dim may still be split: ranks combine 2 per-row statistics (max and sum).
    {"aten::softmax.int", "whole(dim, 2)", PerInputElement, 5},
    {"aten::_softmax", "whole(dim, 2)", PerInputElement, 5},
    {"aten::log_softmax.int", "whole(dim, 2)", PerInputElement, 5},
    {"aten::_log_softmax", "whole(dim, 2)", PerInputElement, 5},
    {"aten::cumsum", "whole(dim)", PerInputElement, 1},
    {"aten::cumprod", "whole(dim)", PerInputElement, 1},
    {"aten::cummax", "whole(dim)", PerInputElement, 1},
    {"aten::cummin", "whole(dim)", PerInputElement, 1},
    {"aten::logcumsumexp", "whole(dim)", PerInputElement, 3},
    {"aten::sort", "whole(dim=-1)", Zero, 0},
    {"aten::argsort", "whole(dim=-1)", Zero, 0},
    {"aten::topk", "whole_resized(dim=-1)", Zero, 0},
    {"aten::diff", "whole_resized(dim=-1)", PerOutputElement, 1},
    {"aten::flip", "whole(dims)", Zero, 0},
    {"aten::roll", "whole(dims=[])", Zero, 0},
    // The mask depends on global positions: a shard of either dim would mask wrongly.
    {"aten::triu", "whole([-2,-1])", Zero, 0},
    {"aten::tril", "whole([-2,-1])", Zero, 0},

    // ---- views and reshapes ------------------------------------------------------
    {"aten::view", "reshape(size)", Zero, 0},
    {"aten::_unsafe_view", "reshape(size)", Zero, 0},
    {"aten::_reshape_alias", "reshape(size)", Zero, 0},
    {"aten::reshape", "reshape(shape)", Zero, 0},
    {"aten::view_as", "reshape()", Zero, 0},
    {"aten::reshape_as", "reshape()", Zero, 0},
    {"aten::flatten.using_ints", "flatten(start_dim=0, end_dim=-1)", Zero, 0},
    {"aten::unflatten.int", "unflatten(dim, sizes)", Zero, 0},
    {"aten::unsqueeze", "unsqueeze(dim)", Zero, 0},
    {"aten::unsqueeze_", "unsqueeze(dim)", Zero, 0},
    {"aten::squeeze.dim", "squeeze(dim)", Zero, 0},
    {"aten::squeeze.dims", "squeeze(dim)", Zero, 0},
    {"aten::squeeze", "squeeze()", Zero, 0},
    {"aten::transpose.int", "transpose(dim0, dim1)", Zero, 0},
    {"aten::swapaxes", "transpose(axis0, axis1)", Zero, 0},
    {"aten::swapdims", "transpose(dim0, dim1)", Zero, 0},
    {"aten::t", "transpose(0, 1)", Zero, 0},
    {"aten::permute", "permute(dims)", Zero, 0},
    {"aten::numpy_T", "permute(none)", Zero, 0},  // x.T (Falcon's `x @ self.weight.T`)
    {"aten::mT", "transpose(-2, -1)", Zero, 0},
    {"aten::matrix_H", "transpose(-2, -1)", Zero, 0},
    {"aten::adjoint", "transpose(-2, -1)", Zero, 0},
    {"aten::expand", "expand(size)", Zero, 0},
    {"aten::broadcast_to", "expand(size)", Zero, 0},
    {"aten::expand_as", "elementwise()", Zero, 0},
    {"aten::repeat", "repeat(repeats)", Zero, 0},
    {"aten::repeat_interleave.self_int", "repeat_interleave(repeats, dim)", Zero, 0},
    {"aten::repeat_interleave.self_Tensor", "repeat_interleave(repeats, dim)", Zero, 0},

    // ---- slicing, joining, splitting -----------------------------------------------
    {"aten::slice.Tensor", "slice(dim=0, start, end, step=1)", Zero, 0},
    {"aten::narrow", "narrow(dim, length)", Zero, 0},
    {"aten::select.int", "select(dim)", Zero, 0},
    // Functional forms of writes into a view (capture turns `x[:, t] = y` into these).
    {"aten::select_scatter", "select_scatter(dim)", Zero, 0},
    {"aten::slice_scatter", "scatter(dim)", Zero, 0},
    {"aten::copy", "elementwise()", Zero, 0},
    {"aten::pad", "pad(pad)", Zero, 0},
    {"aten::constant_pad_nd", "pad(pad)", Zero, 0},
    {"aten::reflection_pad1d", "pad(padding)", Zero, 0},
    {"aten::reflection_pad2d", "pad(padding)", Zero, 0},
    {"aten::replication_pad1d", "pad(padding)", Zero, 0},
    {"aten::replication_pad2d", "pad(padding)", Zero, 0},
    {"aten::cat", "cat(dim=0)", Zero, 0},
    {"aten::concat", "cat(dim=0)", Zero, 0},
    {"aten::concatenate", "cat(dim=0)", Zero, 0},
    {"aten::stack", "stack(dim=0)", Zero, 0},
    {"aten::split.Tensor", "split(split_size, dim=0)", Zero, 0},  // first: TorchScript's aten::split
    {"aten::split.sizes", "split_sizes(split_size, dim=0)", Zero, 0},
    {"aten::split_with_sizes", "split_sizes(split_sizes, dim=0)", Zero, 0},
    {"aten::unsafe_split.Tensor", "split(split_size, dim=0)", Zero, 0},
    {"aten::chunk", "chunk(chunks, dim=0)", Zero, 0},
    {"aten::unbind.int", "unbind(dim=0)", Zero, 0},

    // ---- indexing ---------------------------------------------------------------------
    {"aten::embedding", "embedding()", Zero, 0},
    {"aten::index_select", "index_select(dim)", Zero, 0},
    {"aten::gather", "gather(dim)", Zero, 0},
    {"aten::scatter.src", "scatter(dim)", Zero, 0},
    {"aten::scatter.value", "scatter(dim)", Zero, 0},
    {"aten::scatter_add", "scatter(dim)", PerInputElement, 0},
    // A histogram of a 1-D tensor (transformers' routers count tokens per expert): the
    // counts of a split input add up, so its values are reduced; the bins are new.
    {"aten::histc", "n->B", PerInputElement, 1},
    // A mixture of experts' experts as one op (python/shardwise/_moe_experts.py): hidden [t, H],
    // top_k_index and top_k_weights [t, K], gate_up_proj [E, N = 2I, H], down_proj [E, H, I],
    // expert_ids [E] (an arange) -> [t, H]. Tokens are independent: a split of t is a batch
    // split. The experts are summed over: a split of them leaves each rank the partial sum of
    // its own experts (named by its block of the arange), the tokens and their routing factors
    // of every term, whole on each rank. The gate and up halves of N are concatenated: N and I
    // stay whole (no strided split yet).
    {"shardwise_moe::experts", "tH,tK,tK,eNH,eHI,e->tH", Experts, 1},
    // indices_present: where the index list held None (x[..., [-2], :]), so the rule
    // knows which dims the tensors index.
    {"aten::index.Tensor", "index(indices_present)", Zero, 0},
    {"aten::index_put", "index_put(indices_present)", Zero, 0},
    {"aten::index_put_", "index_put(indices_present)", Zero, 0},

    // ---- normalisation --------------------------------------------------------------------
    // Split normalised dims combine per-row statistics: layer norm mean and variance,
    // rms norm the mean square.
    {"aten::layer_norm", "norm_last(normalized_shape, 2)", PerInputElement, 5},
    {"aten::native_layer_norm", "norm_last(normalized_shape, 2)", PerInputElement, 5},
    {"aten::rms_norm", "norm_last(normalized_shape, 1)", PerInputElement, 4},
    {"aten::batch_norm", "batch_norm(training=false)", PerInputElement, 5},
    {"aten::native_batch_norm", "batch_norm(training=false)", PerInputElement, 5},
    {"aten::_native_batch_norm_legit_no_training", "batch_norm()", PerInputElement, 5},
    {"aten::_native_batch_norm_legit", "batch_norm(training=false)", PerInputElement, 5},
    {"aten::instance_norm", "batch_norm()", PerInputElement, 5},
    {"aten::group_norm", "group_norm()", PerInputElement, 5},
    {"aten::native_group_norm", "group_norm()", PerInputElement, 5},

    // ---- losses --------------------------------------------------------------------------
    // A split class dim combines per-row statistics: cross entropy's max, sum of
    // exponentials and the target's logit; nll_loss's target value.
    {"aten::cross_entropy_loss", "cross_entropy(reduction=1, 3)", PerInputElement, 5},
    {"aten::nll_loss", "cross_entropy(reduction=1, 1)", PerInputElement, 1},
    {"aten::nll_loss_nd", "cross_entropy(reduction=1, 1)", PerInputElement, 1},
    {"aten::nll_loss2d", "cross_entropy(reduction=1, 1)", PerInputElement, 1},
    {"aten::mse_loss", "loss(reduction=1)", PerInputElement, 3},
    {"aten::l1_loss", "loss(reduction=1)", PerInputElement, 2},
    {"aten::smooth_l1_loss", "loss(reduction=1)", PerInputElement, 3},
    {"aten::huber_loss", "loss(reduction=1)", PerInputElement, 3},
    {"aten::binary_cross_entropy", "loss(reduction=1)", PerInputElement, 4},
    {"aten::binary_cross_entropy_with_logits", "loss(reduction=1)", PerInputElement, 5},
    {"aten::kl_div", "loss(reduction=1)", PerInputElement, 3},

    // ---- pooling ---------------------------------------------------------------------------
    {"aten::max_pool1d", "window(1)", PerInputElement, 1},
    {"aten::max_pool2d", "window(2)", PerInputElement, 1},
    {"aten::max_pool3d", "window(3)", PerInputElement, 1},
    {"aten::max_pool2d_with_indices", "window(2)", PerInputElement, 1},
    {"aten::max_pool3d_with_indices", "window(3)", PerInputElement, 1},
    {"aten::avg_pool1d", "window(1)", PerInputElement, 1},
    {"aten::avg_pool2d", "window(2)", PerInputElement, 1},
    {"aten::avg_pool3d", "window(3)", PerInputElement, 1},
    {"aten::adaptive_avg_pool1d", "window(1)", PerInputElement, 1},
    {"aten::adaptive_avg_pool2d", "window(2)", PerInputElement, 1},
    {"aten::_adaptive_avg_pool2d", "window(2)", PerInputElement, 1},
    {"aten::adaptive_avg_pool3d", "window(3)", PerInputElement, 1},
    {"aten::adaptive_max_pool1d", "window(1)", PerInputElement, 1},
    {"aten::adaptive_max_pool2d", "window(2)", PerInputElement, 1},

    // ---- creation ------------------------------------------------------------------------------
    {"aten::arange", "arange(end)", Zero, 0},
    {"aten::arange.start", "arange(end, start)", Zero, 0},
    {"aten::arange.start_step", "arange(end, start, step)", Zero, 0},
    {"aten::full", "create(size)", Zero, 0},
    {"aten::zeros", "create(size)", Zero, 0},
    {"aten::ones", "create(size)", Zero, 0},
    {"aten::empty.memory_format", "create(size)", Zero, 0},
    {"aten::empty_strided", "create(size)", Zero, 0},
    {"aten::rand", "create(size)", Zero, 0},
    {"aten::randn", "create(size)", Zero, 0},
    {"aten::randint", "create(size)", Zero, 0},
    {"aten::randint.low", "create(size)", Zero, 0},
    {"aten::new_ones", "create(size)", Zero, 0},
    {"aten::new_zeros", "create(size)", Zero, 0},
    {"aten::new_full", "create(size)", Zero, 0},
    {"aten::new_empty", "create(size)", Zero, 0},
    {"aten::new_empty_strided", "create(size)", Zero, 0},
    {"aten::scalar_tensor", "create([])", Zero, 0},
    {"aten::linspace", "create(steps)", Zero, 0},
};
// Linear in their tensor inputs (OpSpec::linear): pure data movement of one value or of
// several values alike. Not here: ops that create values (fill, pad with a constant,
// creation), pick by value (sort, topk, max) or mix in a second operand (index_put).
constexpr std::string_view kLinear[] = {
    "aten::alias", "aten::contiguous", "aten::clone", "aten::detach", "aten::_to_copy", "aten::to.dtype",
    "aten::to.dtype_layout", "aten::to.device", "aten::view", "aten::_unsafe_view", "aten::_reshape_alias",
    "aten::reshape", "aten::flatten.using_ints", "aten::unflatten.int", "aten::unsqueeze", "aten::squeeze.dim",
    "aten::squeeze.dims", "aten::squeeze", "aten::transpose.int", "aten::swapaxes", "aten::swapdims", "aten::t",
    "aten::permute", "aten::numpy_T", "aten::mT", "aten::expand", "aten::broadcast_to", "aten::slice.Tensor",
    "aten::narrow", "aten::select.int", "aten::cat", "aten::concat", "aten::concatenate", "aten::stack",
    "aten::split.Tensor", "aten::split.sizes", "aten::split_with_sizes", "aten::unsafe_split.Tensor", "aten::chunk",
    "aten::unbind.int",
};
// Jointly linear beyond data movement (OpSpec::additive): a sum of two sums is a sum.
constexpr std::string_view kAdditive[] = {"aten::add.Tensor", "aten::sub.Tensor", "aten::rsub.Tensor"};
// Linear in some inputs while the others stay fixed (OpSpec::linear_in, bit k = input k):
// a loss summed over a batch, scaled, divided by a count, summed or averaged again, is
// still a sum over the batch. Not here: ops with an additive operand (linear with a bias,
// addmm), whose constant term would be added once per part.
struct LinearIn {
  std::string_view name;
  std::uint32_t inputs;
};
constexpr LinearIn kLinearIn[] = {
    {"aten::mul.Tensor", 0b11}, {"aten::mul.Scalar", 0b1}, {"aten::div.Tensor", 0b1},
    {"aten::div.Scalar", 0b1},  {"aten::neg", 0b1},        {"aten::sum", 0b1},
    {"aten::sum.dim_IntList", 0b1}, {"aten::mean", 0b1},   {"aten::mean.dim", 0b1},
    {"aten::mm", 0b11},         {"aten::bmm", 0b11},       {"aten::matmul", 0b11},
    {"aten::mv", 0b11},         {"aten::dot", 0b11},
};
// Outputs of zeros whatever the operands (OpSpec::zeros).
constexpr std::string_view kZeros[] = {"aten::zeros", "aten::zeros_like", "aten::new_zeros", "aten::zero",
                                       "aten::zero_"};

bool listed(const auto& names, std::string_view name) {
  for (std::string_view l : names)
    if (l == name) return true;
  return false;
}

OpTraits traits_of(std::string_view name) {
  OpTraits traits{listed(kLinear, name), listed(kAdditive, name), 0, listed(kZeros, name)};
  for (const auto& l : kLinearIn)
    if (l.name == name) traits.linear_in = l.inputs;
  return traits;
}

// The table of the rows; every op a trait list names must have a row.
OpTable build_table() {
  OpTable out;
  for (const auto& row : kRows)
    out.add(std::string(row.name), row.rule, FlopsCost{row.flops, row.per_element}, traits_of(row.name));
  auto check_listed = [&](std::string_view name, std::string_view what) {
    const OpSpec* spec = out.find(name);
    if (spec == nullptr || spec->name != name)
      throw support::ValidationError(fmt::format("op table: {} op {} has no row", what, name));
  };
  for (std::string_view l : kLinear) check_listed(l, "linear");
  for (std::string_view l : kAdditive) check_listed(l, "additive");
  for (const auto& l : kLinearIn) check_listed(l.name, "linear_in");
  for (std::string_view l : kZeros) check_listed(l, "zeros");
  return out;
}

}  // namespace

const OpTable& OpTable::builtin() {
  static const OpTable table = build_table();
  return table;
}

}  // namespace shardwise::ops
