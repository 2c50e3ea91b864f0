"""The runtime's distributed kernels: ops whose split the core says combine ranks' parts
(csrc/ops/distributed_kernels.h is the table; the rewrite names the kernel of each node).

- ``VocabLookup``: an embedding split over its table's rows.
- ``StatisticsKernels``: an op split over a dim it normalises or reduces over, the per-row
  statistics all-reduced over the mesh axis that splits it, so no rank gathers the operand:
  cross entropy and nll over split classes (Megatron's vocabulary-parallel loss), softmax and
  log-softmax over a split dim, layer norm and RMS norm over a split normalised dim, and
  training batch norm over a split batch or spatial dim (SyncBatchNorm, its running
  statistics updated from the whole batch's).
- ``ring_attention``: self-attention over a split sequence (ring_attention.py).
- ``experts_all_to_all``: a mixture of experts' tokens split with its experts, each rank's
  routed rows sent to their experts' ranks and back (expert_dispatch.py).

Each kernel takes the aten op's own arguments, this rank's operands in place of the whole
ones. Half-precision operands are combined in float32 and the result returned in the
operand's dtype, as the CPU and CUDA kernels of torch do. Gradients: a sum that every rank's
rows read differently (a norm's mean, softmax's denominator) is all-reduced in forward and
its gradient all-reduced in backward (``_sum_over``); a loss every rank holds whole has the
same gradient everywhere, so its all-reduce's backward is the identity.
"""
from __future__ import annotations

import math

import torch

from .mesh import _Mesh
from .expert_dispatch import experts_all_to_all
from .ring_attention import ring_attention

_HALF = (torch.float16, torch.bfloat16)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in _HALF else dtype


def _sum_over(x: torch.Tensor, group: str) -> torch.Tensor:
    """The sum of every rank's `x` over the group, whose gradient is the sum of every rank's
    gradient: all_reduce's backward is the identity and copy_to_group's the all-reduce."""
    ops = torch.ops.shardwise
    return ops.copy_to_group(ops.all_reduce(x.contiguous(), "sum", group), group)


def _max_over(x: torch.Tensor, group: str) -> torch.Tensor:
    """The row max over the group, as a constant (a shift that cancels in softmax). Callers
    take the local max of a detached tensor: amax under autograd records a node that keeps its
    whole input."""
    return torch.ops.shardwise.all_reduce(x.detach().contiguous(), "max", group)


class VocabLookup(torch.nn.Module):
    """A lookup split over its table's rows (the vocabulary-parallel embedding): each rank
    looks up the ids in its rows [start, stop), zero elsewhere; the sum over ranks is the
    lookup (the program all-reduces or reduce-scatters it where a reader needs)."""

    def forward(self, table, ids, start: int, stop: int, padding_idx: int = -1, scale_grad_by_freq: bool = False,
                sparse: bool = False):
        inside = (ids >= start) & (ids < stop)
        local = torch.where(inside, ids - start, torch.zeros_like(ids))
        pad = padding_idx - start if start <= padding_idx < stop else -1
        out = torch.ops.aten.embedding.default(table, local, pad, scale_grad_by_freq, sparse)
        return out * inside.unsqueeze(-1).to(out.dtype)


class StatisticsKernels(torch.nn.Module):
    """``self.statistics(kernel, axis, dim, size, start, stop, args, kwargs)``: the aten op's
    call (args, kwargs: this rank's operands) as `kernel` runs it with input 0's dim `dim`
    (whole size `size`, this rank's block [start, stop)) split on mesh axis `axis`."""

    def __init__(self, mesh: _Mesh):
        super().__init__()
        self._mesh = mesh

    def forward(self, kernel: str, axis: int, dim: int, size: int, start: int, stop: int, args, kwargs):
        run = _KERNELS.get(kernel)
        if run is None:
            raise NotImplementedError(f"the runtime has no distributed kernel '{kernel}' (csrc/ops/distributed_kernels.h "
                                      "names one that python/shardwise/runtime/kernels.py lacks)")
        split = _Split(self._mesh.group_names[axis], dim, size, start, stop)
        return run(split, *args, **kwargs)


class _Split:
    """Where the kernel's operand is split: the group, input 0's dim, its whole size, and
    this rank's block of it."""

    def __init__(self, group: str, dim: int, size: int, start: int, stop: int):
        self.group, self.dim, self.size, self.start, self.stop = group, dim, size, start, stop

    def count(self, x: torch.Tensor, dims: tuple[int, ...]) -> int:
        """How many elements the whole operand has over `dims` (the split one at its size)."""
        return math.prod(self.size if d % x.dim() == self.dim % x.dim() else x.shape[d] for d in dims)


