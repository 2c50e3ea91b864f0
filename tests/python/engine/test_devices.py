"""Tensors follow the model's device: the CPU side of the CUDA path (issue 22).

The CUDA runs themselves are tests/python/engine/test_gpu.py (``pytest -m gpu``); these run everywhere:
 - every tensor-creating call of the package names its device (a scan of the source: a
   factory without ``device=`` makes a CPU tensor beside a CUDA model, which fails only on a GPU);
 - ``local_device`` / ``backend_for``: LOCAL_RANK picks the GPU, ranks outnumbering GPUs share them over Gloo;
 - ``transport.on_host``: which calls are staged through host memory.
"""
from __future__ import annotations

import ast
import pathlib

import pytest
import torch

import shardwise
from shardwise.runtime import transport

PACKAGE = pathlib.Path(shardwise.__file__).parent
# torch functions that make a new tensor on the default device unless told otherwise.
# (*_like and Tensor.new_* take their operand's device.)
FACTORIES = {"tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange", "linspace", "logspace", "eye",
             "rand", "randn", "randint", "randperm", "empty_strided", "scalar_tensor", "tril_indices",
             "triu_indices"}


def _factory_calls_without_device(source: str) -> list[tuple[int, str]]:
    """(line, function) of each ``torch.<factory>(...)`` call in `source` with no ``device=``
    (a ``**kwargs`` call may carry one, so it passes)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in FACTORIES
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
                and not any(k.arg == "device" or k.arg is None for k in node.keywords)):
            found.append((node.lineno, node.func.attr))
    return found


def test_every_tensor_the_package_creates_names_its_device():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 20 and any(f.parent.name == "runtime" for f in files), files  # the scan sees the package
    missing = [f"{f.relative_to(PACKAGE.parent)}:{line}: torch.{name}(...) without device="
               for f in files for line, name in _factory_calls_without_device(f.read_text())]
    assert not missing, "\n".join(missing)


def test_the_scan_finds_a_factory_without_device():
    probe = "import torch\nx = torch.zeros(3)\ny = torch.ones(2, device=d)\nz = torch.empty(1, **kw)\nw = x.new_zeros(2)\n"
    assert _factory_calls_without_device(probe) == [(2, "zeros")]


def test_local_device_follows_local_rank_modulo_the_gpus(monkeypatch):
    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: chosen.append(index))
    for local_rank, expected in [("0", 0), ("1", 1), ("3", 1)]:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
        assert shardwise.local_device() == torch.device("cuda", expected)
    assert chosen == [0, 1, 1]  # made current, so torch's default CUDA device is this rank's


def test_local_device_is_the_cpu_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert shardwise.local_device() == torch.device("cpu")


def test_backend_for_shares_gpus_over_gloo_and_gives_each_its_own_to_nccl(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert shardwise.backend_for("cuda:1") == "nccl"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # 4 ranks on 2 GPUs: NCCL refuses two ranks on one
    assert shardwise.backend_for("cuda:1") == "gloo"
    assert shardwise.backend_for("cpu") == "gloo"


@pytest.mark.parametrize("backend,device,staged", [
    ("gloo", "cpu", False), ("gloo", "meta", False), ("gloo", "cuda", True), ("nccl", "cuda", False),
    ("cpu:gloo,cuda:nccl", "cuda", False), ("cpu:gloo,cuda:gloo", "cuda", True), ("cpu:gloo,cuda:nccl", "cpu", False),
])
def test_on_host_stages_gloo_calls_on_tensors_off_the_cpu(monkeypatch, backend, device, staged):
    monkeypatch.setattr(transport.dist, "get_backend", lambda group=None: backend)

    class Fake:  # a tensor's device without allocating on it (no CUDA here)
        def __init__(self, kind):
            self.device = torch.device(kind)

    assert transport.on_host(Fake(device)) is staged
