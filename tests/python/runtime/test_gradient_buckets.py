"""Data parallelism's gradient buckets (runtime/buckets.py) on one Gloo process."""
from __future__ import annotations

import gc
import weakref

import torch
import torch.distributed as dist

from shardwise.runtime.buckets import _GradientBuckets


def test_buckets_hold_no_gradient_and_no_flat_copy_once_a_step_is_done(tmp_path):
    # DDP frees its buckets' views with the gradients: after optimizer.zero_grad() a step's
    # gradients are gone. The buckets used to keep every flat buffer and every gradient they
    # reduced until the next step began: a copy of the gradients, and the gradients, held
    # between steps (what benchmarks/fidelity.py measures as memory held).
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        params = [torch.nn.Parameter(torch.ones(64, 64)) for _ in range(3)]
        buckets = _GradientBuckets([(p, (0,)) for p in params], [dist.group.WORLD], overlap=False)
        buckets.start()
        for i, p in enumerate(params):
            p.grad = torch.full_like(p, float(i))
        buckets.finish()
        assert [float(p.grad[0, 0]) for p in params] == [0.0, 1.0, 2.0]  # reduced over one rank
        held = [weakref.ref(p.grad) for p in params]
        for p in params:
            p.grad = None  # zero_grad(set_to_none=True)
        gc.collect()
        assert [ref() for ref in held] == [None, None, None]
    finally:
        dist.destroy_process_group()
