"""Hugging Face ``transformers.Trainer`` on the shardwise engine: the one change to a Trainer
script is the class.

    from shardwise.integrations.transformers import ShardwiseTrainer

    trainer = ShardwiseTrainer(model=model, args=args, data_collator=collate,     # was: Trainer(...)
                               train_dataset=train, eval_dataset=test)
    trainer.train()                                     # torchrun --nproc-per-node N train.py, or python train.py
    trainer.train(resume_from_checkpoint="out/checkpoint-300")   # any world size, any plan

What it means: the script is the single-device program, and every rank runs it. Each rank
loads the *whole* batch the script describes (``per_device_train_batch_size`` rows, as one
device would: the batch is the global one) and ``shardwise.parallelize`` splits it as the plan
says (data, tensor or pipeline parallelism over the job's ranks). The losses, gradient norms,
learning rates and evaluation losses every rank logs are those of the same script on one device
without shardwise (``transformers.Trainer`` in one process), within rounding; the test
(tests/python/integrations/test_trainer_integration.py) measures them on 4 Gloo processes.

Why a subclass of ``Trainer``, not a ``TrainerCallback``: a callback only observes the loop
(``on_step_end``, ``on_save``...); it cannot replace the forward and backward, the optimizer,
the clipping or what a checkpoint holds, and a Trainer left to itself would wrap the model in
DDP under torchrun and shard the data loader by rank. The subclass overrides the methods each
concern lives in (public hooks, and the Trainer's private methods where that is where it lives:
written against transformers 5.24 and accelerate 1.15), each with what the engine does instead,
and keeps the rest of the loop (epochs, gradient accumulation, logging, callbacks, evaluation
and save schedules, checkpoint rotation, the trainer state) as transformers runs it:

 - ``training_step``: ``engine.train_step(**batch)`` on the collator's batch (with the
   Trainer's ``num_items_in_batch`` when the model takes it, so a loss accumulated over
   ``gradient_accumulation_steps`` batches is the one the Trainer computes), under
   ``engine.no_sync()`` on all but the accumulation's last batch;
 - ``create_optimizer``: ``engine.optimizer(cls, groups, **kwargs)`` with the Trainer's own
   class, options and weight-decay groups (by parameter name); the scheduler is the Trainer's
   (``lr_scheduler_type``), stepping that optimizer;
 - ``_clip_grad_norm`` / ``_get_grad_norm``: ``engine.clip_grad_norm_(max_grad_norm)`` (the
   whole model's norm, the same on every rank);
 - ``prediction_step``: ``engine.eval_step(**batch)`` in eval mode (the eval loss);
 - ``_wrap_model``: a ``ShardwiseModel`` (an ``nn.Module`` around the engine), never DDP,
   DataParallel or FSDP; as it is not ``trainer.model``, the Trainer does not hand the model
   to ``accelerator.prepare`` (which would wrap it in DDP under torchrun);
 - checkpoints: ``shardwise.save_checkpoint`` / ``load_checkpoint`` (model and optimizer, in
   ``checkpoint-N/shardwise_state``, any plan and world size reads any other's), the
   scheduler, trainer state and random state as the Trainer writes them, and the whole model
   in Hugging Face format beside them (``save_model``: ``from_pretrained`` reads it);
 - after ``train()``, ``trainer.model`` holds the trained weights (gathered from the engine).

Accelerate: the Trainer builds an ``Accelerator``, which under torchrun would shard each data
loader by rank (``BatchSamplerShard``) and gather metrics across ranks. The subclass keeps the
Accelerator and changes four of its methods on this trainer's instance only
(``create_accelerator_and_postprocess``): ``prepare_data_loader`` prepares every loader as for
one process (the same seeded sampler, no sharding, no dispatching), and ``gather`` /
``gather_for_metrics`` / ``pad_across_processes`` return their input (every rank already holds
the whole batch: gathering would count it once per rank, as ``average_tokens_across_devices``
would in ``num_items_in_batch``). The optimizer still goes through ``accelerator.prepare``
(an ``AcceleratedOptimizer`` that steps the engine's optimizer). On CPUs under torchrun,
accelerate takes each process for a job of its own unless ``use_cpu=True``; the trainer then
sets ``use_cpu=True`` (and ``ddp_backend`` to ``shardwise.backend_for``'s Gloo) on the
arguments and sets their devices up again, which starts the job's process group, so that rank 0
alone logs and writes the checkpoint's files. (transformers warns, for arguments built after
the group started, that the group is "initialized, but parallel_mode != DISTRIBUTED": this is
that case, and the trainer fixes it.) A plain process gets a process group of one.

Every rank must load the same batches: the Trainer seeds its sampler (accelerate's seedable
sampler) and every rank runs the same script, so they do; ``check_batches`` (default True)
checks it at every step (a CRC of the batch, compared across ranks in one small all-reduce)
and raises naming the step when a rank's batch differs (a data loader or collator drawing
from a per-rank random source) rather than train on a mix of batches.

What the engine cannot do as the Trainer would is refused with a ``ValidationError`` naming
the option, when the trainer is built (``predict()``, when it is called): fp16 / bf16
autocast, DeepSpeed, FSDP, an accelerate ``parallelism_config``, ``torch_compile``,
activation checkpointing (use the plan's recomputation), NEFTune, Liger kernels, label
smoothing, ``compute_loss_func``, a subclass's own ``compute_loss``, ``compute_metrics`` /
``preprocess_logits_for_metrics`` and ``predict()`` with outputs (the engine returns the loss
only), ``optimizers=(...)`` built over the model's own tensors, optimizers that are not
elementwise on a shard (Adafactor, 8-bit, GaLore, LOMO, ...), ``model_init``,
``auto_find_batch_size``, the ``batch_rebalance`` sampler (it hands each rank its own
batches), and a single process driving several GPUs (``nn.DataParallel``: launch one process
per device with torchrun). Resuming a plain Trainer's checkpoint that holds an optimizer state
(``optimizer.pt``) is refused too: one process' optimizer state cannot be resharded.
"""
from __future__ import annotations

