"""transformers.Trainer on shardwise (shardwise.integrations.transformers; issue 50, item 5).

The Trainer configuration of examples/hf_trainer.py (a tiny float64 Llama, a padding collator
with -100 labels, 5 steps of 2 accumulated batches, max_grad_norm 0.5 that clips, a cosine
schedule with warm-up, evaluation every 2 steps, a checkpoint at step 3) runs three ways:

 - ShardwiseTrainer under torchrun on 4 Gloo processes: trained 5 steps, then a new trainer
   resumed from checkpoint-3 (the example's ``train``, imported from the file);
 - transformers.Trainer in one plain process (no shardwise, no process group): the reference,
   trained and resumed the same way;
 - ShardwiseTrainer in one process, resumed from the 4-process run's checkpoint-3 (another
   world size and plan reads the checkpoint).

The model's loss is computed in float64 (``model.loss_function``: transformers' causal-LM loss
upcasts the logits to float32, which would leave 1e-7 between any two summation orders). Then
the logged losses, gradient norms, learning rates and eval losses, the float64 loss of every
batch (what ``training_step`` returns) and the trained weights equal the reference within
1e-9 relative; the resumed runs log steps 4 and 5 with the uninterrupted run's numbers.
The worker side of this file runs as a script (``python test_trainer_integration.py MODE OUT``).
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
EXAMPLE = os.path.join(ROOT, "examples", "hf_trainer.py")
TOLERANCE = 1e-9
WORLD = 4
MAX_GRAD_NORM = 0.5  # the example's
STEPS, ACCUMULATION = 5, 2


# ---- the worker (run as a script: under torchrun, or in one plain process) ------------------------
def float64_causal_lm_loss(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100,
                           shift_labels=None, **kwargs):
    """transformers' ForCausalLMLoss without its float32 upcast of the logits."""
    if shift_labels is None:
        shift_labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    logits, shift_labels = logits.reshape(-1, vocab_size), shift_labels.reshape(-1).to(logits.device)
    if num_items_in_batch is None:
        return torch.nn.functional.cross_entropy(logits, shift_labels, ignore_index=ignore_index)
    loss = torch.nn.functional.cross_entropy(logits, shift_labels, ignore_index=ignore_index, reduction="sum")
    return loss / num_items_in_batch


