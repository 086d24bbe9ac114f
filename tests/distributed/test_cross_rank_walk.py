"""Bisect's cause walk across ranks, row by row (docs/DISTRIBUTED.md,
"Bisect across ranks"): a plain torch.distributed (gloo) expert-parallel
step in fp32, one expert per rank, whose router never sends a rank's tokens
to its own expert. The expert on rank W/2 has its down projection scaled by
1e37: every row it outputs leaves its rank in the combine all_to_all, every
other rank's next layer_norm overflows on them, and rank W/2 first sees a
non-finite value when those ranks' NaN rows arrive in the next dispatch.
Every rank's first overflow therefore arrived or was received, the origin's
included, so the rank-level order names rank 0; the walk through the
all_to_all's rows names rank W/2's expert and the rows it sent.

Run by ctest with PYTHONPATH=BUILD/python and MOERR_BIN=the moerr binary."""
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "python"))
from test_distributed_record import MOERR, TIMEOUT, moerr_cli, run_ranks  # noqa: E402

TOKENS = 12    # per rank: tokens[:, :-1] of a [2, 7] batch

STEP = """
import torch, torch.nn as nn, torch.nn.functional as F, torch.distributed as dist, moerr
from moerr.examples import AllToAll

def destination(rank, world, t):
    # Token t of `rank` goes to the expert on this rank: never its own.
    return (rank + 1 + t % (world - 1)) % world

class Expert(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.up, self.down = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x):
        return self.down(F.silu(self.up(x)))

class Moe(nn.Module):
    def __init__(self, d, rank, world):
        super().__init__()
        self.rank, self.world = rank, world
        every = [Expert(d) for _ in range(world)]  # one model on every rank (same seed)
        self.experts = nn.ModuleList([every[rank]])

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1])
        dest = torch.tensor([destination(self.rank, self.world, t) for t in range(flat.shape[0])])
        order = torch.argsort(dest, stable=True)
        send = torch.bincount(dest, minlength=self.world)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)
        send, recv = send.tolist(), recv.tolist()
        rows = AllToAll.apply(flat[order], send, recv)
        back = AllToAll.apply(self.experts[0](rows), recv, send)
        return torch.zeros_like(flat).index_add(0, order, back).view_as(x)

class Block(nn.Module):
    def __init__(self, d, rank, world):
        super().__init__()
        self.norm, self.moe = nn.LayerNorm(d), Moe(d, rank, world)

    def forward(self, h):
        return h + self.moe(self.norm(h))

class Model(nn.Module):
    def __init__(self, rank, world, vocab=16, d=8):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, rank, world) for _ in range(2))
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        h = self.embed(tokens)
        for block in self.blocks:
            h = block(h)
        return self.head(h)

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method=INIT, rank=rank, world_size=world)
torch.manual_seed(0)
model = Model(rank, world)
moerr.instrument(model)
if rank == world // 2:
    with torch.no_grad():
        model.blocks[0].moe.experts[0].down.weight.mul_(1e37)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
tokens = torch.randint(0, 16, (2, 7), generator=torch.Generator().manual_seed(rank))
with moerr.record(RUN, mode=MODE, ep_size=world, experts=world, overwrite=True) as rec:
    with rec.step():
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 16), tokens[:, 1:].reshape(-1))
        loss.backward()
        for name, p in model.named_parameters():
            if p.grad is not None and ".experts." not in name:
                dist.all_reduce(p.grad)
        opt.step()
print("recorded", rank)
dist.destroy_process_group()
"""


def destination(rank, world, t):
    return (rank + 1 + t % (world - 1)) % world


