"""A pipeline stage's backward in two parts, for a zero-bubble schedule (ZB-H1): B, the
input gradient the stage before waits for, and W, the weight gradient nothing waits for,
which the schedule runs later (Qi et al., ICLR 2024). Where the split falls is the core's
(csrc/transform/weight_gradient_split.h): the *boundaries*, a weight value (a parameter, or
made from parameters only: its transpose, its cast, its gathered shard) read by a node whose
output is an activation, and the *weight outputs*, weight values the stage sends.

Forward (``self.weight_split.cut`` / ``.site``): the lowering reads each boundary operand `u`
through a fresh leaf ``v = u.detach().requires_grad_()`` and records, per reading node (a
*site*), its outputs and its (u, v) pairs. The fused graph then has no path from the stage's
outputs to the weights: B, an ``autograd.grad`` from the outputs to the stage's received
inputs and the sites' outputs, computes every activation gradient as the fused backward does
(the node's weight-side product is not computed: no input asks for it) and leaves, at each
site, the gradient of its output. W computes, per site, ``autograd.grad(outputs, v)`` at those
gradients (the site's weight-side products, exactly the fused backward's terms: v feeds that
one node) and runs ``backward`` from each u with its v's gradient, into the parameters'
``.grad`` through whatever made u (a transpose, a cast, a ZeRO-3 gather's reduce-scatter).
One site at a time: from one site's outputs a path runs back through its activation operand
to the sites before it, and asking for their v's too would count their terms twice.
A contraction the core marks for fused accumulation (runtime/fused_accumulation.py) skips
the same products by the engine's phase, and in W adds its weight term into the parameter's
``.grad`` itself (its v then gets none).

A micro-batch whose W comes right after its B on its rank (DualPipeV's full backwards, some
of ZB-H1's and ZB-V's) is not split at all: its forward reads the weights directly and its B
is the plain full backward (runtime/pipeline_engine.py, fused_backwards).

Refused: a stage with a recomputed block (its backward runs the forward again under
autograd's saved-tensor hooks, once per graph task: W's calls would recompute it per site).
"""
from __future__ import annotations

import torch

from .._C import ValidationError
from . import fused_accumulation


class _SplitState:
    def __init__(self):
        self.active = False
        self.cuts: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.outputs: dict[int, tuple[torch.Tensor, ...]] = {}

    def take(self) -> list[tuple[tuple, list]]:
        """The sites of the forward just run: (their outputs needing a gradient, their (u, v) pairs)."""
        sites = [(self.outputs[k], self.cuts[k]) for k in sorted(self.cuts) if k in self.outputs]
        self.cuts, self.outputs = {}, {}
        return sites


class _SplitStateModule(torch.nn.Module):
    """A module of the lowered program that reads and writes the split's shared state."""

    def __init__(self, state: _SplitState):
        super().__init__()
        self._state = state


class WeightCut(_SplitStateModule):
    """``self.weight_split.cut(u, site)``: `u` itself, or in a split forward a fresh leaf of it."""

    def forward(self, u, site: int):
        state = self._state
        if not state.active or not isinstance(u, torch.Tensor) or not u.requires_grad or \
                not torch.is_grad_enabled():
            return u
        v = u.detach().requires_grad_(True)
        v._shardwise_cut_of = u  # what the leaf stands for (runtime/fused_accumulation.py)
        state.cuts.setdefault(site, []).append((u, v))
        return v


class WeightSite(_SplitStateModule):
    """``self.weight_split.site(y, site)``: records the reading node's outputs (y: a tensor or a tuple)."""

    def forward(self, y, site: int):
        state = self._state
        if state.active and site in state.cuts:
            outs = y if isinstance(y, (tuple, list)) else (y,)
            state.outputs[site] = tuple(t for t in outs if isinstance(t, torch.Tensor) and t.requires_grad)
        return y


class WeightSplit(torch.nn.Module):
    """The lowering's two calls, sharing one state; ``active`` only while a split schedule's F runs."""

    def __init__(self):
        super().__init__()
        self._state = _SplitState()
        self.cut = WeightCut(self._state)
        self.site = WeightSite(self._state)

    @property
    def active(self) -> bool:
        return self._state.active

    @active.setter
    def active(self, value: bool) -> None:
        self._state.active = value

    def take(self):
        return self._state.take()


def check_splittable(module: torch.fx.GraphModule, stage: int) -> None:
    if getattr(module, "flat_code", None) is not None:
        raise ValidationError(f"pipeline: stage {stage} recomputes blocks in backward; a zero-bubble schedule "
                              "(zb-h1, zb-v, dualpipe-v) splits a stage's backward only without recomputation: use 1f1b or "
                              "interleaved-1f1b, or a plan without recompute")


def backward_input(roots: list, root_grads: list, inputs: list, sites: list) -> tuple[list, list]:
    """B: the gradients of `inputs` (the stage's received values; None where none) and of each
    site's outputs, from `roots` (the stage's activation outputs) at `root_grads`. The graph is
    kept for W."""
    site_outputs = [y for outputs, _ in sites for y in outputs]
    wanted = inputs + site_outputs
    if not roots or not wanted:
        return [None] * len(inputs), [[None] * len(outputs) for outputs, _ in sites]
    with fused_accumulation.phase("B"):  # the activation gradients alone
        grads = list(torch.autograd.grad(roots, wanted, root_grads, retain_graph=True, allow_unused=True))
    input_grads, rest = grads[:len(inputs)], grads[len(inputs):]
    per_site, k = [], 0
    for outputs, _ in sites:
        per_site.append(rest[k:k + len(outputs)])
        k += len(outputs)
    return input_grads, per_site


def backward_weight(sites: list, site_grads: list, weight_outputs: list) -> None:
    """W: each site's weight-side products at the gradients B left, then backward from the
    weight values into the parameters (with the gradients of the weight values the stage
    sent, `weight_outputs`: (tensor, gradient))."""
    tensors, grads = [], []
    for (outputs, cuts), dys in zip(sites, site_grads):
        pairs = [(y, dy) for y, dy in zip(outputs, dys) if dy is not None]
        if not pairs:
            continue
        with fused_accumulation.phase("W"):  # this site's weight-side products alone
            dvs = torch.autograd.grad([y for y, _ in pairs], [v for _, v in cuts], [dy for _, dy in pairs],
                                      allow_unused=True)
        for (u, _), dv in zip(cuts, dvs):
            if dv is not None:
                tensors.append(u)
                grads.append(dv)
    for t, g in weight_outputs:
        if g is not None and t.requires_grad:
            tensors.append(t)
            grads.append(g)
    if tensors:
        with fused_accumulation.phase("full"):  # from the weight values to the parameters: every product
            torch.autograd.backward(tensors, grads)
