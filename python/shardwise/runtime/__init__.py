"""The runtime: what a rank runs. Modules import downward only (no cycles); each line names a
module of this folder, what it does, and (in parentheses) the modules of this folder it imports:

    groups             process groups made in the order the core lists them  ()
    mesh               the mesh as one rank sees it (groups per axis)  ()
    traffic            bytes per collective kind, counted by the calls  ()
    transport          the runtime's own torch.distributed calls  (traffic)
    buckets            gradient reduction in buckets  (transport)
    reshard            resharding steps with their autograd  (mesh)
    ring_attention     attention over a sequence split across a group, its key and value
                       blocks passed around the ring (context parallelism)  (transport)
    expert_dispatch    a mixture of experts' tokens sent to their experts' ranks and back by
                       all-to-all (expert parallelism)  (transport)
    kernels            distributed kernels: split lookups, statistics, ring attention, expert
                       dispatch  (expert_dispatch, mesh, ring_attention)
    parameter_gathers  sharded weights prefetched, released, gathered again  (reshard,
                       transport)
    recompute          checkpointed segments of recomputed blocks  ()
    async_gradients    an activation's gradient all-reduced beside its reader's weight gradient
                       (Megatron's asynchronous tensor-parallel all-reduce)  (mesh, transport)
    fp8                linear layers' products in float8 (torch._scaled_mm, rowwise scales),
                       and the same arithmetic on one device  (async_gradients, mesh,
                       transport)
    collective_matmul  all-gathers and reduce-scatters run inside their matmuls, as rings
                       (collective matmul, async TP), an FP8 linear's in float8
                       (async_gradients, fp8, mesh, traffic, transport)
    fused_accumulation a stage's weight gradients added into .grad by the products and lookups
                       that make them (addmm_, index_add_)  (async_gradients, buckets)
    weight_split       a stage's backward as B and W (zero-bubble schedules)
                       (fused_accumulation)
    lower              rank program -> torch.fx.GraphModule  (async_gradients,
                       collective_matmul, fp8, fused_accumulation, kernels, mesh,
                       parameter_gathers, recompute, reshard, weight_split)
    batch              binding a step's arguments by name  ()
    counted            the counts of losses whose mean the data counts  (lower)
    optim              torch.optim optimizers over an engine's shards  (transport)
    grad_norm          global gradient norms and clipping  ()
    precision          mixed-precision policies  ()
    verify             the capture against the eager model  (counted, lower)
    state              what a rank holds of the model's state (boxes)  ()
    stage_links        which ranks of two pipeline stages exchange a value crossing their cut,
                       and on which channel  (reshard)
    compiled           rank programs run through torch.compile, cut into pieces at the
                       runtime's stateful modules, which run eagerly  (async_gradients,
                       collective_matmul, fp8, parameter_gathers, reshard, transport)
    engine_base        the training loop's controls  (batch, compiled, grad_norm, optim,
                       precision)
    spmd_engine        the SPMD engine (shardwise.Engine)  (engine_base, lower, buckets, state,
                       ...)
    pipeline_engine    the pipeline engine, stage cut, actions  (engine_base, lower, buckets,
                       stage_links, state, weight_split, ...)

Outside the package it imports only lower-level modules (_C, _logging, _teardown, _fx_import,
_aten_call, _inputs, _tensor_names, materialize); capture and plan reach the engines as a ``Recapture`` parallelize
fills in. shardwise.parallelize (shardwise/engine.py), capture, plan, checkpoint and the CLI sit
above; tests/python/runtime/test_runtime_imports.py keeps it so, and tests/python/docs/test_docs.py checks this
map against the folder. Why it is built this way: docs/design/training-loop.md. Which facts it
reads from the core and which it still decides itself: README.md here.
"""