def combine_rows(world, origin, receiver):
    """The rows of the combine all_to_all that carry the origin's expert
    output back to `receiver`: [first, end) of what the origin sent, and of
    what the receiver got."""
    count = [[sum(destination(r, world, t) == d for t in range(TOKENS)) for d in range(world)] for r in range(world)]
    sent = sum(count[q][origin] for q in range(receiver))
    got = sum(count[receiver][d] for d in range(origin))
    n = count[receiver][origin]
    return [sent, sent + n], [got, got + n]


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("mode", ["replayable", "stats"])
def test_the_walk_crosses_the_rows_to_the_expert_that_exploded(tmp_path, world, mode):
    run = tmp_path / "run"
    run_ranks(STEP.replace("MODE", repr(mode)), run, world)
    origin = world // 2
    rc, out = moerr_cli("bisect", run, "--json")
    assert rc == 1, out
    found = json.loads(out)[0]
    ranks = {r["rank"]: r for r in found["ranks"]}
    # Every rank overflowed, and each first overflow arrived or was received:
    # the rank-level order alone would name rank 0.
    assert sorted(ranks) == list(range(world)), ranks
    assert all(r["arrived"] or r["received"] for r in ranks.values()), ranks
    assert ranks[origin]["arrived"], ranks
    # The walk: from the origin's expert, through the combine all_to_all's
    # rows, to the rank the walk started on.
    assert found["rank"] == origin, found
    assert found["cause"]["op"] == "aten::linear" and found["cause"]["found_explosion"], found["cause"]
    assert found["cause"]["module"] == "blocks.0.moe.experts.0.down", found["cause"]
    assert not found["path_stopped"], found
    start, cross, end = found["path"]
    assert start["rank"] == origin and start["op"] == "aten::linear", start
    receiver = found["started_on"]["rank"]
    assert receiver != origin and end["rank"] == receiver, found
    assert found["started_on"]["op"] == "aten::layer_norm" and end["module"] == "blocks.1.norm", found
    assert cross["collective"] == "all_to_all" and cross["module"] == "blocks.0.moe", cross
    assert cross["from"] == origin and cross["to"] == receiver and not cross["ambiguous"], cross
    assert cross["evidence"] == ("values" if mode == "replayable" else "whole inputs"), cross
    sent, got = combine_rows(world, origin, receiver)
    assert [(c["rank"], c["sent_rows"], c["received_rows"]) for c in cross["carriers"]] == [(origin, sent, got)], cross
    assert found["carried"]["seq"] == cross["seq"], found
    rc, text = moerr_cli("bisect", run)
    assert rc == 1, text
    assert f"step 0: the overflow began on rank {origin} of {world}" in text, text
    assert (f"path: rank {origin} aten::linear in blocks.0.moe.experts.0.down -> all_to_all #{cross['seq']} in world "
            f"(rows {sent[0]}-{sent[1] - 1} to rank {receiver}) -> rank {receiver} aten::layer_norm in blocks.1.norm"
            in text), text
    assert f"from rank {origin}: its rows {sent[0]}-{sent[1] - 1}, rows {got[0]}-{got[1] - 1} there" in text, text


def test_reduce_takes_the_rank_where_an_op_made_the_overflow(tmp_path):
    """The origin's own first overflow arrived in a collective, so `reduce
    RUN` reduces the rank the walk started on, whose layer_norm overflows
    from finite inputs; the origin's bundle alone is refused, naming the
    collective."""
    world, run = 4, tmp_path / "run"
    run_ranks(STEP.replace("MODE", repr("replayable")), run, world)
    origin = world // 2
    rc, out = moerr_cli("bisect", run, "--json")
    receiver = json.loads(out)[0]["started_on"]["rank"]
    p = subprocess.run([MOERR, "reduce", str(run), "-o", str(tmp_path / "small.moerr"), "--json"],
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert p.returncode == 0, p.stdout + p.stderr
    assert json.loads(p.stdout)["rank"] == receiver, p.stdout
    assert f"reducing rank {receiver}" in p.stderr and f"the overflow began on rank {origin}" in p.stderr, p.stderr
    rc, out = moerr_cli("reduce", run / f"rank{origin}.moerr", "-o", tmp_path / "origin.moerr")
    assert rc == 2, out
    assert "c10d::all_to_all" in out and "a collective: its peers made them" in out, out
    assert not (tmp_path / "origin.moerr").exists()
