"""Before training: the captured program, run whole on this rank, against the eager model.

Capture turns the model into an ATen graph, and everything shardwise runs is derived from
that graph: an op capture dropped or misplaced would be a wrong loss on every rank, from the
first step, with no error. So ``parallelize`` checks the graph once, on the example batch:

 - every parameter the eager model trains (it gets a gradient) is a parameter of the graph;
 - the graph's program, lowered as one rank of a one-rank mesh runs it (no sharding: this
   checks capture, not the plan, which the equivalence tests check), gives the eager model's
   loss and gradients, within the rounding of the model's lowest precision.

Both run on copies of the parameters and buffers (the user's model is left as it was: batch
norm's running statistics included), from the same generator state (dropout draws the same
masks). A failure raises CaptureError naming the parameter, the loss and the figures.

The check runs a forward and backward of the whole model on the global batch, on rank 0 alone
where every rank captured the same program (``engine._capture``: the check is of the capture
against the model's code, and its error is raised on every rank), so ``parallelize`` runs it
only for models whose parameters take less than ``_VERIFY_BYTES`` (and never on the meta
device); ``verify=True`` / ``False`` decides. It leaves the random generators as they were.
"""
from __future__ import annotations

import torch

from .. import _C
from .._grouped_experts import grouped_mm_capturable
from .._moe_experts import experts_as_one_op
from .._fx_import import CaptureError
from .._logging import get_logger
from .lower import _build_module

log = get_logger("shardwise.engine")

_VERIFY_BYTES = 256 * 2**20
_TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 5e-2, torch.float16: 2e-2}


def should_verify(model: torch.nn.Module, verify) -> bool:
    if verify is not None and verify != "auto":
        return bool(verify)
    tensors = list(model.parameters()) + list(model.buffers())
    if any(t.device.type == "meta" for t in tensors):
        return False
    return sum(t.numel() * t.element_size() for t in tensors) < _VERIFY_BYTES


def verify_capture(wrapper: torch.nn.Module, named: dict, graph, builder, tensors: dict[str, torch.Tensor],
                   trainable: set[str], input_names: list[str], batch: dict[str, torch.Tensor],
                   compute_dtypes: dict[str, torch.dtype] | None = None) -> dict:
    """Raises CaptureError when the captured program and the eager model disagree; returns the
    figures (loss and worst gradient differences, relative). `wrapper`: the model as the
    program computes it (a mixed-precision policy's copy); `tensors`: the weights the engine
    holds, cast to `compute_dtypes` at their use."""
    model_name = type(getattr(wrapper, "model", wrapper)).__name__
    program = _C.rank_program(graph._core, "", 0)
    copies = {name: (torch.nn.Parameter(t.detach().clone()) if name in trainable else t.detach().clone())
              for name, t in tensors.items()}
    module = _build_module(program, builder.sources, None, copies, input_names, trainable, parameters=dict(copies),
                           compute_dtypes=compute_dtypes)
    # Eager: the wrapper on copies of its own tensors (names under "model.").
    eager_state = {}
    for name, t in [*wrapper.named_parameters(), *wrapper.named_buffers()]:  # tied weights under their first name
        eager_state[name] = t.detach().clone().requires_grad_(t.requires_grad)
    # The seed from the generator without advancing it: parallelize draws nothing a run on one
    # device would not, and rank 0 alone runs this check where the ranks captured one program
    # (engine._capture), whose generators must stay equal for a mask drawn whole on each rank.
    with torch.random.fork_rng(devices=[]):
        seed = int(torch.randint(0, 2**31 - 1, (1,), device="cpu").item())
    # A mixture of experts' experts run eagerly as the capture took them: shardwise_moe::experts,
    # transformers' eager loop over the experts (_moe_experts.py; its own grouped matmul, the
    # default, has no float64 kernel on the CPU).
    with torch.random.fork_rng(), experts_as_one_op(wrapper), grouped_mm_capturable():
        torch.manual_seed(seed)
        eager_loss = torch.func.functional_call(wrapper, eager_state, (), named, tie_weights=True, strict=False)
        eager_loss.backward()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        counts = _counts(graph, builder, tensors, trainable, module, input_names, batch)
        loss = module(*[batch[n] for n in input_names], *counts)[0]
        loss.backward()
    dtypes = [t.dtype for t in tensors.values() if t.is_floating_point()] + [loss.dtype] + \
        list((compute_dtypes or {}).values())
    tolerance = max(_TOLERANCE.get(d, 1e-4) for d in dtypes)
    loss, eager_loss = loss.detach(), eager_loss.detach()
    loss_error = abs(float(loss) - float(eager_loss)) / max(abs(float(eager_loss)), 1e-12)
    if not loss_error <= tolerance:
        raise CaptureError(f"parallelize: the captured program of {model_name} computes another loss than the model "
                           f"({float(loss):.8g} against {float(eager_loss):.8g}, {loss_error:.1e} relative): capture "
                           "dropped or changed an op; please report it with the model")
    worst, where = 0.0, ""
    for name, p in copies.items():
        if name not in trainable:
            continue
        eager = eager_state.get("model." + name)
        if eager is None or eager.grad is None:
            continue
        if p.grad is None:
            raise CaptureError(f"parallelize: the model trains '{name}' (it gets a gradient) but the captured program "
                               f"of {model_name} does not use it: capture dropped the ops that read it")
        error = ((p.grad - eager.grad).abs().max() / eager.grad.abs().max().clamp_min(1e-12)).item()
        if error > worst:
            worst, where = error, name
    if not worst <= tolerance:
        raise CaptureError(f"parallelize: the captured program of {model_name} gives '{where}' another gradient "
                           f"than the model ({worst:.1e} relative): capture dropped or changed an op")
    log.info("verified the capture of %s against the eager model: loss %.1e, gradients %.1e (relative)", model_name,
             loss_error, worst)
    return {"loss": loss_error, "gradients": worst}


def _counts(graph, builder, tensors, trainable, module, input_names, batch) -> list[float]:
    from .counted import Counter

    return Counter.build(graph, builder, tensors, trainable, module.counted, input_names)(batch)