def _example():
    """examples/hf_trainer.py as a module (its __main__ block does not run)."""
    spec = importlib.util.spec_from_file_location("hf_trainer_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _float64(trainer_class):
    """`trainer_class` with the model's loss in float64, recording each batch's loss (float64,
    before the Trainer's float32 loss accumulator)."""
    class Float64(trainer_class):
        def __init__(self, *args, model, **kwargs):
            self.batch_losses = []
            model.loss_function = float64_causal_lm_loss
            super().__init__(*args, model=model, **kwargs)

        def training_step(self, model, inputs, num_items_in_batch=None):
            loss = super().training_step(model, inputs, num_items_in_batch)
            self.batch_losses.append(loss.item())
            return loss

    return Float64


def _report(trainer) -> dict:
    return {"log": trainer.state.log_history, "batch_losses": trainer.batch_losses,
            "global_step": trainer.state.global_step}


def _worker_shardwise(out: str) -> None:
    import torch.distributed as dist

    from shardwise.integrations.transformers import STATE_DIR, ShardwiseModel, ShardwiseTrainer

    example = _example()
    cls = _float64(ShardwiseTrainer)
    first = example.train(cls, output_dir=os.path.join(out, "run"))
    engine = first.engine
    rank, world = dist.get_rank(), dist.get_world_size()
    loader = first.get_train_dataloader()
    report = {
        "first": _report(first), "rank": rank, "world": world, "engine": type(engine).__name__,
        "degrees": [engine.plan.pipeline, engine.plan.data, engine.plan.tensor],
        "wrapped": type(first.model_wrapped).__name__, "is_shardwise_model": isinstance(first.model_wrapped,
                                                                                        ShardwiseModel),
        "ddp": any(isinstance(m, torch.nn.parallel.DistributedDataParallel) for m in
                   [first.model_wrapped, first.model, *first.model.modules()]),
        "prepared_models": len(first.accelerator._models),
        "loader_batches": len(loader), "first_batch_rows": int(next(iter(loader))["input_ids"].shape[0]),
        "args_world": first.args.world_size, "process_index": first.args.process_index,
        "checkpoint": sorted(os.listdir(os.path.join(out, "run", "checkpoint-3"))),
        "state_files": sorted(os.listdir(os.path.join(out, "run", "checkpoint-3", STATE_DIR))),
    }
    # trainer.model after train(): the engine's weights, gathered
    full = engine.full_state_dict()
    report["model_synced"] = max((full[n] - t).abs().max().item() for n, t in first.model.state_dict().items())
    if rank == 0:
        torch.save(first.model.state_dict(), os.path.join(out, "weights.shardwise.pt"))
    resumed = example.train(cls, output_dir=os.path.join(out, "run"),
                            resume_from=os.path.join(out, "run", "checkpoint-3"))
    report["resumed"] = _report(resumed)
    # Ranks given different batches: refused at the first step, on every rank.
    try:
        _mixed(example, cls, out, rank)
        report["mixed"] = None
    except Exception as e:  # noqa: BLE001 - the message is the result
        report["mixed"] = f"{type(e).__name__}: {e}"
    with open(os.path.join(out, f"shardwise.{rank}.json"), "w") as f:
        json.dump(report, f)
    dist.barrier()


def _mixed(example, cls, out: str, rank: int):
    """The example's trainer whose ranks load different rows (the dataset seeded by rank)."""
    rows = example.rows

    def by_rank(n, seed):
        return rows(n, seed + 100 * rank)

    example.rows = by_rank
    try:
        return example.train(cls, output_dir=os.path.join(out, "mixed"))
    finally:
        example.rows = rows


def _worker_plain(out: str) -> None:
    import transformers

    from shardwise.integrations.transformers import ShardwiseTrainer

    example = _example()
    cls = _float64(transformers.Trainer)
    first = example.train(cls, output_dir=os.path.join(out, "plain"))
    torch.save(first.model.state_dict(), os.path.join(out, "weights.plain.pt"))
    resumed = example.train(cls, output_dir=os.path.join(out, "plain"),
                            resume_from=os.path.join(out, "plain", "checkpoint-3"))
    # One shardwise process resumes the 4-process run's checkpoint (another world size and plan).
    across = example.train(_float64(ShardwiseTrainer), output_dir=os.path.join(out, "across"),
                           resume_from=os.path.join(out, "run", "checkpoint-3"))
    with open(os.path.join(out, "plain.json"), "w") as f:
        json.dump({"first": _report(first), "resumed": _report(resumed), "across": _report(across),
                   "across_degrees": [across.engine.plan.pipeline, across.engine.plan.data,
                                      across.engine.plan.tensor]}, f)


# ---- the test ---------------------------------------------------------------------------------------
def _run(args: list[str], cwd) -> None:
    import shardwise

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.path.dirname(shardwise.__path__[0]),
                                                                     os.environ.get("PYTHONPATH")])))
    # timeout: a guard against a hung job, not a bound on the run time
    out = subprocess.run(args, capture_output=True, text=True, timeout=1800, cwd=cwd, env=env)
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-20000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    import transformers  # noqa: F401
    import accelerate  # noqa: F401  (scripts/install.sh --test installs it: a missing one fails, never skips)
    out = tmp_path_factory.mktemp("trainer")
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD),
          os.path.abspath(__file__), "shardwise", str(out)], out)
    _run([sys.executable, os.path.abspath(__file__), "plain", str(out)], out)
    ranks = []
    for rank in range(WORLD):
        with open(out / f"shardwise.{rank}.json") as f:
            ranks.append(json.load(f))
    with open(out / "plain.json") as f:
        plain = json.load(f)
    weights = {mode: torch.load(out / f"weights.{mode}.pt") for mode in ("shardwise", "plain")}
    return ranks, plain, weights


