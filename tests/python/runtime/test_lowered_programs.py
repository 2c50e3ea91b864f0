"""Every rank program of every model the suite trains, lowered, against the rank IR it was
lowered from, node for node, collectives included (issue 47: ``engine.code`` corresponds to
``engine.rank_ir``; the comparison is rank_ir_check.py's).

The models: every architecture of benchmarks/model_zoo.py (the transformers decoders,
encoders, encoder-decoders, mixtures of experts and vision models the zoo's training column
trains against one device, and nanoGPT), built tiny in float64 in training mode. The two
foreign models that need packages the suite does not install (torchtitan's Llama 3, timm's
ViT) are left out by name.

For each model, on a mesh of 4 ranks, without processes (the lowering needs only the rank's
coordinates: ``FakeMesh``):
- SPMD: the search's plan on (1, 4) and on (2, 2) with ZeRO, selective recomputation and
  collective matmuls, on a cluster whose memory forces weights onto the tensor axis
  (conftest.tight_cluster); each of the 4 ranks' programs;
- pipelines of 2 stages: tensor 2 under 1F1B (each stage's sub-mesh sharded), and data 2
  under ZB-H1 (backward split into B and W, fused gradient accumulation); each rank's stage.
Each rank's program lowered hashes as the one the job's ranks agree on (``_C.program_hash``,
transform/job_program.h: the rank graph and every stage graph after its passes).
A model without repeated layers has no pipeline plan: the plan is refused, as asserted.
A model whose micro-batches would change what it computes (batch statistics, a loss not linear
in the batch) runs its pipeline in one micro-batch.

Nothing here trains: the equivalence tests (test_training_loops.py, test_parallelize.py, ...)
train their plans against one device and check the same correspondence on real ranks."""
from __future__ import annotations

import logging
import pathlib
import sys
import warnings

import pytest

import shardwise
from shardwise import _C
from shardwise.capture import _capture_with_sources
from shardwise.engine import _model_tensors, _Trainable
from shardwise.runtime import lower
from shardwise.runtime.batch import BatchBinding, map_tensors
from shardwise.runtime.pipeline_engine import stage_program
from conftest import tight_cluster
from rank_ir_check import lowered_against_rank_ir

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "benchmarks"))
import model_zoo as zoo  # noqa: E402

WORLD = 4
NOT_INSTALLED = ("titan-llama3", "timm-vit")  # torchtitan, timm: not among the suite's packages
MODELS = [spec.name for spec in zoo.ZOO if spec.name not in NOT_INSTALLED]
SPMD_PLANS = (((1, 4), {}), ((2, 2), {"zero": True, "recompute": "selective", "collective_matmul": True}))
PIPELINE_PLANS = ({"tensor": 2, "data": 1, "schedule": "1f1b", "recompute": "selective"},
                  {"tensor": 1, "data": 2, "schedule": "zb-h1", "recompute": False})


class FakeMesh:
    """What the lowering reads of a rank's mesh (runtime/mesh.py's _Mesh), with no process group."""

    def __init__(self, sizes, rank: int):
        self.sizes, self.rank = list(sizes), rank
        self.axis_groups = _C.axis_groups(self.sizes)
        self.coords = [next(g for g in groups if rank in g).index(rank) for groups in self.axis_groups]
        self.group_names = [f"axis{a}" for a in range(len(self.sizes))]
        self.stage_group = None


class Captured:
    """A zoo model's training capture, as parallelize makes it (at `rows` rows: a micro-batch)."""

    def __init__(self, spec, rows: int | None = None):
        model = spec.build_for_training()
        binding, named = BatchBinding.capture(model, (), zoo._train_batch(spec, 0), spec.loss_fn)
        if rows is not None:
            named = map_tensors(named, lambda x: x.narrow(0, 0, rows))
        self.graph, self.builder = _capture_with_sources(_Trainable(model, spec.loss_fn), named, "export", 0,
                                                         prefix="model.model.")
        self.tensors, self.trainable = _model_tensors(model, builder=self.builder)
        self.names = binding.names


def _compared(checked: list, where: str, module, rank_ir: str) -> None:
    result = lowered_against_rank_ir(module, rank_ir)
    checked.append({"where": where, **result})