import contextlib
import inspect
import os
import random
import zlib
from typing import Any

import torch
import torch.distributed as dist

try:
    from transformers import Trainer, TrainingArguments
except ImportError as e:  # pragma: no cover - transformers is an optional dependency
    raise ImportError("shardwise.integrations.transformers needs transformers (pip install 'transformers>=4.45' "
                      "accelerate)") from e

from .. import checkpoint as _checkpoint
from .._C import ValidationError
from .._logging import get_logger
from ..devices import backend_for, local_device
from ..engine import parallelize

log = get_logger("shardwise.integrations.transformers")

__all__ = ["ShardwiseTrainer", "ShardwiseModel", "STATE_DIR"]

STATE_DIR = "shardwise_state"  # in checkpoint-N/: the engine's model and optimizer (shardwise.save_checkpoint)
_SCHEDULER = "scheduler.pt"    # transformers.trainer's SCHEDULER_NAME, OPTIMIZER_NAME: the files it writes
_OPTIMIZER = "optimizer.pt"

# The optimizers of TrainingArguments.optim whose update is elementwise, so that stepping a
# shard is stepping the whole tensor (runtime/optim.py); the others reduce over a tensor or a
# block of it (Adafactor, 8-bit and 4-bit states, GaLore's projections, LOMO's fused backward).
_ELEMENTWISE_OPTIMS = ("adamw_torch", "adamw_torch_fused", "sgd", "adagrad", "rmsprop")

# parallelize's own arguments, which the trainer fills in itself.
_OWN_ARGUMENTS = ("model", "example_inputs", "loss_fn", "example_kwargs")


class ShardwiseModel(torch.nn.Module):
    """What the Trainer's loop holds as its model (``trainer.model_wrapped``): the user's model
    (``.model``, whose train / eval flags the engine reads at every step) and the engine that
    trains it. ``zero_grad`` clears the engine's gradients (the Trainer calls it after each
    optimizer step). Calling it is refused: the engine runs the model (``trainer.engine``)."""

    def __init__(self, trainer: "ShardwiseTrainer"):
        super().__init__()
        self.model = trainer.model
        object.__setattr__(self, "_trainer", trainer)  # not a submodule: no cycle in modules()

    @property
    def engine(self):
        return self._trainer._engine

    def zero_grad(self, set_to_none: bool = True) -> None:
        engine = self.engine
        if engine is not None:
            for p in engine.parameters():
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.detach_().zero_()
        super().zero_grad(set_to_none)

    def forward(self, *args, **kwargs):
        raise ValidationError("ShardwiseModel: the shardwise engine runs the model (trainer.engine.train_step / "
                              "eval_step); after train(), trainer.model holds the trained weights")