def _entries(log: list[dict], key: str) -> dict[int, float]:
    """{step: value} of the log entries that hold `key`."""
    return {h["step"]: h[key] for h in log if key in h}


def _relative(ours: dict | list, theirs: dict | list) -> float:
    if isinstance(theirs, dict):
        assert sorted(ours) == sorted(theirs), (ours, theirs)
        ours, theirs = [ours[k] for k in sorted(theirs)], [theirs[k] for k in sorted(theirs)]
    assert len(ours) == len(theirs) and theirs, (ours, theirs)
    return max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(ours, theirs))


@pytest.mark.slow
def test_the_engine_owns_the_distribution(runs):
    ranks, _, _ = runs
    for r, report in enumerate(ranks):
        assert report["rank"] == r and report["world"] == WORLD and report["args_world"] == WORLD, report
        assert report["process_index"] == r, report  # the Trainer sees the job: rank 0 logs and writes
        # the plan spans the job (pipeline x data x tensor = 4 ranks; the search picked data 2 x tensor 2)
        assert report["engine"] in ("Engine", "PipelineEngine"), report
        assert torch.Size(report["degrees"]).numel() == WORLD, report["degrees"]
        # no DDP, nothing prepared by accelerate: the loop holds the engine's ShardwiseModel
        assert report["is_shardwise_model"] and not report["ddp"] and report["prepared_models"] == 0, report
        # every rank loads the whole batch (8 rows; 64 rows in 8 batches), not a quarter of it
        assert report["loader_batches"] == 8 and report["first_batch_rows"] == 8, report
        assert report["model_synced"] == 0.0, report
        assert "shardwise_state" in report["checkpoint"] and "model.safetensors" in report["checkpoint"], report
        assert sum(name.endswith(".distcp") for name in report["state_files"]) == WORLD, report["state_files"]
        assert report["first"]["batch_losses"] == ranks[0]["first"]["batch_losses"], r  # one loss on every rank


@pytest.mark.slow
def test_losses_equal_the_plain_trainer_on_one_process(runs):
    ranks, plain, weights = runs
    ours, theirs = ranks[0]["first"], plain["first"]
    errors = {key: _relative(_entries(ours["log"], key), _entries(theirs["log"], key))
              for key in ("loss", "grad_norm", "learning_rate", "eval_loss")}
    errors["batch_losses"] = _relative(ours["batch_losses"], theirs["batch_losses"])
    errors["weights"] = max(((weights["shardwise"][n] - t).abs().max() / t.abs().max()).item()
                            for n, t in weights["plain"].items())
    print("ShardwiseTrainer on 4 Gloo ranks vs transformers.Trainer on one process: "
          + ", ".join(f"{k} {v:.1e}" for k, v in errors.items()))
    for kind, error in errors.items():
        assert error < TOLERANCE, (kind, error, ours, theirs)
    # The configuration did what it says: 5 steps of 2 batches, logged each step, evaluated at
    # steps 2, 4 and 5, clipped (the norm above max_grad_norm), the learning rate scheduled.
    assert sorted(_entries(theirs["log"], "loss")) == list(range(1, STEPS + 1)), theirs["log"]
    assert len(theirs["batch_losses"]) == STEPS * ACCUMULATION, theirs
    assert sorted(_entries(theirs["log"], "eval_loss")) == [2, 4, 5], theirs["log"]
    assert max(_entries(theirs["log"], "grad_norm").values()) > MAX_GRAD_NORM, theirs["log"]
    assert len(set(_entries(theirs["log"], "learning_rate").values())) == STEPS, theirs["log"]


