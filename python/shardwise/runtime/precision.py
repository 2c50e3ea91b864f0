"""Mixed precision with FSDP2's words: ``parallelize(..., mixed_precision=MixedPrecisionPolicy(
param_dtype=torch.bfloat16, reduce_dtype=torch.float32))``.

What it means, as ``torch.distributed.fsdp.fully_shard`` does it:
 - the engine's parameters (and the optimizer's state, and checkpoints) stay in the model's
   own dtype: the master weights;
 - the program computes with the parameters cast to ``param_dtype`` at their use (a cast in
   the rank program after each parameter; its backward brings the gradient back to the
   master's dtype), floating inputs cast to it too (``cast_forward_inputs``);
 - data parallelism's gradient reduction runs in ``reduce_dtype`` (default: the gradients'
   own, the masters' dtype);
 - the loss is returned in ``output_dtype`` when given.
Buffers keep their dtype, as in FSDP2.

The program is captured from a copy of the model whose floating parameters are in
``param_dtype`` (the graph's dtypes are then what the policy computes: an op the model runs
in float32 on purpose, such as a norm's statistics or the logits before the loss, stays float32),
and the single-device run of the same policy is that copy: what ``verify`` checks against and
what a user compares with (``torch.func.functional_call`` of the model with its parameters cast
gives the same numbers).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from .._C import ValidationError


@dataclass(frozen=True)
class Policy:
    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    output_dtype: torch.dtype | None = None
    cast_forward_inputs: bool = True


def policy_of(mixed_precision: Any) -> Policy | None:
    """A Policy from FSDP2's MixedPrecisionPolicy, a dict of its fields, or None."""
    if mixed_precision is None:
        return None
    if isinstance(mixed_precision, Policy):
        return mixed_precision
    if isinstance(mixed_precision, dict):
        fields = dict(mixed_precision)
    else:
        fields = {k: getattr(mixed_precision, k) for k in ("param_dtype", "reduce_dtype", "output_dtype",
                                                           "cast_forward_inputs") if hasattr(mixed_precision, k)}
    unknown = set(fields) - set(Policy.__dataclass_fields__)
    if unknown:
        raise ValidationError(f"parallelize: mixed_precision has unknown fields {sorted(unknown)} (FSDP2's "
                              "MixedPrecisionPolicy: param_dtype, reduce_dtype, output_dtype, cast_forward_inputs)")
    for key in ("param_dtype", "reduce_dtype", "output_dtype"):
        value = fields.get(key)
        if value is not None and not (isinstance(value, torch.dtype) and value.is_floating_point):
            raise ValidationError(f"parallelize: mixed_precision.{key} must be a floating torch.dtype, got {value!r}")
    return Policy(**fields)


def compute_copy(model: torch.nn.Module, policy: Policy | None) -> torch.nn.Module:
    """`model` as the policy computes it: its floating parameters cast to param_dtype (copies;
    tied weights stay tied), its buffers shared with the model."""
    if policy is None or policy.param_dtype is None:
        return model
    memo: dict[int, Any] = {}
    for p in model.parameters():
        if p.is_floating_point() and id(p) not in memo:
            memo[id(p)] = torch.nn.Parameter(p.detach().to(policy.param_dtype), requires_grad=p.requires_grad)
    for b in model.buffers():
        memo[id(b)] = b
    return copy.deepcopy(model, memo)


def cast_input(t: torch.Tensor, policy: Policy | None) -> torch.Tensor:
    """A floating input as the policy casts it (cast_forward_inputs)."""
    if policy is None or policy.param_dtype is None or not policy.cast_forward_inputs or not t.is_floating_point():
        return t
    return t.to(policy.param_dtype)


def cast_inputs(tensors: dict[str, torch.Tensor], policy: Policy | None) -> dict[str, torch.Tensor]:
    return {n: cast_input(t, policy) for n, t in tensors.items()}


def cast_output(loss: torch.Tensor, policy: Policy | None) -> torch.Tensor:
    if policy is None or policy.output_dtype is None:
        return loss
    return loss.to(policy.output_dtype)
