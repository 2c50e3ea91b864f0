"""transformers.Trainer on shardwise: the one change is Trainer -> ShardwiseTrainer.
torchrun --standalone --nproc-per-node 4 examples/hf_trainer.py  (or: python examples/hf_trainer.py --plain)"""
import sys

import torch
import transformers

from shardwise.integrations.transformers import ShardwiseTrainer

VOCAB, SEQ = 128, 16


def rows(n, seed):  # token ids of random lengths
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(1, VOCAB, (int(torch.randint(4, SEQ + 1, (), generator=g)),), generator=g)}
            for _ in range(n)]


def collate(batch):  # padded with 0: attention mask 0 and label -100 there
    ids = torch.stack([torch.nn.functional.pad(row["input_ids"], (0, SEQ - len(row["input_ids"]))) for row in batch])
    return {"input_ids": ids, "attention_mask": (ids != 0).long(), "labels": ids.masked_fill(ids == 0, -100)}


def train(trainer_class=ShardwiseTrainer, output_dir="hf_trainer_out", resume_from=None):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ)
    args = transformers.TrainingArguments(output_dir, max_steps=5, per_device_train_batch_size=8,
                                          gradient_accumulation_steps=2, learning_rate=1e-2, max_grad_norm=0.5,
                                          lr_scheduler_type="cosine", warmup_steps=1, logging_steps=1,
                                          eval_strategy="steps", eval_steps=2, save_steps=3, report_to="none")
    trainer = trainer_class(model=transformers.LlamaForCausalLM(config).double(), args=args, data_collator=collate,
                            train_dataset=rows(64, 1), eval_dataset=rows(16, 2))
    trainer.train(resume_from_checkpoint=resume_from)
    return trainer


if __name__ == "__main__":
    cls = transformers.Trainer if "--plain" in sys.argv else ShardwiseTrainer
    for run in (train(cls), train(cls, resume_from="hf_trainer_out/checkpoint-3")):  # trained; resumed at step 3
        if run.is_world_process_zero():
            print([(h["step"], k, round(h[k], 6)) for h in run.state.log_history for k in ("loss", "eval_loss") if k in h])
