"""``engine.optimizer(cls, params, **defaults)``: a torch.optim.Optimizer over an engine's shards.

    opt = engine.optimizer(torch.optim.AdamW, [
        {"params": ["lm_head.weight", ...], "weight_decay": 0.1},      # by the model's names,
        {"params": [p for n, p in model.named_parameters() if "norm" in n], "weight_decay": 0.0},
    ], lr=3e-4)                                                         # or its own parameters
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-4, total_steps=100)

The result is a ``torch.optim.Optimizer``: LR schedulers, ``param_groups``, ``state``,
``state_dict`` / ``load_state_dict`` (this rank's part, as any optimizer over local shards
has it; ``shardwise.save_checkpoint`` writes the whole one) and ``zero_grad`` behave as torch's.
Parameter groups name parameters as the model does (a tied weight by its first name), by name
or by the model's own tensors (``model.named_parameters()``, as a Hugging Face Trainer builds
its no-decay groups), or by the engine's. Every rank is given the same groups, of the whole
model: on a pipeline each keeps the parameters its stages hold (a group may be empty there),
and a name the model does not have is refused.

ZeRO (the plan's ``zero``: a parameter replicated over some mesh axes whose optimizer state is
sharded over them): each such parameter is stepped by one rank of its axes' group (its owner,
assigned greedily by size, the same on every rank), which alone keeps its state, then broadcast
to the group. The update is the single-device one: ZeRO-1 is exact. The hyperparameters a
scheduler writes into ``param_groups`` reach the inner optimizer at every ``step``.

Only optimizers whose update is elementwise step sharded parameters exactly (SGD, Adam, AdamW,
Adagrad, RMSprop, ...); one that reduces over a gradient (Adafactor, LBFGS) fails on the first
step (runtime/grad_norm.py) rather than see a shard as the whole.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist

from .._C import ValidationError
from . import transport


def param_groups(spec: Any, named: dict[str, torch.Tensor], model_names: dict[int, str],
                 trained: set[str] | None = None) -> list[dict]:
    """The optimizer's groups, each {"params": [engine parameters], ...options}, from `spec`:
    None (every parameter), names, tensors (the engine's or the model's), or group dicts of them.
    `named`: the parameters this rank trains; `trained`: the names every rank together trains
    (None: `named`'s, as where every rank holds a block of every parameter).

    Every rank is given the same groups, built from the whole model (nanoGPT's decay / no-decay
    groups from ``model.named_parameters()``), and keeps the part it holds: a parameter of the
    model that this rank does not train (a pipeline's other stages', a frozen or unused one,
    which torch's optimizer would never step either) is left out of its groups, and a group
    with nothing left stays, empty (torch.optim steps, schedules and saves an empty group), so
    that group i is the same group on every rank: an LR scheduler's lambdas, ``param_groups[i]``
    and the checkpoint's hyperparameters line up. A name or tensor the model does not have is
    refused, as are a parameter in two groups and a trained one in none: any rank's, checked
    alike on every rank, for groups of the whole model; this rank's, for groups each rank
    builds from its own ``engine.named_parameters()`` (which differ by rank on a pipeline)."""
    trained = set(named) if trained is None else set(trained) | set(named)
    by_id = {id(p): n for n, p in named.items()}
    model = set(model_names.values())

    def name_of(item) -> str:
        if isinstance(item, str):
            if item not in trained and item not in model:
                example = next(iter(sorted(trained)), "?")
                raise ValidationError(f"engine.optimizer: the model has no parameter named '{item}' (the engine "
                                      f"names parameters as model.named_parameters() does, a tied weight by its "
                                      f"first name, e.g. {example!r})")
            return item
        if isinstance(item, torch.Tensor):
            name = by_id.get(id(item)) or model_names.get(id(item))
            if name is None:
                raise ValidationError(f"engine.optimizer: a tensor of shape {list(item.shape)} is neither one of the "
                                      "engine's parameters nor a parameter of the model")
            return name
        raise ValidationError(f"engine.optimizer: a parameter is given as {type(item).__name__}; use its name or "
                              "the tensor")

    if spec is None:  # every parameter: this rank's, then (left out below) the other ranks'
        spec = [*named, *sorted(trained - set(named))]
    items = [spec] if isinstance(spec, (str, torch.Tensor, dict)) else list(spec)
    if items and all(isinstance(g, dict) for g in items):
        groups = [dict(g) for g in items]
    else:
        groups = [{"params": items}]
    seen: dict[str, int] = {}
    out = []
    for i, group in enumerate(groups):
        if "params" not in group:
            raise ValidationError(f"engine.optimizer: parameter group {i} has no 'params'")
        params = group["params"]
        params = [params] if isinstance(params, (str, torch.Tensor)) else list(params)
        names = []
        for item in params:
            name = name_of(item)
            if name in seen:
                raise ValidationError(f"engine.optimizer: '{name}' is in parameter groups {seen[name]} and {i}")
            seen[name] = i
            if name in named:  # else another rank's (or trained by none): not this rank's to step
                names.append(name)
        out.append({**group, "params": [named[n] for n in names], "param_names": names})
    # Groups of the whole model (they name another rank's parameters) must hold every parameter
    # any rank trains, checked alike on every rank; groups of this rank's own parameters (from
    # engine.named_parameters(), which differ by rank under a pipeline) hold this rank's.
    whole_model = any(n not in named for n in seen)
    missing = sorted(n for n in (trained if whole_model else named) if n not in seen)  # sorted: one message
    if missing:
        raise ValidationError(f"engine.optimizer: {len(missing)} trainable parameters are in no group "
                              f"({', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}); a rank would "
                              "leave them untrained")
    return out


class ShardedOptimizer(torch.optim.Optimizer):
    """An optimizer over a rank's shards whose ZeRO parameters are stepped by their owners.

    `zero`: parameter name -> (process group, this rank's index in it, group size, the global
    ranks of the group); parameters absent from it are stepped here."""

    def __init__(self, groups: list[dict], optimizer_class: Callable, defaults: dict, zero: dict[str, tuple]):
        names = [n for g in groups for n in g["param_names"]]
        params = {n: p for g in groups for n, p in zip(g["param_names"], g["params"])}
        # Owners: per ZeRO group, parameters in model order, each to the least loaded rank.
        self._owner: dict[str, tuple] = {}
        loads: dict[int, list[int]] = {}
        for name in names:
            if name not in zero:
                continue
            group, index, size, ranks = zero[name]
            load = loads.setdefault(id(group), [0] * size)
            owner = min(range(size), key=lambda k: (load[k], k))
            load[owner] += params[name].numel()
            self._owner[name] = (group, ranks[owner], owner == index)
        mine = [{**{k: v for k, v in g.items() if k not in ("params", "param_names")},
                 "params": [p for n, p in zip(g["param_names"], g["params"])
                            if n not in self._owner or self._owner[n][2]]} for g in groups]
        self.optim = optimizer_class(mine, **defaults)
        self.optimizer_class = optimizer_class
        outer = [{**inner, "params": g["params"], "param_names": g["param_names"]}
                 for inner, g in zip(self.optim.param_groups, groups)]
        super().__init__(outer, self.optim.defaults)
        self.state = self.optim.state  # the state of the parameters this rank steps

    def _sync_hyperparameters(self) -> None:
        for outer, inner in zip(self.param_groups, self.optim.param_groups):
            for key, value in outer.items():
                if key not in ("params", "param_names"):
                    inner[key] = value

    @torch.no_grad()
    def step(self, closure=None):
        self._sync_hyperparameters()
        loss = self.optim.step(closure)
        # Each ZeRO parameter from its owner; one broadcast per (group, owner), flattened.
        batches: dict[tuple, list] = {}
        for group in self.param_groups:
            for name, p in zip(group["param_names"], group["params"]):
                if name in self._owner:
                    pg, owner, _ = self._owner[name]
                    batches.setdefault((id(pg), owner), [pg, owner, []])[2].append(p)
        for pg, owner, tensors in batches.values():
            flat = torch._utils._flatten_dense_tensors([t.detach() for t in tensors])
            transport.broadcast(flat, src=owner, group=pg)
            for t, value in zip(tensors, torch._utils._unflatten_dense_tensors(flat, tensors)):
                t.copy_(value)
        return loss

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self.optim.state = self.state
        self._sync_hyperparameters()

    def local_state_numel(self) -> int:
        """Elements of optimizer state this rank holds (ZeRO keeps 1/n of its parameters')."""
        return sum(v.numel() for s in self.optim.state.values() for v in s.values()
                   if isinstance(v, torch.Tensor) and v.dim() > 0)
