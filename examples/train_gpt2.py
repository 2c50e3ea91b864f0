"""Train a Hugging Face GPT-2 (small config, random weights) with shardwise on CPU processes.

    torchrun --nproc-per-node 2 examples/train_gpt2.py

Every rank runs this same script; shardwise captures the model with its loss, searches a plan
for the job's devices and trains this rank's share. The loss printed is the same on every rank.
"""
import torch
import torch.distributed as dist
import transformers

import shardwise

dist.init_process_group("gloo")
torch.manual_seed(0)
config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=64,
                                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
model = transformers.GPT2LMHeadModel(config)


def loss_fn(output, labels):  # next-token cross entropy on the logits
    logits = output.logits[:, :-1]
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels[:, 1:].flatten())


ids = torch.randint(0, config.vocab_size, (8, 32), generator=torch.Generator().manual_seed(1))
engine = shardwise.parallelize(model, (ids, ids), loss_fn)
optimizer = engine.optimizer(torch.optim.AdamW, lr=1e-3)
if dist.get_rank() == 0:
    print(engine.plan.report())
for step in range(3):
    optimizer.zero_grad()
    loss = engine.train_step(ids, ids)
    optimizer.step()
    if dist.get_rank() == 0:
        print(f"step {step}: loss {loss.item():.4f}")
dist.destroy_process_group()
