"""A saved plan, edited by hand, then trained: plans are plain JSON.

    torchrun --nproc-per-node 2 examples/edit_plan.py

Rank 0 would normally save the plan once (`plan.to_json()`); here every rank makes the same
one: a 2-stage pipeline of the built-in TinyGPT. The edit turns its 1F1B schedule into GPipe
with micro-batches of 2, and the edited plan trains.
"""
import json

import torch
import torch.distributed as dist

import shardwise
from shardwise.models.tiny_gpt import TinyGPT, TinyGPTConfig

dist.init_process_group("gloo")
torch.manual_seed(0)
model = TinyGPT(TinyGPTConfig(layers=4))
idx, labels = model.example_inputs(batch=8)
graph = shardwise.capture(model, (idx, labels))
saved = shardwise.Plan.manual(graph, shardwise.Cluster.preset("cpu", 2), pipeline=2, data=1, global_batch=8,
                              micro_batch=1, schedule="1f1b").to_json(indent=1)

doc = json.loads(saved)          # the edit a user makes in the file
doc["schedule"] = "gpipe"
doc["micro_batch"] = 2
doc.pop("predicted", None)       # the old prediction no longer applies
plan = shardwise.Plan.from_json(json.dumps(doc))

engine = shardwise.parallelize(model, (idx, labels), plan=plan)
optimizer = torch.optim.AdamW(engine.parameters(), lr=1e-3)
for step in range(3):
    optimizer.zero_grad()
    loss = engine.train_step(idx, labels)
    optimizer.step()
    if dist.get_rank() == 0:
        print(f"step {step}: loss {loss.item():.4f} ({plan.schedule}, micro-batch {plan.micro_batch})")
dist.destroy_process_group()