class ShardwiseTrainer(Trainer):
    """``transformers.Trainer`` whose training, evaluation, optimizer, clipping and checkpoints
    go through a shardwise engine (module docstring). Takes the Trainer's arguments, and:

    ``parallelize_kwargs``: passed to ``shardwise.parallelize`` (``plan``, ``cluster``,
    ``mesh``, ``level``, ``static``, ``verify``, ``zero``, ``mixed_precision``...); the
    model and its example batch are the trainer's. ``check_batches``: compare every step's
    batch across ranks (a CRC, one small all-reduce) and raise when they differ.

    ``trainer.engine`` is the engine (None until the first batch or ``train()``)."""

    def __init__(self, model=None, args=None, *trainer_args, parallelize_kwargs: dict | None = None,
                 check_batches: bool = True, **trainer_kwargs):
        self._engine = None
        self._shardwise_model: ShardwiseModel | None = None
        self._parallelize_kwargs = dict(parallelize_kwargs or {})
        self._check_batches = check_batches
        self._batch_checks = 0
        taken = sorted(set(self._parallelize_kwargs) & set(_OWN_ARGUMENTS))
        if taken:
            raise ValidationError(f"ShardwiseTrainer: parallelize_kwargs {taken} are the trainer's own (the model, its "
                                  "batch from the data collator, and its loss)")
        named = dict(zip(_TRAINER_POSITIONAL, trainer_args))
        _refuse_unsupported(type(self), args, {**named, **trainer_kwargs})
        if args is None:
            args = TrainingArguments(output_dir="tmp_trainer")  # what Trainer would make
        _join_the_job(args)
        super().__init__(model, args, *trainer_args, **trainer_kwargs)
        _refuse_after_init(self)

    # ---- the accelerator: one process's data, nothing to gather --------------------------------
    def create_accelerator_and_postprocess(self) -> None:
        """The Trainer's Accelerator, made to prepare data loaders as for one process and to
        gather nothing: every rank holds the whole batch (module docstring)."""
        super().create_accelerator_and_postprocess()
        accelerator = self.accelerator
        accelerator.prepare_data_loader = _one_process_data_loaders(accelerator)
        accelerator.gather = _whole
        accelerator.gather_for_metrics = _whole
        accelerator.pad_across_processes = _whole
        self.gather_function = _whole

    # ---- the engine ----------------------------------------------------------------------------
    @property
    def engine(self):
        """The shardwise engine that trains the model (None before the first batch)."""
        return self._engine

    def _ensure_engine(self, batch: dict):
        if self._engine is None:
            _ensure_process_group()
            with _random_state_kept():  # parallelize's checks run the model: the loop's random stream stays
                self._engine = parallelize(self.model, batch, **self._parallelize_kwargs)
            log.info("ShardwiseTrainer: %s over %d ranks", type(self._engine).__name__, dist.get_world_size())
        return self._engine

    def _example_batch(self) -> dict:
        """The first batch the training loop will take, as the engine takes it (the data loader
        iterated once aside, every random state as it was)."""
        with _random_state_kept():
            inputs = next(iter(self.get_train_dataloader()))
        inputs = self._prepare_inputs(inputs)
        return self._engine_batch(inputs, self._num_items([inputs]))

    def _num_items(self, batches: list[dict]):
        """The Trainer's num_items_in_batch of `batches` (None where this transformers has none)."""
        count = getattr(self, "_get_num_items_in_batch", None)
        return count(batches, self.args.device) if count is not None else None

    def _engine_batch(self, inputs: dict, num_items_in_batch) -> dict:
        """The model's keyword arguments, as Trainer.compute_loss calls it."""
        batch = dict(inputs)
        if getattr(self, "model_accepts_loss_kwargs", False) and num_items_in_batch is not None:
            batch["num_items_in_batch"] = num_items_in_batch
        return batch

    def _same_batch_everywhere(self, batch: dict, where: str) -> None:
        """Raise on every rank when the ranks were given different batches."""
        if not self._check_batches or dist.get_world_size() == 1:
            return
        self._batch_checks += 1
        crc = 0
        for name in sorted(batch):
            value = batch[name]
            crc = zlib.crc32(name.encode(), crc)
            if isinstance(value, torch.Tensor):
                data = value.detach().reshape(-1).cpu().contiguous()
                crc = zlib.crc32(str(data.dtype).encode(), crc)
                crc = zlib.crc32(data.view(torch.uint8).numpy().tobytes(), crc)
            else:
                crc = zlib.crc32(repr(value).encode(), crc)
        flags = torch.tensor([crc, -crc], dtype=torch.int64, device="cpu")  # the engine's control group is Gloo
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self._engine._control)
        if flags[0].item() != -flags[1].item():
            raise ValidationError(
                f"ShardwiseTrainer.{where} (batch {self._batch_checks}, global step {self.state.global_step}): the "
                f"ranks were given different batches (rank {dist.get_rank()}: CRC {crc:#010x}); every rank must load "
                "the same global batch, as one device would (a data loader, sampler or collator drawing from a "
                "per-rank random source: seed it alike on every rank, e.g. dataloader_num_workers=0)")

    # ---- training ----------------------------------------------------------------------------
    def training_step(self, model, inputs: dict, num_items_in_batch=None) -> torch.Tensor:
        """One batch forward and backward through the engine (Trainer.training_step's contract:
        returns the loss as the Trainer logs it, gradients added to the engine's parameters)."""
        model.train()
        if hasattr(self.optimizer, "train") and callable(self.optimizer.train):
            self.optimizer.train()
        inputs = self._prepare_inputs(inputs)
        batch = self._engine_batch(inputs, num_items_in_batch)
        engine = self._ensure_engine(batch)
        self._same_batch_everywhere(batch, "training_step")
        last = self.accelerator.gradient_state.sync_gradients  # the accumulation's last batch
        with contextlib.nullcontext() if last else engine.no_sync():
            loss = engine.train_step(**batch)
        empty_cache = getattr(self.args, "torch_empty_cache_steps", None)
        if empty_cache is not None and self.state.global_step % empty_cache == 0 and torch.cuda.is_available():
            torch.cuda.empty_cache()
        scaled = getattr(self, "loss_is_scaled_for_ga", None)
        if scaled is None:  # the model divided by num_items_in_batch: the accumulated batches' token count
            scaled = getattr(self, "model_accepts_loss_kwargs", False) and num_items_in_batch is not None
        if not scaled:
            # The Trainer backpropagates loss / steps; the engine backpropagated the loss: the
            # accumulated gradient is divided once, at the accumulation's last batch (the same sum,
            # one rounding apart; exact when the number of steps is a power of two).
            steps = getattr(self, "current_gradient_accumulation_steps", self.args.gradient_accumulation_steps)
            loss = loss / steps
            if last and steps != 1:
                with torch.no_grad():
                    for p in engine.parameters():
                        if p.grad is not None:
                            p.grad.div_(steps)
        return loss.detach()

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        raise ValidationError("ShardwiseTrainer: the engine computes the model's own loss (training_step, "
                              "prediction_step); compute_loss is not called")

    def create_optimizer(self, model=None):
        """The Trainer's optimizer (args.optim, or optimizer_cls_and_kwargs), its weight-decay
        groups by parameter name, over the engine's parameters (engine.optimizer)."""
        if self.optimizer is not None:
            return self.optimizer
        engine = self._ensure_engine(self._example_batch())
        if self.optimizer_cls_and_kwargs is not None:
            optimizer_cls, kwargs = self.optimizer_cls_and_kwargs
        else:
            optimizer_cls, kwargs = self.get_optimizer_cls_and_kwargs(self.args, self.model)
        kwargs = dict(kwargs)
        for key in ("params", "model", "optimizer_dict"):
            if key in kwargs:
                raise ValidationError(f"ShardwiseTrainer: optimizer {self.args.optim!r} builds its own parameter "
                                      f"groups ({key}=...) over the model's tensors, which the engine does not train")
        decay = set(self.get_decay_parameter_names(self.model))
        named = [n for n, p in self.model.named_parameters() if p.requires_grad]
        groups = [{"params": [n for n in named if n in decay], "weight_decay": self.args.weight_decay},
                  {"params": [n for n in named if n not in decay], "weight_decay": 0.0}]
        self.optimizer = engine.optimizer(optimizer_cls, groups, **kwargs)
        return self.optimizer

    def _sharded_optimizer(self):
        """The engine's optimizer under accelerate's AcceleratedOptimizer."""
        optimizer = self.optimizer
        while optimizer is not None and type(optimizer).__name__ == "AcceleratedOptimizer":
            optimizer = optimizer.optimizer
        return optimizer

    def _wrap_model(self, model, training: bool = True, dataloader=None):
        if self._shardwise_model is None or self._shardwise_model.model is not self.model:
            self._shardwise_model = ShardwiseModel(self)
        return self._shardwise_model

    def _clip_grad_norm(self, model):
        return self._engine.clip_grad_norm_(self.args.max_grad_norm)

    def _get_grad_norm(self, model, grad_norm=None):
        if grad_norm is None:
            grad_norm = self._engine.clip_grad_norm_(float("inf"))  # the norm; a factor of 1
        return grad_norm

    def get_total_train_batch_size(self, args) -> int:
        """The rows of one optimizer step: every rank takes the whole batch (not one per rank)."""
        return self._train_batch_size * args.gradient_accumulation_steps

    def train(self, *args, **kwargs):
        """Trainer.train; then ``trainer.model`` holds the trained weights (gathered)."""
        output = super().train(*args, **kwargs)
        if self._engine is not None:
            state = self._engine.full_state_dict()  # every rank: a collective
            with torch.no_grad():
                self.model.load_state_dict(state)
        return output

    # ---- evaluation ----------------------------------------------------------------------------
    def prediction_step(self, model, inputs: dict, prediction_loss_only: bool, ignore_keys=None):
        """The batch's loss through ``engine.eval_step`` (the engine returns no outputs)."""
        if not prediction_loss_only:
            raise ValidationError("ShardwiseTrainer: predictions (predict(), compute_metrics, "
                                  "prediction_loss_only=False) need the model's outputs; the shardwise engine returns "
                                  "the loss only. Evaluate the loss (evaluate()), or run trainer.model after train()")
        has_labels = bool(self.label_names) and all(inputs.get(k) is not None for k in self.label_names)
        return_loss = inputs.get("return_loss")
        if return_loss is None:
            return_loss = self.can_return_loss
        if not (has_labels or (len(self.label_names) == 0 and return_loss)):
            return None, None, None  # no loss to compute, and no outputs asked for
        inputs = self._prepare_inputs(inputs)
        batch = self._engine_batch(inputs, self._num_items([inputs]))
        engine = self._ensure_engine(batch)
        self._same_batch_everywhere(batch, "prediction_step")
        loss = engine.eval_step(**batch)
        return loss.detach().mean(), None, None

    # ---- checkpoints ---------------------------------------------------------------------------
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """The whole model in Hugging Face format (rank 0 writes what every rank gathers), as
        ``from_pretrained`` reads it."""
        if self._engine is None:
            return super().save_model(output_dir, _internal_call)
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        state = self._engine.full_state_dict()
        self._save(output_dir, state_dict=state)
        if _internal_call and self.args.save_only_model:  # a checkpoint of the model alone: resumable
            _checkpoint.save_checkpoint(os.path.join(output_dir, STATE_DIR), self._engine)
        if self.args.push_to_hub and not _internal_call:
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        """The engine's model and optimizer (shardwise.save_checkpoint, every rank its shards) and
        the scheduler (rank 0)."""
        _checkpoint.save_checkpoint(os.path.join(output_dir, STATE_DIR), self._engine, self._sharded_optimizer(),
                                    extra={"global_step": self.state.global_step})
        if self.args.should_save:
            torch.save(self.lr_scheduler.state_dict(), os.path.join(output_dir, _SCHEDULER))

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        """A shardwise checkpoint is read into the engine with the optimizer
        (_load_optimizer_and_scheduler, once the engine exists); a plain Trainer's weights are
        read into the model before the engine is built from it."""
        if os.path.isdir(os.path.join(resume_from_checkpoint, STATE_DIR)):
            return
        if self._engine is not None:
            raise ValidationError(f"ShardwiseTrainer: {resume_from_checkpoint} holds no shardwise state ({STATE_DIR}/) "
                                  "and this trainer's engine is built already: its weights would not reach the "
                                  "engine. Resume with a new ShardwiseTrainer")
        super()._load_from_checkpoint(resume_from_checkpoint, model)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        if checkpoint is None:
            return
        state = os.path.join(checkpoint, STATE_DIR)
        if not os.path.isdir(state):
            if os.path.isfile(os.path.join(checkpoint, _OPTIMIZER)):
                raise ValidationError(f"ShardwiseTrainer: {checkpoint} was written by transformers.Trainer: its "
                                      f"{_OPTIMIZER} holds one process' optimizer state, which the engine's sharded "
                                      "optimizer cannot take; resume from a ShardwiseTrainer checkpoint, or remove "
                                      f"{_OPTIMIZER} and {_SCHEDULER} to start the optimizer afresh from its weights")
            return  # weights only (save_only_model): the optimizer starts afresh, as the Trainer's does
        scheduler = os.path.join(checkpoint, _SCHEDULER)
        with_optimizer = os.path.isfile(scheduler)
        _checkpoint.load_checkpoint(state, self._engine, self._sharded_optimizer() if with_optimizer else None)
        if with_optimizer:
            self.lr_scheduler.load_state_dict(torch.load(scheduler, weights_only=True))

    def _load_best_model(self) -> None:
        best = self.state.best_model_checkpoint
        if self._engine is None:
            return super()._load_best_model()
        state = os.path.join(best, STATE_DIR)
        if not os.path.isdir(state):
            raise ValidationError(f"ShardwiseTrainer: load_best_model_at_end: {best} holds no {STATE_DIR}/")
        _checkpoint.load_checkpoint(state, self._engine)

    def _load_rng_state(self, checkpoint: str | None) -> None:
        """The Trainer's per-rank random state; a checkpoint of another world size has none for
        this rank: then rank 0's (or a one-process run's), which is every rank's where the ranks
        draw one device's random numbers (the SPMD engine)."""
        if checkpoint is None:
            return
        own = f"rng_state_{self.args.process_index}.pth" if self.args.world_size > 1 else "rng_state.pth"
        if os.path.isfile(os.path.join(checkpoint, own)):
            return super()._load_rng_state(checkpoint)
        for name in ("rng_state.pth", "rng_state_0.pth"):
            path = os.path.join(checkpoint, name)
            if os.path.isfile(path):
                with _safe_globals():
                    _set_random_state(torch.load(path, weights_only=True))
                return
        log.warning("ShardwiseTrainer: %s holds no random state; the resumed run draws other random numbers "
                    "(dropout) than an uninterrupted one", checkpoint)


