"""A small MoE in HF's layout (a `gate` Linear next to an `experts`
ModuleList, with `top_k`), written in plain PyTorch: for examples, the
binding's tests and its benchmark."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Expert(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.gate_proj = nn.Linear(d, h, bias=False)
        self.up_proj = nn.Linear(d, h, bias=False)
        self.down_proj = nn.Linear(h, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoeBlock(nn.Module):
    """HF's layout: a `gate` Linear, an `experts` ModuleList, `top_k`."""

    def __init__(self, d, h, experts, top_k):
        super().__init__()
        self.top_k, self.norm_topk_prob = top_k, True
        self.gate = nn.Linear(d, experts, bias=False)
        self.experts = nn.ModuleList(Expert(d, h) for _ in range(experts))

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1])
        probs = torch.softmax(self.gate(flat).float(), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        weights = (weights / weights.sum(-1, keepdim=True)).to(flat.dtype)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token, slot = (ids == e).nonzero(as_tuple=True)
            if len(token):
                out = out.index_add(0, token, expert(flat[token]) * weights[token, slot].unsqueeze(1))
        return out.view_as(x)


class Layer(nn.Module):
    def __init__(self, d, experts=4):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.mix = nn.Linear(d, d)
        self.mlp = MoeBlock(d, 2 * d, experts=experts, top_k=2)

    def forward(self, x):
        x = x + self.mix(self.norm(x))
        return x + self.mlp(self.norm(x))


class TinyMoe(nn.Module):
    def __init__(self, vocab=16, d=16, experts=4, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Layer(d, experts) for _ in range(layers))
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens):
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.lm_head(h)
