"""A plain torch.distributed expert-parallel step, the way users write it:
experts in an nn.ModuleList filled by index_put_ (`out[mask] = expert(...)`),
all_to_all_single dispatch and combine through torch.distributed.nn's
differentiable all_to_all_single, and a combine that adds `out.sum() * 0.0`
(so every local expert gets a gradient). Recorded on two Gloo rank
processes with moerr.record; each rank replays alone bitwise, also when the
replaying process was started with another intra-op thread count than the
ranks ran with (torchrun sets OMP_NUM_THREADS=1 in the ranks; a shell
leaves it unset).

Run by ctest with PYTHONPATH=BUILD/python and MOERR_BIN=the moerr binary."""
import os
import subprocess

import pytest

import moerr
from test_distributed_record import MOERR, TIMEOUT, run_ranks

EP_LOOP = """
import torch, torch.nn as nn, torch.nn.functional as F, torch.distributed as dist
import torch.distributed.nn.functional as dfn
import moerr
torch.set_num_threads(2)  # the ranks' count; the replay below runs under OMP_NUM_THREADS=1
dist.init_process_group("gloo", init_method=INIT, rank=int(os.environ["RANK"]), world_size=2)
rank, world = dist.get_rank(), dist.get_world_size()
EXPERTS, D, TOP_K = 8, 64, 2


class Expert(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(D, 2 * D, bias=False), nn.Linear(D, 2 * D, bias=False)
        self.down_proj = nn.Linear(2 * D, D, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Moe(nn.Module):
    def __init__(self):
        super().__init__()
        self.per = EXPERTS // world
        self.gate = nn.Linear(D, EXPERTS, bias=False)
        every = [Expert() for _ in range(EXPERTS)]  # one model on every rank (same seed)
        self.experts = nn.ModuleList(every[rank * self.per:(rank + 1) * self.per])

    def forward(self, x):
        flat = x.reshape(-1, D)
        weights, ids = torch.topk(torch.softmax(self.gate(flat), -1), TOP_K, -1)
        weights = weights / weights.sum(-1, keepdim=True)
        slot_expert = ids.reshape(-1)
        order = torch.argsort(slot_expert, stable=True)
        token = torch.arange(flat.shape[0]).repeat_interleave(TOP_K)[order]
        counts = torch.bincount(slot_expert, minlength=EXPERTS).view(world, self.per)
        arrived = torch.empty_like(counts)
        dist.all_to_all_single(arrived, counts)
        send, recv = counts.sum(1).tolist(), arrived.sum(1).tolist()
        local_ids = torch.empty(sum(recv), dtype=torch.long)
        dist.all_to_all_single(local_ids, slot_expert[order] % self.per, recv, send)
        recv_x = dfn.all_to_all_single(torch.empty(sum(recv), D), flat[token], recv, send)
        out = torch.zeros_like(recv_x)
        for m, expert in enumerate(self.experts):
            mask = local_ids == m
            out[mask] = expert(recv_x[mask])
        back = dfn.all_to_all_single(torch.empty(sum(send), D), out, send, recv)
        combined = torch.zeros_like(flat).index_add(0, token, back * weights.reshape(-1)[order].unsqueeze(1))
        return (combined + out.sum() * 0.0).view_as(x)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.moe = nn.LayerNorm(D), Moe()

    def forward(self, h):
        return h + self.moe(self.norm(h))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(16, D)
        self.blocks = nn.ModuleList([Block() for _ in range(2)])
        self.head = nn.Linear(D, 16, bias=False)

    def forward(self, tokens):
        h = self.embed(tokens)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


torch.manual_seed(0)
model = Model()
moerr.instrument(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
tokens = torch.randint(0, 16, (8, 33), generator=torch.Generator().manual_seed(100 + rank))
with moerr.record(RUN, ep_size=world, experts=EXPERTS, overwrite=True) as rec:
    with rec.step():
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 16), tokens[:, 1:].reshape(-1))
        loss.backward()
        for name, p in model.named_parameters():
            if p.grad is not None and ".experts." not in name:  # experts live on one rank
                dist.all_reduce(p.grad)
                p.grad.div_(world)
        opt.step()
        opt.zero_grad(set_to_none=True)
print("loss", rank, loss.item())
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def ep_loop(tmp_path_factory):
    run = tmp_path_factory.mktemp("ep_loop") / "run"
    out = run_ranks(EP_LOOP, run)
    assert all("loss" in o for o in out), out
    return run


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_replays_bitwise_under_another_thread_count(ep_loop, rank):
    bundle = moerr.Bundle(ep_loop / f"rank{rank}.moerr")
    names = [op["name"] for op in bundle.ops(0)]
    # out[mask] = ...: 4 local experts, 2 blocks
    assert names.count("aten::index_put_") == 8 and names.count("c10d::all_to_all") == 12, names
    # The replay runs under the recorded count (2), not the process's (1):
    # reductions split per thread round differently under another count.
    p = subprocess.run([MOERR, "replay", str(ep_loop), "--rank", str(rank)], capture_output=True, text=True,
                       timeout=TIMEOUT, env=dict(os.environ, OMP_NUM_THREADS="1"))
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "outputs compared, 0 differ" in out and "c10d::all_to_all x12" in out, out