def _hashed(checked: list, where: str, lowered: str, graph, plan, rank: int) -> None:
    """The hash of the program lowered (its rank graph and stage graphs, as the lowering read
    them) against the one the ranks agree on (_C.program_hash: transform/job_program.h)."""
    agreed = _C.program_hash(graph._core, plan.to_json(), rank)
    checked.append({"where": f"{where} (hash)", "calls": 1, "collectives": 0,
                    "mismatches": [] if lowered == agreed else [f"lowered {lowered}, agreed {agreed}"]})


def _spmd_programs(c: Captured, checked: list) -> None:
    for mesh, options in SPMD_PLANS:
        plan = shardwise.Plan.search(c.graph, tight_cluster(c.graph, WORLD, zoo.BATCH, mesh), global_batch=zoo.BATCH,
                                     mesh=mesh, **options)
        for rank in range(WORLD):
            program, _ = lower._local_rank_program(c.graph, plan.to_json(), rank, False)
            module = lower._build_module(program, c.builder.sources, FakeMesh(mesh, rank), c.tensors, c.names,
                                         c.trainable, parameters={})
            _compared(checked, f"mesh {mesh} rank {rank}", module, program["rank_ir"])
            _hashed(checked, f"mesh {mesh} rank {rank}", program["hash"], c.graph, plan, rank)


def _pipeline_programs(spec, whole: Captured, micro: dict, options: dict, checked: list) -> None:
    cluster = shardwise.Cluster.preset("cpu", WORLD)
    coupled = bool(_C.batch_coupling(whole.graph._core)["sites"])
    data = options["data"]
    micro_batch = zoo.BATCH // data if coupled else 1  # one micro-batch where micro-batches would not be exact
    if not whole.graph.repeated_blocks():
        with pytest.raises(shardwise.ValidationError, match="repeated layers, but the graph has none"):
            shardwise.Plan.manual(whole.graph, cluster, pipeline=2, global_batch=zoo.BATCH, micro_batch=micro_batch,
                                  **options)
        return
    plan = shardwise.Plan.manual(whole.graph, cluster, pipeline=2, global_batch=zoo.BATCH, micro_batch=micro_batch,
                                 **options)
    rows = micro_batch * data
    c = micro[rows] = micro.get(rows) or Captured(spec, rows=rows)  # (each capture once a model)
    if not plan.is_complete():
        plan = plan.complete(c.graph, cluster)
    size = plan.data * plan.tensor
    for rank in range(WORLD):
        job = _C.pipeline_job(plan.to_json(), WORLD, rank)  # (as parallelize reads it)
        pipeline_rank, local = job["pipeline_rank"], job["local"]
        stages = stage_program(c.graph, c.builder, plan, plan.stage_plan() if size > 1 else None,
                               FakeMesh([plan.data, plan.tensor], local) if size > 1 else None, pipeline_rank, c.names,
                               c.tensors, c.trainable, {}, job["micro_batches"], split_backward=job["split_backward"],
                               stage_ranks=job["stage_ranks"])
        for g, stage in stages.stages.items():
            _compared(checked, f"{options['schedule']} rank {rank} stage {g}", stage["module"], stage["rank_ir"])
        _hashed(checked, f"{options['schedule']} rank {rank}", stages.program_hash, c.graph, plan, rank)


@pytest.fixture(autouse=True)
def _quiet():
    level = logging.getLogger("shardwise").level
    logging.getLogger("shardwise").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
    logging.getLogger("shardwise").setLevel(level)


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_every_rank_program_lowers_to_its_rank_ir_node_for_node(name):
    spec = next(s for s in zoo.ZOO if s.name == name)
    checked: list[dict] = []
    whole, micro = Captured(spec), {}
    _spmd_programs(whole, checked)
    for options in PIPELINE_PLANS:
        _pipeline_programs(spec, whole, micro, options, checked)
    mismatches = [f"{c['where']}: {m}" for c in checked for m in c["mismatches"]]
    assert not mismatches, "\n".join(mismatches[:20])
    assert len(checked) >= 2 * WORLD  # every SPMD rank at least (and each pipeline rank's stage)
    assert all(c["calls"] > 0 for c in checked)
    # The tight cluster puts weights on the tensor axis: the programs reshard, and each of
    # those collectives was compared.
    assert sum(c["collectives"] for c in checked if c["where"].startswith("mesh")) > 0
