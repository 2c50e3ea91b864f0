"""What every engine does around its program: the training loop's controls.

    engine.train_step(**batch)         # forward + backward of the global batch; the loss
    engine.eval(); engine.eval_step(**batch); engine.train()
    with engine.no_sync(): engine.train_step(**first_half)    # accumulate, reduce once
    engine.clip_grad_norm_(1.0)        # the global norm; every shard clipped by one factor
    opt = engine.optimizer(torch.optim.AdamW, groups, lr=...)   # a torch.optim.Optimizer

A step is collective: every rank runs it with the same global batch. So before it runs any
collective, the ranks agree (one small all-reduce over a CPU group): that each bound its batch
(names, dtypes and non-tensor arguments as captured), that they are at the same step, and that
their batches have the same shapes. A batch refused on one rank is refused on every rank, at
the same step, and the engine stays usable (the loop may catch it and go on). A failure inside
the step on one rank, after collectives began, leaves the ranks out of step: that rank marks
the engine broken and aborts its process groups, so the others fail within moments
(CollectiveError) instead of pairing their next collectives with the wrong step; every later
call on a broken engine raises.

Gradients a step adds are those of its batch; gradients already there (the caller accumulates
over calls) are set aside during the step and added back after it, and restored unchanged if
the step fails. Under ``no_sync()`` a step's gradients are not reduced over the data axes: they
are kept aside and reduced with the next synchronised step's (DDP's ``no_sync``: one reduction
for several steps); ``.grad`` holds only reduced gradients.

Subclasses (the SPMD and pipeline engines) provide:
    _run(tensors, backward, carry) -> loss   forward (and backward) of a bound batch in the
                                      held module's mode (_mode_key); the reduction of gradients left
                                      Partial included unless self._syncing is False
    _wrapper                          the module capture traces (its .model: the user's model,
                                      or a mixed-precision policy's copy of it)
    _model                            the user's model: its train / eval flags are the engine's
    _held() -> [(name, parameter, copies, differs)]   the rank's trainable tensors: how many
                                      ranks hold the same copy, whether other ranks hold others
    _zero_groups() -> {name: (group, index, size, ranks)}   ZeRO parameters' groups
    _model_names: {id(model parameter): name}           the user's model's tensors by name
    _trained_names() -> set[str] | None               what all ranks train, where a rank holds a part
    _checkpoint_state() -> (names, held, params)       what a checkpoint writes (runtime/state.py)

An engine needs a program it does not hold yet (eval mode, another batch shape) from the layers
above the runtime: capture and the search. It gets them as a ``Recapture`` that parallelize
fills in, so the runtime imports neither shardwise.capture nor shardwise.plan.
"""
from __future__ import annotations

import contextlib
import hashlib
import zlib
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

from .. import _C, _teardown
from .._C import ValidationError
from .._logging import get_logger
from . import grad_norm
from .batch import BatchBinding, map_tensors
from .optim import ShardedOptimizer, param_groups
from .precision import Policy, cast_input, cast_inputs, cast_output

log = get_logger("shardwise.engine")


class CollectiveError(_C.ShardwiseError):
    """A collective of a training step failed on this rank: a peer died or stalled past the
    process group's timeout, or the transport broke. Raised instead of hanging; the message
    names the rank, the step and the collective."""


# What torch.distributed's transports say when a peer is gone or late (Gloo raises plain
# RuntimeErrors, e.g. "[.../gloo/transport/tcp/pair.cc:537] Read error ...: Connection closed").
_TRANSPORT_FAILURES = ("gloo", "Gloo", "NCCL", "Connection closed", "Connection reset", "timed out", "Timed out")


def is_collective_failure(error: BaseException) -> bool:
    return (isinstance(error, getattr(dist, "DistError", ())) or
            (isinstance(error, RuntimeError) and (str(error).startswith("shardwise.") or
                                                 any(m in str(error) for m in _TRANSPORT_FAILURES))))


# What a transport says when the peer itself is gone or late (not when it refuses the tensor:
# Gloo's "Invalid scalar type" comes from the same files as its broken connections).
_PEER_FAILURES = ("Connection closed", "Connection reset", "Connection refused", "Broken pipe", "timed out",
                  "Timed out", "aborted", "Aborted")


