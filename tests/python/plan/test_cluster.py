"""shardwise.Cluster: presets, JSON, validation, detection, and the collective cost
model seen from Python (the numbers themselves are tested in tests/cpp/cost)."""
from __future__ import annotations

import json

import pytest
import torch

import shardwise
from shardwise import Cluster, _C
from shardwise import cluster as cluster_module

from conftest import run_ranks

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


def test_detect_measures_a_cpu_when_asked(monkeypatch):
    # The timed GEMMs and copy of the CUDA path, on the CPU: one process here, so its figures.
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    timed = []
    real = cluster_module._time_square_gemm

    def time_square_gemm(n, precision, device):
        timed.append((n, precision, device.type))
        return real(n, precision, device)

    monkeypatch.setattr(cluster_module, "_time_square_gemm", time_square_gemm)
    c = Cluster.detect(measure_compute=True)
    # fp8: torch._scaled_mm with rowwise scales, the product an fp8 plan's linears run. Each
    # precision timed at 256 and at each doubling up to 1024 while a run stays short
    # (_time_cpu_gemm; f16 on a CPU without half-precision units stops early).
    assert {p for _, p, _ in timed} == {"f32", "tf32", "bf16", "f16", "fp8"}
    for p in ("f32", "tf32", "bf16", "f16", "fp8"):
        sizes = [n for n, q, where in timed if q == p and where == "cpu"]
        assert sizes == [256 * 2 ** k for k in range(len(sizes))] and sizes[-1] <= cluster_module.CPU_GEMM_SIZE, timed
    cpu = c.device_of(0)
    assert all(v > 0 for v in cpu["peak_flops"].values()) and cpu["memory_bandwidth"] > 0
    assert cpu["peak_flops"] != Cluster.detect().device_of(0)["peak_flops"]  # not the estimates
    assert "measured: memory_bandwidth, peak_flops;" in c.name, c.name
    assert Cluster.from_json(c.to_json()) == c


def test_a_cpu_gemm_is_timed_at_the_largest_size_whose_run_stays_short(monkeypatch):
    # f16 through a CPU's slow path: a 512 x 512 product in 0.09 s predicts 0.72 s at 1024, past
    # _CPU_GEMM_RUN_SECONDS; f32 reaches 1024. The peak is the one of the size last timed.
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    per_cube = {"f32": 0.02 / 1024 ** 3, "f16": 0.09 / 512 ** 3}
    timed = []

    def time_square_gemm(n, precision, device):
        timed.append((n, precision))
        return per_cube[precision] * n ** 3

    monkeypatch.setattr(cluster_module, "_time_square_gemm", time_square_gemm)
    assert cluster_module._time_cpu_gemm("f32", torch.device("cpu")) == (1024, pytest.approx(0.02))
    assert cluster_module._time_cpu_gemm("f16", torch.device("cpu")) == (512, pytest.approx(0.09))
    assert timed == [(256, "f32"), (512, "f32"), (1024, "f32"), (256, "f16"), (512, "f16")]
    peaks = cluster_module._measure_peak_flops(torch.device("cpu"), ["f32", "f16"])
    assert peaks["f16"] == pytest.approx(shardwise._C.peak_for_measured_gemm(2 * 512 ** 3 / 0.09, 512))
    assert peaks["f32"] == pytest.approx(shardwise._C.peak_for_measured_gemm(2 * 1024 ** 3 / 0.02, 1024))


@pytest.mark.parametrize("cores, processes, threads, alone", [
    (2, 4, 1, 2.0),    # the fidelity benchmark here: half a core each, one whole core alone
    (2, 4, 2, 4.0),    # torch's default threads: both cores alone
    (64, 8, 8, 1.0),   # eight cores each: nothing to gain alone
    (2, 1, 2, 1.0),    # one process has the machine
])
def test_detect_says_how_much_faster_a_cpu_rank_computes_alone(monkeypatch, cores, processes, threads, alone):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr(cluster_module, "_machine_cores", lambda: cores)
    monkeypatch.setattr(cluster_module, "_world_and_local_sizes", lambda: (processes, processes))
    monkeypatch.setattr("torch.get_num_threads", lambda: threads)
    doc = json.loads(Cluster.detect().to_json())
    assert doc["nodes"][0].get("compute_alone", 1.0) == alone, doc["nodes"]


