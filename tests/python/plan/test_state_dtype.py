"""A plan prices the model states its run holds (plan.state_dtype, csrc/cost/memory_cost.h).

torch.optim steps a model's own parameters: a bf16 model's Adam moments are bf16, 2 + 2 + 4
bytes a parameter with its weight and gradient, where Megatron-LM's mixed precision (fp32
master weights and moments, the convention a plan without state_dtype is priced by) holds
2 + 2 + 12. An H200 measured it (benchmarks/README.md, gpu.py): GPT-2 124M's moments 474.7
MiB, Llama 3.2 1B's shape 4,714 MiB, where the plans predicted 1,424 and 14,143. parallelize
now names the dtype its optimizer steps in, and the prediction is what the optimizer holds."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import shardwise
from conftest import spawn_scenario


class _Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 64)
        self.out = nn.Linear(64, 8)

    def forward(self, x):
        return self.out(torch.tanh(self.fc(x)))


def _held_moments(optimizer) -> int:
    """Bytes of the optimizer's per-element state (Adam's moments; not its 0-dim step counts)."""
    return sum(v.numel() * v.element_size() for state in optimizer.state.values() for v in state.values()
               if torch.is_tensor(v) and v.dim() > 0)


def _scenario_states(rank: int, world: int, dtype: str, policy: bool) -> dict:
    torch.manual_seed(0)
    model = _Mlp()
    if not policy:
        model = model.to(getattr(torch, dtype))
    compute = torch.bfloat16 if policy or dtype == "bfloat16" else model.fc.weight.dtype
    x, y = torch.randn(16, 32, dtype=compute), torch.randn(16, 8, dtype=compute)
    engine = shardwise.parallelize(model, (x, y), loss_fn=nn.functional.mse_loss, verify=False,
                                   mixed_precision={"param_dtype": torch.bfloat16} if policy else None)
    optimizer = engine.optimizer(torch.optim.AdamW, lr=1e-3)
    engine.train_step(x, y)
    optimizer.step()
    _, parts = engine.plan.predicted_memory()
    return {"state_dtype": engine.plan.state_dtype, "predicted": parts["optimizer"],
            "weights": parts["weights"], "held": _held_moments(optimizer),
            "parameters": sum(p.numel() for p in model.parameters())}


@pytest.mark.parametrize("dtype, policy, named, moment_bytes", [
    ("bfloat16", False, "bf16", 4),   # a bf16 model: moments in bf16, no master copy
    ("float32", True, "f32", 8),      # a float32 model under a bf16 policy: the model's weights are the masters
    ("float32", False, "f32", 8),     # plain float32
])
def test_a_searched_plan_prices_the_optimizer_state_its_run_holds(dtype, policy, named, moment_bytes):
    out = spawn_scenario(__name__, 1, "states", dtype, policy)
    assert out["state_dtype"] == named
    assert out["held"] == out["parameters"] * moment_bytes
    assert out["predicted"] == pytest.approx(out["held"], rel=1e-12)


def test_a_plan_without_state_dtype_keeps_the_mixed_precision_convention():
    with torch.device("meta"):
        model = _Mlp().to(torch.bfloat16)
    graph = shardwise.capture(model, (torch.zeros(4, 32, device="meta", dtype=torch.bfloat16),))
    cluster = shardwise.Cluster.preset("dgx-h100")
    params = sum(p.numel() for p in model.parameters())
    mixed = shardwise.Plan.manual(graph, cluster, data=8, global_batch=8, micro_batch=1, recompute=False)
    own = shardwise.Plan.manual(graph, cluster, data=8, global_batch=8, micro_batch=1, recompute=False,
                                state_dtype="bf16")
    assert mixed.state_dtype is None and own.state_dtype == "bf16"
    assert mixed.predicted_memory()[1]["optimizer"] == pytest.approx(12 * params)
    assert own.predicted_memory()[1]["optimizer"] == pytest.approx(4 * params)
    assert own.hash() != mixed.hash()
    assert shardwise.Plan.from_json(own.to_json()).state_dtype == "bf16"
    with pytest.raises(shardwise.ValidationError, match="state_dtype"):
        shardwise.Plan.manual(graph, cluster, data=8, global_batch=8, micro_batch=1, state_dtype="fp8")