# ---- refusals ------------------------------------------------------------------------------------
_TRAINER_POSITIONAL = ("data_collator", "train_dataset", "eval_dataset", "processing_class", "model_init",
                       "compute_loss_func", "compute_metrics", "callbacks", "optimizers", "optimizer_cls_and_kwargs",
                       "preprocess_logits_for_metrics")


def _refuse(what: str, why: str) -> None:
    raise ValidationError(f"ShardwiseTrainer: {what} is not supported: {why}")


def _refuse_unsupported(cls, args, kwargs: dict) -> None:
    """What the engine cannot do as transformers.Trainer does, named before anything starts."""
    if args is not None:
        if args.fp16 or args.bf16 or args.fp16_full_eval or args.bf16_full_eval:
            _refuse("fp16 / bf16 (accelerate's autocast)", "the engine runs the captured program in the model's "
                    "dtypes; for bf16 compute on float32 master weights pass parallelize_kwargs={'mixed_precision': "
                    "torch.distributed.fsdp.MixedPrecisionPolicy(param_dtype=torch.bfloat16)}")
        if args.deepspeed:
            _refuse("deepspeed", "shardwise's plan distributes the model; DeepSpeed would too")
        if args.fsdp:
            _refuse(f"fsdp={args.fsdp!r}", "shardwise's plan shards the model (and its optimizer states: ZeRO)")
        if getattr(args, "parallelism_config", None) is not None:
            _refuse("parallelism_config", "shardwise's plan chooses the data, tensor and pipeline degrees")
        if args.torch_compile:
            _refuse("torch_compile", "the engine runs its own lowered program, which torch.compile would not see")
        if getattr(args, "activation_checkpointing", False) or getattr(args, "gradient_checkpointing", False):
            _refuse("activation (gradient) checkpointing", "the plan's recomputation does it (Plan.manual(..., "
                    "recompute=True), or the search's)")
        if getattr(args, "neftune_noise_alpha", None) is not None:
            _refuse("neftune_noise_alpha", "its noise hook is not part of the captured program")
        if getattr(args, "use_liger_kernel", False):
            _refuse("use_liger_kernel", "Liger's kernels are not ops shardwise can capture and shard")
        if args.label_smoothing_factor != 0:
            _refuse("label_smoothing_factor", "the engine trains the model's own loss")
        if args.auto_find_batch_size:
            _refuse("auto_find_batch_size", "the engine is planned for the batch it was built with; set "
                    "per_device_train_batch_size (the global batch) instead")
        if _value(getattr(args, "train_sampling_strategy", None)) == "batch_rebalance":
            _refuse("train_sampling_strategy='batch_rebalance'", "it hands each rank a batch of its own; every rank "
                    "of a shardwise job takes the whole batch")
        if kwargs.get("optimizer_cls_and_kwargs") is None and _value(args.optim) not in _ELEMENTWISE_OPTIMS:
            _refuse(f"optim={_value(args.optim)!r}", "a shard is stepped exactly only by an elementwise optimizer "
                    f"({', '.join(_ELEMENTWISE_OPTIMS)}; or optimizer_cls_and_kwargs=(cls, kwargs) of one)")
    if kwargs.get("model_init") is not None:
        _refuse("model_init", "the engine is built once, for the model given (model=...)")
    if kwargs.get("compute_loss_func") is not None:
        _refuse("compute_loss_func", "the engine trains the model's own loss (the model given its labels)")
    if kwargs.get("compute_metrics") is not None or kwargs.get("preprocess_logits_for_metrics") is not None:
        _refuse("compute_metrics / preprocess_logits_for_metrics", "they need the model's outputs, and the engine "
                "returns the loss only (the eval loss is computed)")
    optimizers = kwargs.get("optimizers")
    if optimizers is not None and any(o is not None for o in optimizers):
        _refuse("optimizers=(optimizer, scheduler)", "an optimizer built over the model's tensors does not step the "
                "engine's shards; pass optimizer_cls_and_kwargs=(cls, kwargs) or args.optim, and "
                "args.lr_scheduler_type")
    if cls.compute_loss is not ShardwiseTrainer.compute_loss:
        _refuse(f"{cls.__name__}.compute_loss", "the engine trains the model's own loss")


