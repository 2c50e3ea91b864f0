"""test_training_loops.py's loop with every rank program compiled (``parallelize(...,
compile=...)``, issue 49): the same user's Hugging Face loop (collator batches with -100 labels,
gradient accumulation under ``no_sync``, clipping, AdamW with parameter groups, a warm-up
scheduler, dropout in training and none in eval, the bf16 policy) on every layout, each SPMD
program and pipeline stage run through torch.compile with AOTAutograd's graphs (backend
"aot_eager": the ops it traced, run as ATen runs them), held to one device as the eager engine
is. A file of its own so that pytest-xdist's ``--dist loadfile`` runs it beside the eager one.
"""
from __future__ import annotations

import pytest

from test_training_loops import LAYOUTS, _spawn, check_loop

pytest.importorskip("transformers")


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_users_hugging_face_loop_compiled_equals_one_device(layout):
    r = _spawn(layout, compiled=True)
    assert len(r["compiled"]) >= 2 and all(r["compiled"]), r["compiled"]  # training's and eval's, at least
    assert r["recompiled"] == 0, r["recompiled"]  # a step after the loop's compiles nothing
    # Dynamo breaks none of them: the runtime's stateful calls (the sharded layouts' prefetched and
    # regathered weights) are eager pieces the program is cut into (compiled.compiled_in_pieces),
    # and the slice bounds of a resharding are a constant to it.
    assert all(e["graph_breaks"] == 0 for e in r["compile_report"]), r["compile_report"]
    pieces = [e["eager_pieces"] for e in r["compile_report"]]
    assert all(pieces) if LAYOUTS[layout].get("sharded") else not any(pieces), r["compile_report"]
    # Dropout's own check runs where the loop trains without it (a pipeline's); elsewhere the
    # loop trained with dropout on, equal to one device's masks.
    assert (r["dropout"] is None) == ("pipeline" not in layout), r["dropout"]
    check_loop(layout, r)
