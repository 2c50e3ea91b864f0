"""shardwise.Cluster: presets, JSON, validation, detection, and the collective cost
model seen from Python (the numbers themselves are tested in tests/cpp/cost)."""
from __future__ import annotations

import json

import pytest

import shardwise
from shardwise import Cluster
from shardwise import cluster as cluster_module

# One node of 4 devices on a 1 GB/s, 1 us bus: the 1-level cluster of the C++ tests
# (tests/cpp/cost/test_clusters.h, flat_cluster(4)).
FLAT = {
    "name": "flat",
    "device_types": [{"name": "dev", "peak_flops": {"f32": 1e12, "tf32": 2e12, "bf16": 4e12, "f16": 4e12},
                      "memory_bytes": 16 << 30, "memory_bandwidth": 1e12}],
    "nodes": [{"device": "dev", "count": 4}],
    "links": [{"name": "bus", "bandwidth": 1e9, "latency": 1e-6}],
}


@pytest.mark.parametrize("name", Cluster.preset_names())
def test_every_preset_loads_and_round_trips(name):
    c = Cluster.preset(name, nodes=2)
    assert c.world_size == len(c.devices) >= 2
    assert Cluster.from_json(c.to_json()) == c
    assert Cluster.from_json(c.to_json(indent=2)) == c