@pytest.mark.slow
def test_resuming_continues_with_the_uninterrupted_losses(runs):
    ranks, plain, _ = runs
    first, resumed = ranks[0]["first"], ranks[0]["resumed"]
    # Resumed at step 3: it ran steps 4 and 5 only (2 x 2 batches), and ended at step 5.
    assert len(resumed["batch_losses"]) == (STEPS - 3) * ACCUMULATION and resumed["global_step"] == STEPS, resumed
    keys = ("loss", "grad_norm", "learning_rate", "eval_loss")
    later = {k: {s: v for s, v in _entries(first["log"], k).items() if s > 3} for k in keys}
    errors = {k: _relative({s: v for s, v in _entries(resumed["log"], k).items() if s > 3}, later[k]) for k in later}
    errors["batch_losses"] = _relative(resumed["batch_losses"], first["batch_losses"][3 * ACCUMULATION:])
    # The same checkpoint read by one process (another world size and plan).
    across = plain["across"]
    assert len(across["batch_losses"]) == (STEPS - 3) * ACCUMULATION and plain["across_degrees"] == [1, 1, 1], plain
    errors["one process, from the 4-rank checkpoint"] = _relative(across["batch_losses"],
                                                                  first["batch_losses"][3 * ACCUMULATION:])
    # The plain Trainer, resumed from its own checkpoint, agrees too.
    errors["vs plain resumed"] = _relative(resumed["batch_losses"], plain["resumed"]["batch_losses"])
    print("resumed from checkpoint-3 vs uninterrupted: " + ", ".join(f"{k} {v:.1e}" for k, v in errors.items()))
    for kind, error in errors.items():
        assert error < TOLERANCE, (kind, error, resumed, first)


@pytest.mark.slow
def test_ranks_given_different_batches_are_refused(runs):
    ranks, _, _ = runs
    for report in ranks:
        assert report["mixed"] is not None and "different batches" in report["mixed"], report["mixed"]


@pytest.mark.parametrize("option, name", [
    ({"optim": "adafactor"}, "optim='adafactor'"),
    ({"label_smoothing_factor": 0.1}, "label_smoothing_factor"),
    ({"torch_compile": True}, "torch_compile"),
    ({"auto_find_batch_size": True}, "auto_find_batch_size"),
    ({"neftune_noise_alpha": 5.0}, "neftune_noise_alpha"),
    ({"bf16": True}, "fp16 / bf16"),
    ({"fsdp": True}, "fsdp"),
    ({"activation_checkpointing": True}, "activation"),
    ({"train_sampling_strategy": "batch_rebalance"}, "train_sampling_strategy='batch_rebalance'"),
])
def test_unsupported_arguments_are_refused_naming_them(tmp_path, option, name):
    import transformers
    import accelerate  # noqa: F401  (scripts/install.sh --test installs it: a missing one fails, never skips)
    from shardwise import ValidationError
    from shardwise.integrations.transformers import ShardwiseTrainer

    args = transformers.TrainingArguments(str(tmp_path), report_to="none", use_cpu=True, **option)
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValidationError, match=rf"ShardwiseTrainer: {name}.* is not supported"):
        ShardwiseTrainer(model=model, args=args)


def test_trainer_options_it_cannot_run_exactly_are_refused(tmp_path):
    import transformers
    import accelerate  # noqa: F401  (scripts/install.sh --test installs it: a missing one fails, never skips)
    from shardwise import ValidationError
    from shardwise.integrations.transformers import ShardwiseTrainer

    args = transformers.TrainingArguments(str(tmp_path), report_to="none", use_cpu=True)
    model = torch.nn.Linear(2, 2)
    for kwargs, name in (({"compute_metrics": lambda p: {}}, "compute_metrics"),
                         ({"compute_loss_func": lambda o, l, num_items_in_batch=None: o.sum()}, "compute_loss_func"),
                         ({"optimizers": (torch.optim.SGD(model.parameters(), lr=0.1), None)}, "optimizers"),
                         ({"parallelize_kwargs": {"loss_fn": lambda o, t: o}}, "parallelize_kwargs")):
        with pytest.raises(ValidationError, match=name):
            ShardwiseTrainer(model=model, args=args, **kwargs)

    class OwnLoss(ShardwiseTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            return model(**inputs).sum()

    with pytest.raises(ValidationError, match="OwnLoss.compute_loss"):
        OwnLoss(model=model, args=args)


if __name__ == "__main__":
    torch.set_num_threads(1)
    mode, out = sys.argv[1], sys.argv[2]
    {"shardwise": _worker_shardwise, "plain": _worker_plain}[mode](out)
