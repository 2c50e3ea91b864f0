"""This rank's device under torchrun.

``LOCAL_RANK`` (set by torchrun) picks the CUDA device: ``cuda:<LOCAL_RANK mod the visible
GPUs>``, made the current device, so that ranks outnumbering the GPUs share them (over Gloo:
NCCL refuses two ranks on one GPU). Without CUDA it is the CPU.

    device = shardwise.local_device()
    dist.init_process_group(shardwise.backend_for(device))   # nccl, or gloo
    model = build().to(device)
"""
from __future__ import annotations

import os

import torch


def local_device() -> torch.device:
    """``cuda:<LOCAL_RANK mod GPUs>`` (made current) where CUDA is available, else the CPU."""
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return torch.device("cpu")
    index = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def backend_for(device: "torch.device | str") -> str:
    """The process-group backend for ranks on `device`: NCCL when every local rank has a GPU of
    its own, else Gloo (the CPU, or ranks sharing a GPU)."""
    device = torch.device(device)
    if device.type != "cuda":
        return "gloo"
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return "nccl" if local_ranks <= torch.cuda.device_count() else "gloo"