def _refuse_after_init(trainer: ShardwiseTrainer) -> None:
    if trainer.args.n_gpu > 1:
        _refuse(f"one process over {trainer.args.n_gpu} GPUs (torch.nn.DataParallel)", "launch one process per "
                f"device: torchrun --nproc-per-node {trainer.args.n_gpu} ...")
    if trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled:
        _refuse("DeepSpeed / FSDP (from the accelerate config)", "shardwise's plan distributes the model")
    if dist.is_available() and dist.is_initialized():
        wanted = backend_for(local_device())
        if wanted == "gloo" and "nccl" in str(dist.get_backend()):
            raise ValidationError("ShardwiseTrainer: the process group runs NCCL, but the ranks on this machine share "
                                  "its GPUs (NCCL refuses two ranks on one GPU): pass TrainingArguments(ddp_backend="
                                  "'gloo')")


# ---- helpers ----------------------------------------------------------------------------------------
def _join_the_job(args) -> None:
    """Under torchrun, the Trainer's arguments must see the job (rank 0 logs and writes the
    files; every rank writes its shards of a checkpoint). On CPUs accelerate takes each process
    for a job of its own unless ``use_cpu=True``: then the arguments are set so (the device was
    the CPU anyway) and their device set up again, which starts the process group (Gloo)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or args.world_size == world:
        return
    if local_device().type != "cpu":
        raise ValidationError(f"ShardwiseTrainer: the job has {world} processes (WORLD_SIZE), but the "
                              f"TrainingArguments see {args.world_size}; launch with torchrun and build the "
                              "TrainingArguments in every process")
    args.use_cpu = True
    if not args.ddp_backend:
        args.ddp_backend = backend_for("cpu")
    args.__dict__.pop("_setup_devices", None)  # a cached_property: set up again, as a job of `world` CPUs
    args._setup_devices  # noqa: B018 - the property's side effect is the point
    log.info("ShardwiseTrainer: TrainingArguments set to use_cpu=True, ddp_backend=%r (a job of %d CPU processes)",
             args.ddp_backend, args.world_size)
    if args.world_size != world:
        raise ValidationError(f"ShardwiseTrainer: the job has {world} processes (WORLD_SIZE), the TrainingArguments "
                              f"see {args.world_size} after use_cpu=True")


def _value(option) -> str:
    """A TrainingArguments enum option (or its string) as its string value."""
    return str(getattr(option, "value", option))


def _whole(tensor, *args, **kwargs):
    """accelerate's gather / gather_for_metrics / pad_across_processes where every rank holds the
    whole batch: the input itself."""
    return tensor


def _one_process_data_loaders(accelerator):
    """``Accelerator.prepare_data_loader`` for one process: the sampler accelerate would seed,
    and no sharding by rank (every rank loads the whole batch)."""
    from accelerate.data_loader import prepare_data_loader

    supported = inspect.signature(prepare_data_loader).parameters

    def prepare_one_process(data_loader, device_placement=None, slice_fn_for_dispatch=None):
        if getattr(data_loader, "_is_accelerate_prepared", False):
            if data_loader not in accelerator._dataloaders:
                accelerator._dataloaders.append(data_loader)
            return data_loader
        if device_placement is None:
            device_placement = accelerator.device_placement
        options = {"num_processes": 1, "process_index": 0, "split_batches": False, "put_on_device": device_placement,
                   "rng_types": list(accelerator.rng_types), "dispatch_batches": False,
                   "even_batches": getattr(accelerator, "even_batches", True),
                   "use_seedable_sampler": getattr(accelerator, "use_seedable_sampler", False),
                   "data_seed": getattr(getattr(accelerator, "dataloader_config", None), "data_seed", None),
                   "non_blocking": getattr(accelerator, "non_blocking", False),
                   "use_stateful_dataloader": getattr(accelerator, "use_stateful_dataloader", False)}
        prepared = prepare_data_loader(data_loader, accelerator.device,
                                       **{k: v for k, v in options.items() if k in supported})
        accelerator._dataloaders.append(prepared)
        return prepared

    return prepare_one_process


def _ensure_process_group() -> None:
    """The engine needs torch.distributed: under torchrun the Trainer's arguments started it;
    a plain process gets a job of one."""
    if dist.is_initialized():
        return
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group(backend_for(local_device()))
    else:
        dist.init_process_group(backend_for(local_device()), store=dist.HashStore(), rank=0, world_size=1)


@contextlib.contextmanager
def _random_state_kept():
    """Python's, numpy's and torch's random states (CPU and this rank's GPU) as they were."""
    import numpy as np

    python, numpy_state = random.getstate(), np.random.get_state()
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            random.setstate(python)
            np.random.set_state(numpy_state)


def _safe_globals():
    """transformers' allowlist for torch.load of its random-state files (numpy's state)."""
    try:
        from transformers.trainer_pt_utils import safe_globals
    except ImportError:  # pragma: no cover - older transformers
        return contextlib.nullcontext()
    return safe_globals()


def _set_random_state(state: dict[str, Any]) -> None:
    import numpy as np

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.random.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if isinstance(cuda, (list, tuple)):  # a distributed run saved every device's
            cuda = cuda[min(torch.cuda.current_device(), len(cuda) - 1)]
        torch.cuda.set_rng_state(cuda)

