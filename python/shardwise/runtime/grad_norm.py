"""Global gradient norms over an engine's shards, and clipping by one factor on every rank.

    total = clip_grad_norm_(held, max_norm, norm_type)    # held: [(parameter, copies)]

A rank holds shards of some parameters (tensor parallelism) and not others at all (pipeline
stages); a parameter it holds replicated is held the same by ``copies`` ranks. The norm of the
whole model's gradient is then the sum over ranks of each held gradient's |g|^p / copies,
all-reduced over the job, to the power 1/p (the max of |g| for the inf-norm): what
``torch.nn.utils.clip_grad_norm_`` computes on one device, as FSDP's ``clip_grad_norm_`` does
over its shards. Every rank gets the same total and scales every gradient by the same factor.

``torch.nn.utils.clip_grad_norm_(engine.parameters(), ...)`` would compute this rank's norm
only. So after each step the engine hands out the gradients of parameters that differ across
ranks as ``LocalShardGrad``: a tensor like any other for optimizers' elementwise updates, which
refuses a reduction over itself (a norm, a sum, a max...) naming ``engine.clip_grad_norm_``, so
a local number is never taken for the global one.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from .._C import ValidationError

# Reductions over a whole gradient (by the name torch_function reports); an elementwise
# optimizer update uses none of them.
_REDUCTIONS = frozenset({
    "linalg_vector_norm", "linalg_norm", "norm", "frobenius_norm", "nuclear_norm", "_foreach_norm", "_foreach_max",
    "sum", "nansum", "mean", "nanmean", "prod", "max", "min", "amax", "amin", "aminmax", "var", "std", "var_mean",
    "std_mean", "dot", "vdot", "inner", "count_nonzero", "logsumexp", "all", "any",
})


class LocalShardGrad(torch.Tensor):
    """The gradient of one rank's shard: refuses reductions, which would be local."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in _REDUCTIONS:
            raise ValidationError(
                f"torch.{name} over a gradient of this rank's shard would see only that shard, not the whole "
                "gradient: use engine.clip_grad_norm_(max_norm) for the global norm (torch.nn.utils."
                "clip_grad_norm_ over engine.parameters() is local), or engine.full_state_dict() for whole "
                "tensors; optimizers that reduce over a gradient (Adafactor, LBFGS) cannot step sharded "
                "parameters exactly")
        return super().__torch_function__(func, types, args, kwargs or {})


def mark_local(params: list[torch.Tensor]) -> None:
    """Hands out the gradients of `params` as LocalShardGrad (a view of the same storage)."""
    for p in params:
        if p.grad is not None and type(p.grad) is not LocalShardGrad:
            p.grad = p.grad.as_subclass(LocalShardGrad)


def plain(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(torch.Tensor) if type(t) is not torch.Tensor else t


def clip_grad_norm_(held: list[tuple[torch.Tensor, int]], max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, group=None) -> torch.Tensor:
    """The global norm of the gradients of `held` (parameter, copies) over the job, and every
    gradient scaled by max_norm / (norm + 1e-6) where that is below 1 (torch's formula)."""
    norm_type = float(norm_type)
    grads = [(plain(p.grad), copies) for p, copies in held if p.grad is not None]
    dtype = grads[0][0].dtype if grads else torch.float32
    device = grads[0][0].device if grads else torch.device("cpu")
    with torch.no_grad():
        # Summed on the gradients' device, reduced as one float64 on the CPU `group` (the
        # engines' control group: Gloo, beside NCCL too).
        local = torch.zeros((), dtype=torch.float64, device=device)
        for g, copies in grads:
            if math.isinf(norm_type):
                local = torch.maximum(local, g.abs().max().double()) if g.numel() else local
            else:
                local += torch.linalg.vector_norm(g.double(), norm_type) ** norm_type / copies
        reduced = local.reshape(1).cpu()
        dist.all_reduce(reduced, op=dist.ReduceOp.MAX if math.isinf(norm_type) else dist.ReduceOp.SUM, group=group)
        total = reduced[0] if math.isinf(norm_type) else reduced[0] ** (1.0 / norm_type)
        total = total.to(device=device, dtype=dtype)
        if error_if_nonfinite and not torch.isfinite(total):
            raise RuntimeError(f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, "
                               "so it cannot be clipped. To disable this error and scale the gradients by the "
                               "non-finite norm anyway, set `error_if_nonfinite=False`")
        coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for g, _ in grads:
            g.mul_(coefficient.to(g.dtype))
    return total
