"""The runtime: what a rank runs. Modules import downward only (no cycles):

    mesh      the mesh as one rank sees it (groups per axis)
    reshard   resharding steps with their autograd          (mesh)
    lower     rank program -> torch.fx.GraphModule            (mesh, reshard)
    buckets   gradient reduction in buckets                   ()
    batch     binding a step's arguments by name              ()
    counted   the counts of losses whose mean the data counts (lower)
    optim     torch.optim optimizers over an engine's shards  (mesh)
    grad_norm global gradient norms and clipping              ()

The engines (shardwise.engine, shardwise.pipeline) sit above these.
"""