def test_preset_numbers():
    c = Cluster.preset("dgx-a100", nodes=2)
    assert c.world_size == 16 and c.num_nodes == 2 and not c.heterogeneous
    assert c.devices == ["a100-sxm4-80gb"] * 16
    assert c.node_of(9) == 1 and c.local_rank(9) == 1
    a100 = c.device_of(0)
    assert a100["peak_flops"] == {"f32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "f16": 312e12}
    assert a100["memory_bytes"] == 80 << 30
    assert c.span_of([0, 8]) == {"level": 1, "link": "infiniband", "nodes": 2, "devices_per_node": 1,
                                 "uniform": True}

    mixed = Cluster.preset("mixed-a100-v100")  # nodes=1: 4 x A100 + 4 x V100 in one PCIe machine
    assert mixed.devices == ["a100-pcie-80gb"] * 4 + ["v100-pcie-32gb"] * 4
    assert mixed.heterogeneous and mixed.num_nodes == 1

    assert Cluster.preset("cpu", nodes=4).devices == ["cpu"] * 4


def test_first_ranks_is_a_pipeline_stages_sub_mesh():
    job = Cluster.preset("dgx-a100", nodes=4)
    stage = job.first_ranks(16)  # 2 of the 4 nodes
    assert stage.world_size == 16 and stage.num_nodes == 2
    assert stage.devices == job.devices[:16]
    assert job.first_ranks(4).num_nodes == 1 and job.first_ranks(32) == job
    with pytest.raises(shardwise.ValidationError, match="33 ranks of a cluster of 32"):
        job.first_ranks(33)


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(shardwise.ValidationError, match=r"unknown cluster preset 'dgx-a200' \(known: cpu, dgx-a100"):
        Cluster.preset("dgx-a200")
    with pytest.raises(shardwise.ValidationError, match="needs at least 1 node"):
        Cluster.preset("dgx-h100", nodes=0)


def test_json_round_trip_through_text_and_files(tmp_path):
    c = Cluster.from_json(json.dumps(FLAT))
    assert c.name == "flat" and c.world_size == 4
    text = c.to_json()
    assert json.loads(text)["format"] == "shardwise.cluster"
    assert Cluster.from_json(text) == c
    assert hash(Cluster.from_json(text)) == hash(c)
    path = tmp_path / "cluster.json"
    c.save(path)
    assert Cluster.from_json(path) == c       # a Path
    assert Cluster.from_json(str(path)) == c  # a str that is not JSON text
    assert c != Cluster.preset("cpu", nodes=4)
    assert c != "flat"


def test_validation_errors_name_the_json_path():
    doc = json.loads(Cluster.preset("dgx-a100", nodes=2).to_json())
    doc["nodes"].append({"device": "A200", "count": 8})
    with pytest.raises(shardwise.ValidationError, match=r"^nodes\[2\]\.device: unknown device type 'A200'"):
        Cluster.from_json(json.dumps(doc))

    doc = json.loads(json.dumps(FLAT))
    doc["links"][0]["bandwidth"] = 0
    with pytest.raises(shardwise.ValidationError, match=r"^links\[0\]\.bandwidth: .* got 0"):
        Cluster.from_json(json.dumps(doc))

    doc = json.loads(json.dumps(FLAT))
    del doc["device_types"][0]["memory_bytes"]
    with pytest.raises(shardwise.ParseError, match=r'^device_types\[0\]: missing "memory_bytes"'):
        Cluster.from_json(json.dumps(doc))

    with pytest.raises(shardwise.ParseError, match="invalid cluster JSON"):
        Cluster.from_json("{not json")


def test_collective_time_matches_the_cpp_numbers():
    c = Cluster.from_json(json.dumps(FLAT))
    # Same cases as tests/cpp/cost/collective_cost_test.cc (OneLevelRing), B = 1e9 bytes:
    #   all-reduce 2*3/4 * 1 s + 6 us; all-gather 3/4 s + 3 us; send/recv 1 s + 1 us.
    assert c.collective_time("all_reduce", [0, 1, 2, 3], 10**9) == pytest.approx(1.500006, rel=1e-12)
    assert c.collective_time("all_gather", range(4), 10**9) == pytest.approx(0.750003, rel=1e-12)
    assert c.collective_time("send_recv", [0, 3], 10**9) == pytest.approx(1.000001, rel=1e-12)
    assert c.collective_time("all_reduce", [2], 10**9) == 0.0

    # The header's worked example: two DGX A100 nodes, 1 GiB all-reduce over all 16 ranks.
    dgx = Cluster.preset("dgx-a100", nodes=2)
    b = float(1 << 30)
    ring = 2 * 15 / 16 * b / 25e9 + 30 * 7e-6
    hierarchical = 2 * (7 / 8 * b / 300e9 + 7 * 3e-6) + (b / 8 / 25e9 + 2 * 7e-6)
    assert dgx.collective_time("all_reduce", range(16), 1 << 30, algorithm="ring") == pytest.approx(ring)
    seconds, algorithm = dgx.collective_estimate("all_reduce", range(16), 1 << 30)
    assert algorithm == "hierarchical" and seconds == pytest.approx(hierarchical)
    assert dgx.collective_time("all_reduce", range(16), 1 << 30) == pytest.approx(hierarchical)


def test_collective_errors():
    c = Cluster.from_json(json.dumps(FLAT))
    with pytest.raises(shardwise.ValidationError, match="unknown collective 'allreduce'"):
        c.collective_time("allreduce", [0, 1], 8)
    with pytest.raises(shardwise.ValidationError, match="unknown collective algorithm 'tree'"):
        c.collective_time("all_reduce", [0, 1], 8, algorithm="tree")
    with pytest.raises(shardwise.ValidationError, match="rank 4 is out of range"):
        c.collective_time("all_reduce", [0, 4], 8)
    with pytest.raises(shardwise.ValidationError, match="appears more than once"):
        c.collective_time("all_reduce", [1, 1], 8)


def test_repr_is_readable():
    text = repr(Cluster.preset("dgx-h100", nodes=2))
    assert text == ("<Cluster dgx-h100 x2: 16 ranks on 2 nodes: 2 x [8 h100-sxm5-80gb]; "
                    "links nvswitch 450 GB/s 3 us < infiniband 50 GB/s 7 us>")


def test_detect_without_torch_distributed(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    c = Cluster.detect()
    assert c.world_size == 1 and c.devices == ["cpu"]
    cpu = c.device_of(0)
    assert cpu["memory_bytes"] > 0 and cpu["peak_flops"]["f32"] > 0
    assert Cluster.from_json(c.to_json()) == c


def test_detect_under_torchrun(monkeypatch):
    # What torchrun sets up for 2 machines x 2 processes, without starting any.
    import torch.distributed as dist

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 4)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    c = Cluster.detect()
    assert c.world_size == 4 and c.num_nodes == 2
    assert [c.node_of(r) for r in range(4)] == [0, 0, 1, 1]
    assert c.span_of([0, 2])["link"] == "ethernet"
    assert c.span_of([0, 1])["link"] == "loopback"


@pytest.mark.parametrize("torch_name, expected", [
    ("NVIDIA A100-SXM4-80GB", ("a100-sxm4-80gb", "dgx-a100")),
    ("NVIDIA A100 80GB PCIe", ("a100-pcie-80gb", None)),
    ("NVIDIA H100 80GB HBM3", ("h100-sxm5-80gb", "dgx-h100")),
    ("Tesla V100-SXM2-32GB", ("v100-sxm2-32gb", "v100")),
    ("Tesla V100-PCIE-32GB", ("v100-pcie-32gb", None)),
    ("NVIDIA H100 PCIe", None),
    ("NVIDIA GeForce RTX 4090", None),
])
def test_gpu_names_map_to_the_catalogue(torch_name, expected):
    assert cluster_module._match_gpu(torch_name) == expected
