"""Peak tensor memory of a CPU process, the analogue of torch.cuda.max_memory_allocated.

A process's resident set also holds the interpreter's heap, the captured graphs and what
malloc keeps after a free; none of it is what a plan decides, and on a GPU none of it would be
on the device. What a plan decides is the bytes of the tensors alive at once:

    peak = live   the CPU tensors reachable from Python when the window opens (parameters,
                  optimizer state, the runtime's persistent buffers), less those in `exclude`
                  (what existed before the engine: the user's own module)
         + grown  the largest running sum of the CPU allocator's allocations and frees inside
                  the window (torch.profiler's memory events: activations, gradients,
                  communication buffers, the optimizer's temporaries)

Frees of tensors allocated before the window are not reported by the allocator, so open the
window when nothing transient is alive (between steps, after zero_grad).
"""
from __future__ import annotations

import gc
import warnings

import torch


def live_storages() -> dict[int, int]:
    """{data pointer: bytes} of the storages of the CPU tensors Python can reach."""
    gc.collect()
    out: dict[int, int] = {}
    with warnings.catch_warnings():  # isinstance on deprecated module attributes warns
        warnings.simplefilter("ignore")
        objects = gc.get_objects()
        tensors = [o for o in objects if isinstance(o, torch.Tensor)]
    del objects
    for obj in tensors:
        try:
            if obj.device.type != "cpu" or obj.is_meta:
                continue
            storage = obj.untyped_storage()
            pointer = storage.data_ptr()
        except (RuntimeError, NotImplementedError):  # no real storage: fake, functional, sparse tensors
            continue
        if pointer:
            out[pointer] = storage.nbytes()
    return out


class PeakTensorBytes:
    """with PeakTensorBytes(exclude=before) as m: <one step>;  then m.peak = m.live + m.grown."""

    def __init__(self, exclude: dict[int, int] | None = None):
        self.exclude = exclude or {}
        self.live = self.grown = 0

    @property
    def peak(self) -> int:
        return self.live + self.grown

    def __enter__(self) -> "PeakTensorBytes":
        from torch.profiler import ProfilerActivity, profile

        self.live = sum(n for ptr, n in live_storages().items() if ptr not in self.exclude)
        self._profile = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._profile.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._profile.__exit__(*exc)
        events = sorted((e.start_ns(), e.nbytes()) for e in self._profile.profiler.kineto_results.events()
                        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU)
        running = 0
        for _, nbytes in events:
            running += nbytes
            self.grown = max(self.grown, running)
