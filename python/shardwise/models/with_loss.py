"""A transformers causal LM and its loss in one module: ``model(ids, y)`` is the cross entropy
of the logits against ``y`` (already shifted by the caller), the form ``parallelize(model,
(ids, y))`` captures. For tests and benchmarks that build Hugging Face models from configs."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalLMWithLoss(nn.Module):
    def __init__(self, m: nn.Module):
        super().__init__()
        self.m = m

    def forward(self, ids: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = self.m(input_ids=ids, use_cache=False).logits
        return F.cross_entropy(logits.flatten(0, 1), y.flatten())