def collective_error(error: BaseException, rank: int, step: int, collective: str = "") -> CollectiveError:
    if isinstance(error, getattr(dist, "DistNetworkError", ())) or any(m in str(error) for m in _PEER_FAILURES):
        hint = ("A peer rank probably died or stalled; every rank fails the same way within the timeout given to "
                "torch.distributed.init_process_group (its default: 30 minutes for Gloo, 10 for NCCL).")
    else:
        hint = ("The backend refused the collective on this rank (its tensor's type, size or device), not a peer; "
                "the other ranks fail at the same collective.")
    return CollectiveError(f"rank {rank}, train_step {step}: a collective failed{collective}: {error}\n{hint}")


def replicated_copies(leaf: dict, sizes: list[int]) -> int:
    """How many ranks of the mesh hold the same copy of a leaf: the product of the sizes of the
    axes it is replicated on (the core's leaf["replicated_axes"])."""
    copies = 1
    for axis in leaf["replicated_axes"]:
        copies *= sizes[axis]
    return copies


def zero_axes(zero: dict, name: str, leaf: dict, sizes: list[int]) -> tuple[int, ...]:
    """The axes of more than one rank a ZeRO plan shards parameter `name`'s optimizer state
    over (plan.sharding.zero), among those the leaf is replicated on."""
    return tuple(a for a in zero.get(name, ()) if a in leaf["replicated_axes"] and sizes[a] > 1)


@dataclass
class Recapture:
    """What an engine asks of capture and the search for another program (parallelize fills it).

    capture(arguments) -> (graph, builder)   the engine's module captured on `arguments` (by
                                             name), as parallelize captured it
    search(graph, rows, mesh) -> plan        a sharding searched for `graph` at global batch
                                             `rows` on the {data, tensor} `mesh`
    at_batch(plan, rows) -> plan             `plan` for a global batch of `rows`
    """

    capture: Callable[[dict], tuple]
    search: Callable[[Any, int, tuple], Any]
    at_batch: Callable[[Any, int], Any]


