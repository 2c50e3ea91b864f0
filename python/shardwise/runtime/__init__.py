"""The runtime: what a rank runs. Modules import downward only (no cycles):

    mesh      the mesh as one rank sees it (groups per axis)
    reshard   resharding steps with their autograd          (mesh)
    traffic   bytes per collective kind, counted by the calls  ()
    transport the runtime's own torch.distributed calls       (traffic)
    kernels   distributed kernels: split lookups, statistics  (mesh)
    parameter_gathers  sharded weights prefetched, released, gathered again  (reshard, traffic, transport)
    recompute checkpointed segments of recomputed blocks      ()
    lower     rank program -> torch.fx.GraphModule            (mesh, reshard, kernels, parameter_gathers, recompute)
    buckets   gradient reduction in buckets                   (transport)
    batch     binding a step's arguments by name              ()
    counted   the counts of losses whose mean the data counts (lower)
    optim     torch.optim optimizers over an engine's shards  (mesh)
    grad_norm global gradient norms and clipping              ()
    precision mixed-precision policies                        ()
    verify    the capture against the eager model             (lower, counted)
    state     what a rank holds of the model's state (boxes)  ()
    engine_base  the training loop's controls                 (batch, optim, precision, grad_norm)
    spmd_engine      the SPMD engine (shardwise.Engine)        (engine_base, lower, buckets, state, ...)
    pipeline_engine  the pipeline engine, stage cut, actions   (engine_base, lower, buckets, state, ...)

Outside the package it imports only lower-level modules (_C, _logging, _teardown, _fx_import,
_inputs, materialize); capture and plan reach the engines as a ``Recapture`` parallelize fills
in. shardwise.parallelize (shardwise/engine.py), capture, plan, checkpoint and the CLI sit
above; tests/python/test_runtime_imports.py keeps it so.
"""