# ---- softmax --------------------------------------------------------------------------------
def _softmax(split: _Split, x, dim: int, dtype_or_half=None, *, log: bool = False):
    # softmax.int(self, dim, dtype=None) casts the input to dtype; _softmax(self, dim,
    # half_to_float) returns float32 for a half input when half_to_float.
    if isinstance(dtype_or_half, torch.dtype):
        x, out_dtype = x.to(dtype_or_half), dtype_or_half
    else:
        out_dtype = torch.float32 if dtype_or_half and x.dtype in _HALF else x.dtype
    rows = x.to(_compute_dtype(x.dtype))
    shifted = rows - _max_over(rows.detach().amax(dim, keepdim=True), split.group)
    total = _sum_over(shifted.exp().sum(dim, keepdim=True), split.group)
    out = shifted - total.log() if log else shifted.exp() / total
    return out.to(out_dtype)


def _log_softmax(split: _Split, x, dim: int, dtype_or_half=None):
    return _softmax(split, x, dim, dtype_or_half, log=True)


# ---- norms --------------------------------------------------------------------------------------
def _normalised_dims(x: torch.Tensor, normalized_shape) -> tuple[int, ...]:
    return tuple(range(x.dim() - len(normalized_shape), x.dim()))


def _layer_norm(split: _Split, x, normalized_shape, weight=None, bias=None, eps: float = 1e-5,
                cudnn_enable: bool = True):
    dims = _normalised_dims(x, normalized_shape)
    count = split.count(x, dims)
    rows = x.to(_compute_dtype(x.dtype))
    mean = _sum_over(rows.sum(dims, keepdim=True), split.group) / count
    centred = rows - mean
    var = _sum_over((centred * centred).sum(dims, keepdim=True), split.group) / count
    out = centred * torch.rsqrt(var + eps)
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out.to(x.dtype)


def _rms_norm(split: _Split, x, normalized_shape, weight=None, eps=None):
    dims = _normalised_dims(x, normalized_shape)
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    rows = x.to(_compute_dtype(x.dtype))
    mean_square = _sum_over((rows * rows).sum(dims, keepdim=True), split.group) / split.count(x, dims)
    out = (rows * torch.rsqrt(mean_square + eps)).to(x.dtype)
    return out * weight if weight is not None else out


def _sync_batch_norm(split: _Split, x, weight, bias, running_mean, running_var, training: bool, momentum: float,
                     eps: float, cudnn_enabled: bool = True):
    # The rule splits training batch norm's batch or spatial dims only (ops/rule_templates.cc):
    # each channel's mean and variance are the whole batch's.
    if not training:
        raise NotImplementedError("sync_batch_norm: batch norm in eval mode has no statistics to combine; "
                                  "the rewrite runs it local")
    dims = tuple(d for d in range(x.dim()) if d != 1)
    count = split.count(x, dims)
    view = [1, x.shape[1]] + [1] * (x.dim() - 2)
    rows = x.to(_compute_dtype(x.dtype))
    mean = _sum_over(rows.sum(dims), split.group) / count
    centred = rows - mean.view(view)
    var = _sum_over((centred * centred).sum(dims), split.group) / count
    out = centred * torch.rsqrt(var + eps).view(view)
    if weight is not None:
        out = out * weight.view(view)
    if bias is not None:
        out = out + bias.view(view)
    with torch.no_grad():  # the running statistics, as batch norm updates them: the unbiased variance
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(mean.detach().to(running_mean.dtype), alpha=momentum)
        if running_var is not None:
            unbiased = var.detach() * (count / max(count - 1, 1))
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
    return out.to(x.dtype)


# ---- losses over split classes ------------------------------------------------------------------
def _class_rows(split: _Split, logits, target):
    """The logits as [rows..., this rank's classes] in the compute dtype, the targets as
    [rows...], and which targets are this rank's classes (their local index)."""
    rows = logits if logits.dim() > 1 else logits.unsqueeze(0)
    labels = target if logits.dim() > 1 else target.unsqueeze(0)
    rows = rows.movedim(1, -1)  # classes on dim 1 ([N, C] or [N, C, d1, ...]) moved last
    rows = rows.to(_compute_dtype(rows.dtype))
    inside = (labels >= split.start) & (labels < split.stop)
    local = torch.where(inside, labels - split.start, torch.zeros_like(labels))
    return rows, labels, inside, local


def _pick(rows, local):
    """rows[..., local]: each row's value at its class index. By advanced indexing, whose
    backward keeps the indices and the shape only: gather's keeps its whole input (here a
    logits-sized tensor per micro-batch, alive until backward), which the cost model's
    saved-tensor rule for a loss does not count."""
    flat = rows.reshape(-1, rows.shape[-1])
    return flat[torch.arange(flat.shape[0], device=flat.device), local.reshape(-1)].reshape(local.shape)