def once_on_rank_zero(make: Callable[[], Any], graph, asked: str) -> Any:
    """``make()`` run on rank 0 alone, its result broadcast to every rank, when every rank asks
    the same of it: `asked` names all that make() reads besides `graph`, and it is compared across
    the ranks with the graph's fingerprint first. Where the ranks share a machine's cores (CPU
    processes), the others' runs of a deterministic make() only took rank 0's cores. An error on
    rank 0 is raised on every rank, of its type, with its message (no rank waits for a result
    that never comes). Ranks that ask different things each run make() themselves. Collective
    over the default group."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return make()
    digest = hashlib.sha256(f"{graph._core.fingerprint()}\n{asked}".encode()).hexdigest()
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, digest)
    if any(d != everyone[0] for d in everyone):
        return make()
    box: list = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = ("made", make())
        except Exception as e:  # every rank raises it below
            box[0] = ("refused", type(e), str(e))
    dist.broadcast_object_list(box, src=0)
    if box[0][0] == "refused":
        _, kind, message = box[0]
        try:
            error = kind(message)
        except Exception:  # a type that is not made from its message alone
            error = RuntimeError(f"{kind.__name__}: {message}")
        raise error
    return box[0][1]


def planned_once(choose: Callable[[], Any], graph, asked: str) -> Any:
    """``choose()`` (a search, a plan's completion: whatever makes the job's plans) run on rank
    0 alone and broadcast where every rank asks the same search (once_on_rank_zero): the search
    is deterministic, so each rank would find the same plans. Plans (or a tuple of plans and
    None) travel pickled without their graph, which each rank's own capture takes back for
    report(). Ranks that ask different things each search, as before, and the plans' hash check
    that follows names the ranks that differ."""
    made = once_on_rank_zero(choose, graph, asked)
    for plan in made if isinstance(made, tuple) else (made,):
        if plan is not None and plan.__dict__.get("_graph") is None:
            plan._graph = graph
    return made


def check_same_plan(plan, rank: int) -> None:
    """Every rank holds `plan` (by its hash), or every rank raises naming those that differ."""
    digest = plan.hash()
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, digest)
    _refuse_different_plans(everyone, rank)


def _refuse_different_plans(digests: list, rank: int) -> None:
    differ = [r for r, d in enumerate(digests) if d != digests[0]]
    if differ:
        raise ValidationError(f"parallelize: ranks hold different plans (rank 0: {digests[0]}, "
                              + ", ".join(f"rank {r}: {digests[r]}" for r in differ) + f"); this is rank {rank}")


def check_same_job(plan, graph, rank: int):
    """The job's one agreement check, before its first collective of the step: every rank
    holds `plan` (its hash) and the rank programs the core makes from it (_C.program_hash,
    gathered in rank order and combined: the plan's ``programs``), both in one gather; else
    every rank raises, naming the ranks that differ (a rank whose core refused its program
    names itself on every rank, never leaving the others waiting). Returns the plan with the
    hash recorded; a plan that recorded another one (made by another version of the rewrite,
    or for another graph) is refused on every rank, naming both."""
    digest = plan.hash()
    try:
        mine, error = _C.program_hash(graph._core, plan.to_json(), rank), None
    except _C.ShardwiseError as e:
        mine, error = None, e
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (digest, mine, None if error is None else str(error)))
    _refuse_different_plans([d for d, _, _ in everyone], rank)
    if error is not None:
        raise error
    failed = [(r, message) for r, (_, _, message) in enumerate(everyone) if message is not None]
    if failed:
        raise ValidationError(f"parallelize: rank {failed[0][0]}: {failed[0][1]}; this is rank {rank}")
    made = _C.programs_hash([m for _, m, _ in everyone])
    recorded = plan.programs  # None when not recorded, or recorded before an edit of the plan
    if recorded and recorded != made:
        raise ValidationError(f"parallelize: the plan records rank programs {recorded}, this job makes {made} from "
                              "it (another version of shardwise's rewrite, or another graph): search the plan "
                              f"again, or run the version that made it; this is rank {rank}")
    return plan.with_programs_hash(made)


class EngineBase:
    def __init__(self, binding: BatchBinding, policy: Policy | None = None):
        _teardown.hold(self)
        self._binding = binding
        self._policy = policy  # mixed precision (runtime/precision.py)
        self._syncing = True
        self._carry: dict[torch.Tensor, torch.Tensor] = {}  # unreduced gradients of no_sync steps
        self._steps = 0          # steps run (train and eval), for error messages
        self._broken: str | None = None
        self._control = _control_group()

    # ---- loop controls ---------------------------------------------------------------------
    @property
    def training(self) -> bool:
        """The mode steps run the model in: the flag of the module the user holds, read at every
        step, as DDP and FSDP2 read it (``model.eval()`` on it switches the engine too)."""
        return self._model.training

    def train(self, mode: bool = True) -> "EngineBase":
        """Training mode (dropout on, batch norm on batch statistics): ``model.train(mode)`` on
        the held module, as ``nn.Module.train`` of a DDP or FSDP2 wrapper does."""
        self._model.train(bool(mode))
        return self

    def eval(self) -> "EngineBase":
        """Evaluation mode: ``eval_step`` and ``train_step`` run the model as ``model.eval()`` does."""
        return self.train(False)

    def _mode_key(self):
        """The held module's modes as a program key: True or False when every submodule agrees,
        else every submodule's flag in ``modules()`` order (a model whose dropout alone was put in
        eval mode is captured so, not as all-train or all-eval)."""
        flags = tuple(m.training for m in self._model.modules())
        return flags[0] if all(f == flags[0] for f in flags) else flags

    @contextlib.contextmanager
    def no_sync(self):
        """Steps inside accumulate gradients without reducing them over the data axes; the next
        step outside reduces everything once (torch DDP's ``no_sync``)."""
        old, self._syncing = self._syncing, False
        try:
            yield
        finally:
            self._syncing = old

    # ---- parameters, optimizer, clipping ----------------------------------------------------
    def named_parameters(self):
        return [(n, p) for n, p, _, _ in self._held()]

    def parameters(self):
        return [p for _, p, _, _ in self._held()]

    def optimizer(self, optimizer_class=torch.optim.AdamW, params=None, **defaults) -> ShardedOptimizer:
        """A ``torch.optim.Optimizer`` (runtime/optim.py) of `optimizer_class` over this rank's
        parameters, in the groups `params` gives (None: one group; names or tensors, the engine's
        or the model's; or group dicts of them with their own options), applying the plan's ZeRO."""
        named = {n: p for n, p in self.named_parameters()}
        groups = param_groups(params, named, self._model_names, self._trained_names())
        return ShardedOptimizer(groups, optimizer_class, defaults, self._zero_groups())

    def _trained_names(self) -> set[str] | None:
        """The names of the parameters every rank together trains (None: this rank holds a block
        of each); a pipeline's ranks hold their stages' only."""
        return None

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                        foreach=None) -> torch.Tensor:
        """The norm of the whole model's gradient, the same on every rank, and every gradient
        shard scaled by one factor: ``torch.nn.utils.clip_grad_norm_`` of the single-device model
        (runtime/grad_norm.py). Call it after ``train_step`` and before ``optimizer.step()``."""
        self._usable("clip_grad_norm_")
        held = [(p, copies) for _, p, copies, _ in self._held()]
        return grad_norm.clip_grad_norm_(held, max_norm, norm_type, error_if_nonfinite, group=self._control)

    # ---- steps -------------------------------------------------------------------------------
    def train_step(self, *args, **kwargs) -> torch.Tensor:
        """Forward and backward of the global batch (bound as ``model(*args, **kwargs)`` binds
        it; a collator's dict alone is taken as keywords); gradients added to ``.grad``, reduced
        over the data axes (unless under ``no_sync``). Returns the loss, the same on every rank."""
        tensors = self._agree(args, kwargs, "train_step")
        params = self.parameters()
        earlier = {p: p.grad for p in params if p.grad is not None}
        for p in earlier:
            p.grad = None
        carry = dict(self._carry)  # the subclass pops what it folds into its reduction
        try:
            loss = cast_output(self._run(cast_inputs(tensors, self._policy), backward=True,
                                         carry=carry if self._syncing else {}), self._policy)
        except BaseException as e:
            for p in params:  # nothing lost: the gradients from before the step
                p.grad = earlier.get(p)
            failure = self._failed(e)
            if failure is e:
                raise
            raise failure from e
        if self._syncing:
            for p, g in carry.items():  # held back gradients of exact (unreduced) parameters
                p.grad = g if p.grad is None else p.grad.add_(g)
            self._carry = {}
        else:  # held back, unreduced, until the next synchronised step
            for p in params:
                if p.grad is not None:
                    self._carry[p] = p.grad if p not in self._carry else self._carry[p].add_(p.grad)
                    p.grad = None
        for p, g in earlier.items():
            p.grad = g if p.grad is None else p.grad.add_(grad_norm.plain(g))
        grad_norm.mark_local([p for _, p, _, differs in self._held() if differs])
        return loss

    def compile_report(self) -> list[dict]:
        """Each program the engine runs compiled (``parallelize(..., compile=...)``; an SPMD
        program, or a pipeline stage's, per mode and batch shapes): its name, the seconds its
        first call took (the compile; None before that call), dynamo's graph breaks in it and
        its pieces run eagerly between compiled ones (compiled.compiled_in_pieces). Empty for
        an eager engine."""
        from .compiled import CompiledProgram

        return [{"program": run.name, "compile_seconds": run.compile_seconds, "graph_breaks": run.graph_breaks,
                 "eager_pieces": run.eager_pieces}
                for run in self._runs() if isinstance(run, CompiledProgram)]

    def _runs(self) -> list:
        """What runs each program the engine has made (its module, or its compiled form)."""
        raise NotImplementedError

    def eval_step(self, *args, **kwargs) -> torch.Tensor:
        """The loss of the global batch, forward only, in the engine's mode (``eval()`` first for
        what ``model.eval()`` computes); no gradient is kept."""
        tensors = self._agree(args, kwargs, "eval_step")
        try:
            with torch.no_grad():
                return cast_output(self._run(cast_inputs(tensors, self._policy), backward=False, carry={}),
                                   self._policy)
        except BaseException as e:
            failure = self._failed(e)
            if failure is e:
                raise
            raise failure from e

    def _captured_arguments(self) -> dict:
        """The last step's bound arguments as a capture traces them (inputs cast by the policy)."""
        return map_tensors(self._binding.last, lambda t: cast_input(t, self._policy))

    @contextlib.contextmanager
    def _mode(self, key):
        """The captured module in the modes of `key` (``_mode_key``) for a new capture, as it
        was after (the captured module is the user's or, under a policy, its copy: the same
        modules in the same order)."""
        modules = list(self._wrapper.model.modules())
        was = [m.training for m in modules]
        flags = [key] * len(modules) if isinstance(key, bool) else list(key)
        try:
            for m, flag in zip(modules, flags):
                m.training = flag
            yield
        finally:
            for m, flag in zip(modules, was):
                m.training = flag

    def _as_state_dict(self, gathered: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The whole tensors by the model's state_dict names (torch's and FSDP's full state dict:
        load_state_dict(strict=True) takes it): persistent buffers only, a tensor no rank holds
        from the copy kept at parallelize, a tied weight under each of its names."""
        kept = getattr(self, "_kept", None)
        if kept is None:
            state = dict(gathered)
        else:
            state = {n: gathered[n] if n in gathered else kept.extra[n].clone()
                     for n in kept.names if n in gathered or n in kept.extra}
        state.update({alias: state[name] for alias, name in self._tied.items() if name in state})
        return state

    def _reduce_dtype(self):
        return self._policy.reduce_dtype if self._policy is not None else None

    # ---- the protocol -----------------------------------------------------------------------------
    def _usable(self, where: str) -> None:
        if self._broken is not None:
            raise CollectiveError(f"{where}: this engine is unusable: {self._broken}")

    def _agree(self, args: tuple, kwargs: dict, where: str) -> dict[str, torch.Tensor]:
        """Binds the batch on this rank and agrees with every rank before any collective."""
        self._usable(where)
        self._steps += 1
        error = None
        tensors: dict[str, torch.Tensor] = {}
        try:
            tensors = self._binding.bind(args, kwargs, where)
            self._check_shapes(tensors, where)
        except ValidationError as e:
            error = e
        shapes = zlib.crc32(repr([list(t.shape) for t in tensors.values()]).encode()) if error is None else 0
        key = self._mode_key()
        mode = int(key) if isinstance(key, bool) else 2 + zlib.crc32(repr(key).encode())
        flags = torch.tensor([int(error is not None), self._steps, -self._steps, shapes, -shapes, mode, -mode],
                             dtype=torch.int64, device="cpu")  # the control group is Gloo on the CPU
        try:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self._control)
        except BaseException as e:
            if isinstance(e, Exception):  # the first collective of a step: a peer is gone or late
                self._broken = f"step {self._steps}: the ranks could not agree ({type(e).__name__})"
                raise collective_error(e, dist.get_rank(), self._steps,
                                       " (shardwise.agree: the all_reduce of the step's flags over the job)") from e
            raise
        failed, high, low, hi_shape, lo_shape, hi_mode, lo_mode = flags.tolist()
        rank = dist.get_rank()
        if error is not None:
            raise error
        if failed:
            raise ValidationError(f"{where} {self._steps}: another rank refused its batch (its error says why); "
                                  f"no rank ran this step (rank {rank})")
        if high != -low:
            self._broken = f"the ranks were at different steps ({-low} to {high})"
            raise CollectiveError(f"{where}: the ranks are at different steps ({-low} to {high}); rank {rank} is at "
                                  f"{self._steps}. A rank skipped or repeated a call")
        if hi_shape != -lo_shape:
            raise ValidationError(f"{where} {self._steps}: the ranks were given batches of different shapes (rank "
                                  f"{rank}: {[list(t.shape) for t in tensors.values()]}); every rank takes the same "
                                  "global batch")
        if hi_mode != -lo_mode:
            raise ValidationError(f"{where} {self._steps}: the ranks' models are in different train() / eval() "
                                  "modes; every rank must switch together")
        return tensors

    def _check_shapes(self, tensors: dict[str, torch.Tensor], where: str) -> None:
        """Subclasses refuse shapes they cannot run (before the ranks agree)."""

    def _failed(self, error: BaseException) -> BaseException:
        """A step failed after the ranks agreed: unless every rank failed the same way (a
        collective error reaches them all; Ctrl-C reaches every process torchrun started), this
        rank leaves the others waiting in collectives, so it aborts its groups (they fail at once)
        and the engine is broken. Returns what to raise."""
        if self._broken is None:
            first = str(error).splitlines()[0] if str(error) else ""
            self._broken = f"step {self._steps} failed on rank {dist.get_rank()} ({type(error).__name__}: {first})"
        if not isinstance(error, Exception):
            return error
        if is_collective_failure(error):
            return collective_error(error, dist.get_rank(), self._steps)
        _abort(self._process_groups())
        return error

    def _process_groups(self) -> list:
        return [self._control]


def mode_name(key) -> str:
    """'training', 'eval' or 'mixed-mode' for a program key's mode (EngineBase._mode_key)."""
    return "training" if key is True else "eval" if key is False else "mixed-mode"


def _control_group():
    """The group the ranks agree on: the world's, or a Gloo one beside NCCL (no device sync)."""
    if dist.get_backend() == "gloo":
        return dist.group.WORLD
    return dist.new_group(backend="gloo")


def _abort(groups: list) -> None:
    for group in groups:
        try:
            pg = group if group is not None else dist.group.WORLD
            if hasattr(pg, "abort"):
                pg.abort()
        except Exception:  # noqa: BLE001 - aborting on the way out; the original error is what matters
            pass
