"""The Python binding on a small MoE written in plain PyTorch (not the C++
reference model): recording, and the moerr command on what it recorded.

Run by ctest with PYTHONPATH=BUILD/python and MOERR_BIN=the moerr binary."""
import json
import os
import subprocess

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import moerr

MOERR = os.environ.get("MOERR_BIN", "moerr")


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
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.mix = nn.Linear(d, d)
        self.mlp = MoeBlock(d, 2 * d, experts=4, top_k=2)

    def forward(self, x):
        x = x + self.mix(self.norm(x))
        return x + self.mlp(self.norm(x))


class TinyMoe(nn.Module):
    def __init__(self, vocab=16, d=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Layer(d) for _ in range(2))
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens):
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.lm_head(h)


def train(path, mode="replayable", steps=2, autocast=False, break_expert=False):
    torch.manual_seed(0)
    model = TinyMoe()
    if break_expert:  # its down projection's outputs pass fp32's range
        with torch.no_grad():
            expert = model.layers[0].mlp.experts[1]
            expert.up_proj.weight.mul_(1e3)
            expert.down_proj.weight.fill_(3e38)
    moerr.instrument(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 16, (8, 12), generator=torch.Generator().manual_seed(1))
    with moerr.record(path, mode=mode, overwrite=True) as rec:
        rec.name_parameters(model)
        for _ in range(steps):
            with rec.step():
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                    logits = model(tokens[:, :-1])
                loss = F.cross_entropy(logits.float().reshape(-1, 16), tokens[:, 1:].reshape(-1))
                loss.backward()
                with moerr.scope("optimizer"):
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                rec.outcome(loss=loss.item())
    return model


def run(*args, ok=(0,)):
    p = subprocess.run([MOERR, *map(str, args)], capture_output=True, text=True)
    assert p.returncode in ok, p.stderr
    return p.stdout


def test_a_python_step_replays_bitwise_in_moerr(tmp_path):
    path = tmp_path / "run.moerr"
    train(path)
    inspect = run("inspect", path)
    assert "complete steps: 0, 1" in inspect
    replay = run("replay", path, "--check")
    assert replay.count(", 0 differ") == 2, replay
    assert replay.count("bitwise identical") == 2, replay

    bundle = moerr.Bundle(path)
    assert bundle.steps == [0, 1]
    modules = {op["module"] for op in bundle.ops(0)}
    assert "layers.0.mlp.experts.1.down_proj" in modules
    assert "optimizer" in modules
    routing = bundle.routing(0)
    assert sorted({r["layer"] for r in routing}) == [0, 1]
    assert routing[0]["topk_ids"].shape == (8 * 11, 2)
    assert sum(routing[0]["token_counts"]) == 8 * 11 * 2
    assert any(name.startswith("param/layers.0.mlp.gate.weight") for name, _ in bundle.tensor_names())


def test_bisect_names_the_broken_expert(tmp_path):
    path = tmp_path / "broken.moerr"
    train(path, mode="stats", steps=1, break_expert=True)
    found = json.loads(run("bisect", path, "--json", ok=(1,)))[0]
    assert found["found"]
    assert found["module"].startswith("layers.0.mlp.experts.1"), found
    assert found["phase"] == "forward"


def test_diff_flags_bf16_autocast_and_not_itself(tmp_path):
    a, b = tmp_path / "fp32.moerr", tmp_path / "bf16.moerr"
    train(a, steps=1)
    train(b, steps=1, autocast=True)
    same = json.loads(run("diff", a, a, "--json"))
    assert same["diverged_ops"] == 0 and same["only_a"] == 0
    report = json.loads(run("diff", a, b, "--json", ok=(1,)))
    assert report["diverged_ops"] > 0
    assert report["diverged"][0]["op"] in ("aten::linear", "aten::matmul", "aten::mm", "aten::addmm"), report["diverged"][0]


def test_errors_carry_moerr_messages(tmp_path):
    with pytest.raises(ValueError, match="stats, replayable or full"):
        with moerr.record(tmp_path / "x.moerr", mode="everything"):
            pass
    (tmp_path / "junk.moerr").write_bytes(b"not a bundle" * 10)
    with pytest.raises(ValueError):
        moerr.Bundle(tmp_path / "junk.moerr")
    with pytest.raises(FileNotFoundError):
        moerr.Bundle(tmp_path / "absent.moerr")


def test_routing_of_an_unknown_router(tmp_path):
    path = tmp_path / "r.moerr"
    with moerr.record(path, mode="stats", overwrite=True) as rec:
        with rec.step():
            logits = torch.randn(5, 6)
            weights, ids = torch.topk(torch.softmax(logits, -1), 2)
            moerr.routing(3, ids, weights, logits)
    routing = moerr.Bundle(path).routing(0)
    assert len(routing) == 1 and routing[0]["layer"] == 3
    assert torch.equal(routing[0]["topk_ids"].long(), ids)
