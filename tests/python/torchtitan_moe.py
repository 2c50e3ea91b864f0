"""A small decoder with torchtitan's mixture of experts, written as torchtitan 0.3 writes it
(torchtitan/models/common/moe.py and token_dispatcher.py), for the tests of issue 48.

torchtitan itself is not imported: its package imports triton (a 1 GB wheel) and spmd_types at
import time. What is kept, op for op: the router (a gate linear computed in float32, sigmoid or
softmax scores, a load-balancing bias that only chooses the experts, top-k, the chosen scores
gathered from the unbiased ones, route_norm, route_scale), the expert counts from a one-hot
routing map, the ``tokens_per_expert`` statistics buffer updated in training, the local token
dispatcher (a stable argsort of the flattened expert ids, the rows gathered by ``order // K``),
the grouped experts (stacked ``w1`` [E, F, D], ``w2`` [E, D, F], ``w3`` [E, F, D], SwiGLU) by
``torch._grouped_mm`` over the counts' offsets or by torchtitan 0.2's loop over
``num_tokens_per_expert.tolist()``, the combine (outputs scaled by their scores and
scatter-added into the tokens' rows) and a shared expert. torchtitan casts the grouped matmuls'
operands to bfloat16, the combine's product to float32, and computes the gate in float32
(``casts=True`` does so too); by default here they run in the model's dtype, so that a float64
model is float64 throughout.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class GroupedExperts(nn.Module):
    def __init__(self, dim: int, hidden: int, experts: int, use_grouped_mm: bool, casts: bool = False):
        super().__init__()
        self.use_grouped_mm, self.casts = use_grouped_mm, casts
        self.w1 = nn.Parameter(torch.randn(experts, hidden, dim) * dim ** -0.5)
        self.w2 = nn.Parameter(torch.randn(experts, dim, hidden) * hidden ** -0.5)
        self.w3 = nn.Parameter(torch.randn(experts, hidden, dim) * dim ** -0.5)

    def forward(self, x: torch.Tensor, num_tokens_per_expert: torch.Tensor) -> torch.Tensor:
        if not self.use_grouped_mm:
            return self._for_loop(x, num_tokens_per_expert)
        offsets = torch.cumsum(num_tokens_per_expert, dim=0, dtype=torch.int32)
        if self.casts:  # torchtitan's own: operands in bfloat16, the result in x's dtype
            w1, w2, w3, a = self.w1.bfloat16(), self.w2.bfloat16(), self.w3.bfloat16(), x.bfloat16()
            h = F.silu(torch._grouped_mm(a, w1.transpose(-2, -1), offs=offsets))
            h = h * torch._grouped_mm(a, w3.transpose(-2, -1), offs=offsets)
            return torch._grouped_mm(h, w2.transpose(-2, -1), offs=offsets).type_as(x)
        h = F.silu(torch._grouped_mm(x, self.w1.transpose(-2, -1), offs=offsets))
        h = h * torch._grouped_mm(x, self.w3.transpose(-2, -1), offs=offsets)
        return torch._grouped_mm(h, self.w2.transpose(-2, -1), offs=offsets)

    def _for_loop(self, x: torch.Tensor, num_tokens_per_expert: torch.Tensor) -> torch.Tensor:
        counts = [int(c) for c in num_tokens_per_expert.tolist()]  # histc counts are floats
        out = []
        for e, x_e in enumerate(torch.split(x, counts, dim=0)):
            h = F.silu(x_e @ self.w1[e].transpose(-2, -1)) * (x_e @ self.w3[e].transpose(-2, -1))
            out.append(h @ self.w2[e].transpose(-2, -1))
        return torch.cat(out, dim=0)


class TokenChoiceTopKRouter(nn.Module):
    def __init__(self, dim: int, experts: int, top_k: int, score_func: str, route_norm: bool, route_scale: float,
                 float32_gate: bool):
        super().__init__()
        self.gate, self.float32_gate = nn.Linear(dim, experts, bias=False), float32_gate
        self.top_k, self.score_func, self.route_norm, self.route_scale = top_k, score_func, route_norm, route_scale

    def forward(self, x: torch.Tensor, expert_bias: torch.Tensor | None):
        # torchtitan's gate runs under a float32 autocast.
        scores = F.linear(x.float(), self.gate.weight.float()) if self.float32_gate else self.gate(x)
        scores = torch.sigmoid(scores) if self.score_func == "sigmoid" else F.softmax(scores, dim=-1)
        for_choice = scores if expert_bias is None else scores + expert_bias
        _, ids = torch.topk(for_choice, k=self.top_k, dim=-1, sorted=False)
        top = scores.gather(dim=-1, index=ids)
        if self.route_norm:
            top = top / (top.sum(dim=-1, keepdim=True) + 1e-20)
        return top * self.route_scale, ids, scores


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1, self.w2, self.w3 = nn.Linear(dim, hidden, bias=False), nn.Linear(hidden, dim, bias=False), \
            nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MoE(nn.Module):
    def __init__(self, dim: int, hidden: int, experts: int, top_k: int, use_grouped_mm: bool, counts: str,
                 casts: bool = False, shared: bool = True):
        super().__init__()
        self.top_k, self.counts, self.casts = top_k, counts, casts
        self.router = TokenChoiceTopKRouter(dim, experts, top_k, "sigmoid", route_norm=True, route_scale=2.0,
                                            float32_gate=casts)
        self.experts = GroupedExperts(dim, hidden, experts, use_grouped_mm, casts)
        self.shared_experts = FeedForward(dim, hidden) if shared else None
        # torchtitan steps it from tokens_per_expert outside the model; here a fixed bias that
        # moves some choices.
        self.register_buffer("expert_bias", torch.linspace(-0.05, 0.05, experts))
        self.register_buffer("tokens_per_expert", torch.zeros(experts), persistent=True)

    def forward(self, x_BLD: torch.Tensor) -> torch.Tensor:
        B, L, D = x_BLD.shape
        scores_BLK, ids_BLK, scores_BLE = self.router(x_BLD, self.expert_bias)
        num_tokens_per_expert = self._counts(ids_BLK, scores_BLE)
        if self.training:
            with torch.no_grad():
                self.tokens_per_expert.add_(num_tokens_per_expert)
        # The local token dispatcher: rows sorted by expert.
        x_TD = x_BLD.view(B * L, D)
        order = torch.argsort(ids_BLK.view(-1), stable=True)
        scores_sorted = scores_BLK.reshape(-1)[order]
        token = order // self.top_k
        routed = self.experts(x_TD[token], num_tokens_per_expert)
        # The combine: scaled by the scores, added into each token's row.
        routed = ((routed.to(torch.float32) if self.casts else routed) * scores_sorted.reshape(-1, 1)).to(x_TD.dtype)
        out = torch.zeros_like(x_TD).scatter_add(0, token.reshape(-1, 1).expand(-1, D), routed)
        out = out.view(B, L, D)
        return out + self.shared_experts(x_BLD) if self.shared_experts is not None else out

    def _counts(self, ids_BLK: torch.Tensor, scores_BLE: torch.Tensor) -> torch.Tensor:
        """Each expert's routed rows: from a one-hot routing map (torchtitan 0.3), by histc
        (torchtitan 0.2, on float ids: the CPU's histc takes no integers), or "balanced": the
        same count for every expert whatever the ids (not the ids' counts: a program that is not
        the experts' sum, which the capture must leave as it is)."""
        experts = scores_BLE.shape[-1]
        if self.counts == "histc":
            return torch.histc(ids_BLK.view(-1).float(), bins=experts, min=0, max=experts)
        if self.counts == "balanced":
            return torch.full((experts,), ids_BLK.numel() // experts, dtype=torch.int64, device=ids_BLK.device)
        routing_map = torch.zeros_like(scores_BLE, dtype=torch.bool).scatter_(-1, ids_BLK, True)
        return routing_map.sum(dim=(0, 1))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int, experts: int, top_k: int, use_grouped_mm: bool, counts: str,
                 casts: bool):
        super().__init__()
        self.heads = heads
        self.attention_norm, self.ffn_norm = nn.RMSNorm(dim), nn.RMSNorm(dim)
        self.wqkv, self.wo = nn.Linear(dim, 3 * dim, bias=False), nn.Linear(dim, dim, bias=False)
        self.moe = MoE(dim, hidden, experts, top_k, use_grouped_mm, counts, casts)

    def forward(self, x):
        B, L, D = x.shape
        q, k, v = self.wqkv(self.attention_norm(x)).view(B, L, 3, self.heads, D // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.wo(a.transpose(1, 2).reshape(B, L, D))
        return x + self.moe(self.ffn_norm(x))


class Decoder(nn.Module):
    """Token embeddings, `layers` attention + MoE blocks, a norm and a head; called with
    ``input_ids`` and ``labels`` (next-token targets), it returns the mean cross-entropy."""

    def __init__(self, vocab: int = 64, dim: int = 32, heads: int = 4, hidden: int = 64, experts: int = 8,
                 top_k: int = 2, layers: int = 2, use_grouped_mm: bool = True, counts: str = "routing_map",
                 casts: bool = False):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads, hidden, experts, top_k, use_grouped_mm, counts, casts)
                                    for _ in range(layers))
        self.norm, self.output = nn.RMSNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h)
        logits = self.output(self.norm(h))
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