def _reduce_loss(loss, labels, logits, reduction: int, ignore_index: int):
    valid = (labels != ignore_index).to(loss.dtype)
    loss = loss * valid
    if logits.dim() == 1:
        loss = loss.squeeze(0)
    if reduction == 0:
        return loss.to(logits.dtype)
    if reduction == 2:
        return loss.sum().to(logits.dtype)
    return (loss.sum() / valid.sum()).to(logits.dtype)


def _cross_entropy(split: _Split, logits, target, weight=None, reduction: int = 1, ignore_index: int = -100,
                   label_smoothing: float = 0.0):
    """Megatron's vocabulary-parallel loss: the row's max, sum of exponentials and target
    logit (and, with label smoothing, the sum of its logits) all-reduced. Every rank's loss is
    the whole loss, so the all-reduces' backward is the identity, which leaves each rank its
    own classes' columns of softmax - (1 - e) one-hot - e / C."""
    if weight is not None:
        raise NotImplementedError("vocab_cross_entropy has no class weights (the rewrite runs such a loss whole)")
    ops = torch.ops.shardwise
    rows, labels, inside, local = _class_rows(split, logits, target)
    shifted = rows - _max_over(rows.detach().amax(dim=-1), split.group).unsqueeze(-1)
    sum_exp = ops.all_reduce(shifted.exp().sum(dim=-1).contiguous(), "sum", split.group)
    picked = _pick(shifted, local) * inside.to(shifted.dtype)
    target_logit = ops.all_reduce(picked.contiguous(), "sum", split.group)
    if label_smoothing:
        mean_logit = ops.all_reduce(shifted.sum(dim=-1).contiguous(), "sum", split.group) / split.size
    del rows, shifted  # logits-sized: not kept to the forward's end (autograd holds the exponentials)
    # -log p_t = log sum exp - x_t; with smoothing e, (1 - e) of that plus e times the mean
    # over the classes of -log p_c = log sum exp - mean_c x_c (all on the shifted logits).
    loss = torch.log(sum_exp) - target_logit
    if label_smoothing:
        loss = (1 - label_smoothing) * loss + label_smoothing * (torch.log(sum_exp) - mean_logit)
    return _reduce_loss(loss, labels, logits, reduction, ignore_index)


def _nll_loss(split: _Split, log_probs, target, weight=None, reduction: int = 1, ignore_index: int = -100):
    """-x[target] of each row, the target's value all-reduced from the rank that holds it."""
    if weight is not None:
        raise NotImplementedError("vocab_nll_loss has no class weights (the rewrite runs such a loss whole)")
    rows, labels, inside, local = _class_rows(split, log_probs, target)
    picked = _pick(rows, local) * inside.to(rows.dtype)
    loss = -torch.ops.shardwise.all_reduce(picked.contiguous(), "sum", split.group)
    return _reduce_loss(loss, labels, log_probs, reduction, ignore_index)


# ---- attention over a split sequence ----------------------------------------------------------
def _ring_attention(split: _Split, query, key, value, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                    scale=None, enable_gqa: bool = False):
    """Ring attention (ring_attention.py) over the query rows' dim, split in equal blocks on
    the axis: ring_attention checks this rank's block [start, stop) of `size` against its place
    on the ring."""
    return ring_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, group=split.group,
                          layout="contiguous", first_row=split.start, length=split.size)


# ---- a mixture of experts' tokens dispatched to their experts' ranks --------------------------
def _experts_all_to_all(split: _Split, hidden, top_k_index, top_k_weights, gate_up_proj, down_proj, expert_ids,
                        act: str):
    """shardwise_moe::experts on this rank's tokens (rows of dim 0) and experts, the rows
    exchanged over the axis' group by all-to-all (expert_dispatch.py)."""
    return experts_all_to_all(hidden, top_k_index, top_k_weights, gate_up_proj, down_proj, expert_ids, act,
                              group=split.group)


_KERNELS = {
    "shardwise::vocab_cross_entropy": _cross_entropy,
    "shardwise::vocab_nll_loss": _nll_loss,
    "shardwise::split_softmax": _softmax,
    "shardwise::split_log_softmax": _log_softmax,
    "shardwise::split_layer_norm": _layer_norm,
    "shardwise::split_rms_norm": _rms_norm,
    "shardwise::sync_batch_norm": _sync_batch_norm,
    "shardwise::ring_attention": _ring_attention,
    "shardwise::experts_all_to_all": _experts_all_to_all,
}
