"""Logging: Python's `logging` under "shardwise"; the C++ core's lines under "shardwise.core";
each line prefixed with the rank in a job of several processes; progress reaches 100%."""
import logging

import shardwise
from shardwise._logging import get_logger


def test_the_core_logs_what_the_search_chose_under_shardwise_core(caplog):
    graph = shardwise.models.gpt(layers=2, hidden=1024, heads=16, seq=512, vocab=50304, batch=2)
    with caplog.at_level(logging.INFO, logger="shardwise"):
        shardwise.plan(graph, shardwise.Cluster.preset("dgx-a100"), global_batch=16, level="fast")
        shardwise.plan(graph, shardwise.Cluster.preset("dgx-a100", nodes=2), global_batch=64, pipeline=True)
    core = [r.getMessage() for r in caplog.records if r.name == "shardwise.core"]
    assert any(m.startswith("spmd search (fast):") and "chose mesh" in m for m in core), core
    assert any(m.startswith("joint planner (fast):") and "chose t" in m for m in core), core


def test_lines_carry_the_rank_under_torchrun(caplog, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    with caplog.at_level(logging.INFO, logger="shardwise"):
        get_logger("shardwise.engine").info("rewrote %d nodes", 7)
    assert caplog.records[-1].getMessage() == "[rank 3] rewrote 7 nodes"
    monkeypatch.setenv("WORLD_SIZE", "1")
    with caplog.at_level(logging.INFO, logger="shardwise"):
        get_logger("shardwise.engine").info("alone")
    assert caplog.records[-1].getMessage() == "alone"


def test_search_progress_ends_at_its_total():
    graph = shardwise.models.gpt(layers=2, hidden=1024, heads=16, seq=512, vocab=50304, batch=2)
    for pipeline in (False, True):
        calls = []
        shardwise.plan(graph, shardwise.Cluster.preset("dgx-a100", nodes=2), global_batch=64, pipeline=pipeline,
                       progress=lambda done, total: calls.append((done, total)))
        assert calls and calls[-1][0] == calls[-1][1], (pipeline, calls)
