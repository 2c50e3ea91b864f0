import time

import pytest

import shardwise


def test_manual_plan_on_tiny_gpt_round_trips():
    g = shardwise.models.gpt(layers=4, hidden=64, heads=4, seq=16, vocab=128)
    c = shardwise.Cluster.preset("dgx-a100", nodes=1)
    p = shardwise.Plan.manual(g, c, tensor=2, pipeline=2, data=2, global_batch=8, micro_batch=1)
    assert p.predicted_step_time() > 0
    assert p.predicted_tflops_per_device() > 0
    mem, parts = p.predicted_memory()
    assert mem > 0 and {"weights", "gradients", "optimizer", "activations"} <= set(parts)
    assert p.breakdown()["pipeline_bubble"] > 0
    back = shardwise.Plan.from_json(p.to_json())
    assert back == p and back.hash() == p.hash() and len(p.hash()) == 16
    with pytest.raises(shardwise.ValidationError, match="not divisible"):
        shardwise.Plan.manual(g, c, tensor=2, pipeline=2, data=2, global_batch=7)


def test_costing_175b_takes_under_a_second():
    start = time.perf_counter()
    g = shardwise.models.gpt(layers=96, hidden=12288, heads=96, seq=2048, vocab=51200)
    c = shardwise.Cluster.preset("dgx-a100", nodes=192)
    p = shardwise.Plan.manual(g, c, tensor=8, pipeline=8, data=24, global_batch=1536, micro_batch=1,
                              schedule="interleaved-1f1b", virtual_stages=2, recompute=True)
    elapsed = time.perf_counter() - start
    print(f"175B plan built and costed in {elapsed * 1e3:.0f} ms; {p.predicted_tflops_per_device():.1f} TFLOP/s")
    assert elapsed < 1.0