def test_detect_under_torchrun(monkeypatch):
    # What torchrun sets up for 2 machines x 2 processes, without starting any.
    import torch.distributed as dist

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 4)
    # every rank finds the same device (test_detect_reports_a_mixed_job: not so)
    monkeypatch.setattr(dist, "all_gather_object", lambda out, obj, group=None: out.__setitem__(slice(None), [obj] * len(out)))
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


# ---- detection from measurement ---------------------------------------------------------

class _FakeDeviceProperties:
    def __init__(self, name: str, total_memory: int = 80 << 30, sms: int = 132, major: int = 9):
        self.name, self.total_memory = name, total_memory
        self.multi_processor_count, self.major, self.minor = sms, major, 0


def _fake_cuda(monkeypatch, props: _FakeDeviceProperties, gemm_seconds, free_memory: int = 64 << 30,
               copy_seconds=None) -> list:
    """torch.cuda as a machine with one `props` GPU shows it, without one; GEMM timings from
    `gemm_seconds(n, precision)`. Returns the (n, precision) of every timed GEMM."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free_memory, props.total_memory))
    timed = []

    def time_square_gemm(n, precision, device):
        timed.append((n, precision))
        return gemm_seconds(n, precision)

    monkeypatch.setattr(cluster_module, "_time_square_gemm", time_square_gemm)
    monkeypatch.setattr(cluster_module, "_time_device_copy", copy_seconds or _copy_fails)
    return timed


def _copy_fails(nbytes, device):
    raise RuntimeError("no copy timing in this test")


def test_detect_cuda_takes_peak_flops_from_a_timed_gemm(monkeypatch):
    seconds = {"f32": 2e-2, "tf32": 4e-3, "bf16": 2e-3, "f16": 1.5e-3, "fp8": 1e-3}  # an H100 has FP8 units
    props = _FakeDeviceProperties("NVIDIA H100 80GB HBM3", total_memory=81_000_000_000)
    timed = _fake_cuda(monkeypatch, props, lambda n, precision: seconds[precision])
    c = Cluster.detect()
    n = cluster_module.GEMM_SIZE
    assert sorted(timed) == sorted((n, p) for p in seconds)
    h100 = c.device_of(0)
    # In the cost model's terms: the peak under which it prices that GEMM at the measured time,
    # n / 3 multiply-adds per element at 0.75 x d / (d + 96) of the peak.
    efficiency = 0.75 * (n / 3) / (n / 3 + 96)
    assert h100["peak_flops"] == pytest.approx({p: 2 * n ** 3 / t / efficiency for p, t in seconds.items()})
    # Not measured: capacity from the device, bandwidth and links from the catalogue's H100 / DGX H100.
    assert h100["memory_bytes"] == 81_000_000_000
    assert h100["memory_bandwidth"] == cluster_module._catalogue("h100-sxm5-80gb")["memory_bandwidth"]
    assert json.loads(c.to_json())["links"] == cluster_module._preset_links("dgx-h100")[:1]
    assert c.name == ("detected NVIDIA H100 80GB HBM3 x1 [measured: peak_flops; device: memory_bytes; "
                      "catalogue: memory_bandwidth; preset: links.nvswitch]")
    assert Cluster.from_json(c.to_json()) == c


def test_gemm_size_shrinks_when_free_memory_is_short(monkeypatch):
    props = _FakeDeviceProperties("NVIDIA H100 80GB HBM3")
    timed = _fake_cuda(monkeypatch, props, lambda n, precision: 1e-3, free_memory=3 * 1024 * 1024 * 4 * 4)
    c = Cluster.detect()
    assert {n for n, _ in timed} == {1024}
    assert c.device_of(0)["peak_flops"]["bf16"] == pytest.approx(_C.peak_for_measured_gemm(2 * 1024 ** 3 / 1e-3, 1024))


def test_failed_gemm_timings_fall_back_to_positive_estimates(monkeypatch):
    def flaky(n, precision):
        if precision == "tf32":
            raise RuntimeError("CUDA out of memory")
        return {"f32": 2e-2, "bf16": 2e-3, "f16": 0.0}[precision]  # 0 s: an event that never ran

    _fake_cuda(monkeypatch, _FakeDeviceProperties("NVIDIA A100-SXM4-80GB"), flaky)
    c = Cluster.detect()
    a100, catalogue = c.device_of(0), cluster_module._catalogue("a100-sxm4-80gb")["peak_flops"]
    n = cluster_module.GEMM_SIZE
    assert a100["peak_flops"] == pytest.approx({"f32": _C.peak_for_measured_gemm(2 * n ** 3 / 2e-2, n),
                                                "bf16": _C.peak_for_measured_gemm(2 * n ** 3 / 2e-3, n),
                                                "tf32": catalogue["tf32"], "f16": catalogue["f16"]})
    assert "measured: peak_flops.bf16, peak_flops.f32" in c.name
    assert "catalogue: memory_bandwidth, peak_flops.f16, peak_flops.tf32" in c.name

    # An unknown GPU whose every timing fails: the rough estimate from its properties.
    def broken(n, precision):
        raise RuntimeError("no kernel image is available for execution on the device")

    _fake_cuda(monkeypatch, _FakeDeviceProperties("NVIDIA GeForce RTX 4090", sms=128, major=8), broken)
    c = Cluster.detect()
    flops = c.device_of(0)["peak_flops"]
    assert set(flops) == {"f32", "tf32", "bf16", "f16"} and all(v > 0 for v in flops.values())
    assert "estimated: links.pcie, memory_bandwidth, peak_flops" in c.name


def test_time_square_gemm_is_the_median_of_cuda_event_timings(monkeypatch):
    # The timing code itself, run on the meta device (a CPU device is timed by the wall clock):
    # CUDA events replaced by ones that report 5, 1, 3, 2, 4 ms, and that check TF32 is on
    # exactly while the tf32 GEMM runs.
    import torch

    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    reported = iter([5.0, 1.0, 3.0, 2.0, 4.0])
    precisions_seen = []

    class FakeEvent:
        def __init__(self, enable_timing=False):
            assert enable_timing

        def record(self):
            precisions_seen.append(matmul.fp32_precision)

        def elapsed_time(self, end):
            return next(reported)

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    assert cluster_module._time_square_gemm(64, "tf32", torch.device("meta")) == pytest.approx(3e-3)
    assert set(precisions_seen) == {"tf32"} and matmul.fp32_precision == before

    reported, precisions_seen[:] = iter([1.0] * 5), []
    cluster_module._time_square_gemm(64, "f32", torch.device("meta"))
    assert set(precisions_seen) == {"ieee"} and matmul.fp32_precision == before
    with pytest.raises(ValueError, match="no GEMM for precision 'f8'"):
        cluster_module._time_square_gemm(64, "f8", torch.device("meta"))


def test_link_fit_splits_alpha_into_call_and_latency_within_bounds():
    # Gloo on 2 processes: all-reduce 0.37 ms, all-gather 0.30 ms -> call 0.23 ms, 2 steps of 0.07.
    call, latency = cluster_module._split_alpha(0.37e-3, 0.30e-3, 2.0)
    assert call == pytest.approx(0.23e-3) and latency == pytest.approx(0.07e-3)
    assert cluster_module._split_alpha(0.37e-3, -1.0, 2.0) == (0.0, pytest.approx(0.185e-3))  # no gather
    # Noise seen in CI on busy cores: a gather's intercept above the all-reduce's gave a negative
    # latency that Cluster.from_json refused. The call is held to the all-reduce's alpha.
    assert cluster_module._split_alpha(1.0e-3, 2.3e-3, 2.0) == (pytest.approx(1.0e-3), 0.0)
    assert cluster_module._split_alpha(-0.2e-3, 0.1e-3, 2.0) == (0.0, 0.0)  # an intercept below 0
    assert cluster_module._split_alpha(0.4e-3, 0.1e-3, 2.0) == (0.0, pytest.approx(0.2e-3))


def test_overlap_interference_is_the_median_of_paired_rounds():
    rounds = [(0.010, 0.010, 0.020), (0.010, 0.011, 0.021), (0.012, 0.010, 0.022)]
    # Each round: (together - the longer alone) / the shorter alone: 1.0, 1.0, 1.0.
    assert cluster_module._interference_of_rounds(rounds) == pytest.approx(1.0)
    # A round whose all-reduce alone was read slow (the host slowed for it alone) reads 0 there;
    # the median keeps the others'. Timed in blocks (the measurement before: every all-reduce,
    # then every GEMM loop, then both), a slow spell over the all-reduces' block read them all at
    # 0.025 and the medians (0.025, 0.0105, 0.021) gave 0: a collective beside compute free.
    slow = [(0.025, 0.010, 0.021), (0.025, 0.011, 0.021), (0.010, 0.010, 0.020), (0.010, 0.011, 0.021),
            (0.012, 0.010, 0.022)]
    assert cluster_module._interference_of_rounds(slow) == pytest.approx(1.0)
    assert cluster_module._interference_of_rounds([(0.010, 0.010, 0.5)]) == 20.0  # clamped
    assert cluster_module._interference_of_rounds([(0.010, 0.010, 0.005)]) == 0.0
    assert cluster_module._interference_of_rounds([(0.010, 0.0, 0.02)]) is None  # nothing to divide by
    assert cluster_module._interference_of_rounds([]) is None


def _measure_links_job(rank: int, world: int, tmp: str) -> None:
    import os

    import torch
    import torch.distributed as dist

    torch.cuda.is_available = lambda: False  # the CPU path here, even on a machine with a GPU
    os.environ.pop("LOCAL_WORLD_SIZE", None)
    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(tmp, "store"), world), rank=rank,
                            world_size=world)
    try:
        out = {"agreed": cluster_module._agree_across_ranks([float(rank), 10.0 * rank], world, "min")}
        out["preset"] = Cluster.detect().to_json()
        out["one_node"] = Cluster.detect(measure_links=True).to_json()
        os.environ["LOCAL_WORLD_SIZE"] = "1"  # as if each rank were on a machine of its own
        out["two_nodes"] = Cluster.detect(measure_links=True).to_json()
        with open(os.path.join(tmp, f"rank{rank}.json"), "w") as f:
            json.dump(out, f)
    finally:
        dist.destroy_process_group()


def test_detect_measures_links_with_an_all_reduce(tmp_path):
    run_ranks(_measure_links_job, args=(2, str(tmp_path)), nprocs=2)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["agreed"] == ranks[1]["agreed"] == [0.0, 0.0]
    for key in ("preset", "one_node", "two_nodes"):  # every rank describes the same cluster
        assert ranks[0][key] == ranks[1][key], key
    preset, one_node, two_nodes = (json.loads(ranks[0][k]) for k in ("preset", "one_node", "two_nodes"))

    assert preset["links"] == cluster_module._preset_links("cpu")
    [loopback] = one_node["links"]
    assert loopback["name"] == "loopback" and loopback["bandwidth"] > 0 and loopback["latency"] >= 0
    # A call's overhead fitted beside the latency (an all-gather's alpha against an all-reduce's):
    # Gloo pays one per call here; 0 is written as absent.
    assert loopback.get("call_overhead", 0.0) >= 0.0 and preset["links"][0]["call_overhead"] == 2e-4
    assert loopback["bandwidth"] != preset["links"][0]["bandwidth"]
    assert "measured: links.loopback, overlap_interference;" in one_node["name"]
    # What a collective beside compute costs, measured on these processes (Gloo's threads
    # share the cores with the GEMMs): every node gets the figure, the planner prices with it.
    assert all("overlap_interference" not in node for node in preset["nodes"])
    measured = {node["overlap_interference"] for node in one_node["nodes"]}
    assert len(measured) == 1 and 0.0 <= measured.pop() <= 20.0
    core = Cluster.from_json(ranks[0]["one_node"])._core
    assert _C.cluster_overlap_interference(core) == one_node["nodes"][0]["overlap_interference"]
    assert _C.cluster_overlap_interference(Cluster.from_json(ranks[0]["preset"])._core) == pytest.approx(0.18)

    inner, ethernet = two_nodes["links"]
    assert inner == preset["links"][0]  # one rank a node: nothing crosses the inner level
    assert ethernet["name"] == "ethernet" and ethernet["bandwidth"] > 0 and ethernet["bandwidth"] != 1.25e9
    assert "measured: links.ethernet, overlap_interference;" in two_nodes["name"]
    assert "preset: links.loopback" in two_nodes["name"]
    assert Cluster.from_json(ranks[0]["two_nodes"]).num_nodes == 2


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_detect_measures_the_real_gpu():
    import torch

    c = Cluster.detect()
    gpu = c.device_of(0)
    assert gpu["peak_flops"]["bf16"] > gpu["peak_flops"]["f32"] > 0
    assert gpu["memory_bytes"] == torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    assert "measured: memory_bandwidth, peak_flops" in c.name, c.name
    print(f"detected {c.name}: bf16 {gpu['peak_flops']['bf16'] / 1e12:.0f} TFLOP/s, "
          f"memory {gpu['memory_bandwidth'] / 1e12:.2f} TB/s")


def test_detect_cuda_measures_memory_bandwidth_with_a_device_copy(monkeypatch):
    # An H200 (H100's compute and links, its own memory): the copy's bytes read and written
    # over its time is the bandwidth; a failed copy keeps the catalogue's (the test above).
    copies = []

    def copy_seconds(nbytes, device):
        copies.append(nbytes)
        return 2 * nbytes / 4.3e12

    props = _FakeDeviceProperties("NVIDIA H200", total_memory=150_000_000_000)
    _fake_cuda(monkeypatch, props, lambda n, precision: 1e-3, copy_seconds=copy_seconds)
    c = Cluster.detect()
    h200 = c.device_of(0)
    assert copies == [cluster_module.COPY_BYTES]
    assert h200["memory_bandwidth"] == pytest.approx(4.3e12 / 0.75)  # the model streams at 75% of it
    assert h200["memory_bytes"] == 150_000_000_000
    assert "measured: memory_bandwidth, peak_flops" in c.name and "preset: links.nvswitch" in c.name, c.name


def _mixed_job(rank: int, world: int, tmp: str) -> None:
    import os

    import torch
    import torch.distributed as dist

    torch.cuda.is_available = lambda: False  # the CPU path here, even on a machine with a GPU
    os.environ["LOCAL_WORLD_SIZE"] = "2"  # two nodes of two ranks
    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(tmp, "store"), world), rank=rank,
                            world_size=world)
    try:
        out = {"alike": cluster_module._agree_across_ranks([float(rank)], world, "min", "cpu"),
               "by_kind": cluster_module._agree_across_ranks([float(rank)], world, "min", f"kind{rank % 2}")}
        if rank == 3:  # the last rank finds a slower kind of device
            plain = cluster_module._detect_cpu

            def slower(world, per_node, measure=False):
                doc, sources = plain(world, per_node, measure)
                device = doc["device_types"][0]
                device["name"] = "cpu-throttled"
                device["peak_flops"] = {k: v / 2 for k, v in device["peak_flops"].items()}
                device["memory_bytes"] //= 2
                return doc, sources

            cluster_module._detect_cpu = slower
        out["cluster"] = Cluster.detect().to_json()
        with open(os.path.join(tmp, f"rank{rank}.json"), "w") as f:
            json.dump(out, f)
    finally:
        dist.destroy_process_group()


def test_detect_reports_a_mixed_job(tmp_path):
    # Four ranks on two nodes, the last rank a slower kind: every rank describes the same
    # mixed cluster, with each kind's own figures and its place on its node.
    run_ranks(_mixed_job, args=(4, str(tmp_path)), nprocs=4)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    assert [r["alike"] for r in ranks] == [[0.0]] * 4
    assert [r["by_kind"] for r in ranks] == [[0.0], [1.0], [0.0], [1.0]]  # agreed within a kind only
    assert len({r["cluster"] for r in ranks}) == 1
    cluster = Cluster.from_json(ranks[0]["cluster"])
    assert cluster.heterogeneous and cluster.world_size == 4 and cluster.num_nodes == 2
    assert cluster.devices == ["cpu", "cpu", "cpu", "cpu-throttled"]
    cpu, throttled = cluster.device_of(0), cluster.device_of(3)
    assert throttled["peak_flops"]["f32"] == pytest.approx(cpu["peak_flops"]["f32"] / 2)
    assert cluster.name.startswith("detected mixed 3 x cpu + 1 x cpu-throttled"), cluster.name
    doc = json.loads(ranks[0]["cluster"])
    assert doc["nodes"] == [{"device": "cpu", "count": 2},
                            {"devices": [{"device": "cpu", "count": 1}, {"device": "cpu-throttled", "count": 1}]}]
