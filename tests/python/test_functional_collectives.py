"""torch's functional collectives (torch.distributed._functional_collectives)
inside moerr.record: an expert-parallel step whose dispatch and combine go
through funcol.all_to_all_single_autograd (the counts through
funcol.all_to_all_single, dense gradients averaged by funcol.all_reduce),
on two Gloo rank processes. Each call is recorded as the collective it is
(c10d::<kind>, what was sent and what arrived), backward included; each
rank replays alone bitwise; inspect checks their order; with one expert on
rank 1 scaled by 1e37 in fp32, bisect crosses the functional all_to_all
back to rank 1 and the expert's linear.

Run by ctest with PYTHONPATH=BUILD/python and MOERR_BIN=the moerr binary."""
import json

import pytest

import moerr
from test_distributed_record import moerr_cli, run_ranks

FUNCOL_EP = """
import torch, torch.nn as nn, torch.nn.functional as F, torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed._functional_collectives import all_to_all_single_autograd  # bound before record
import moerr
EXPLODE = EXPLODE_EXPERT
dist.init_process_group("gloo", init_method=INIT, rank=int(os.environ["RANK"]), world_size=2)
rank, world = dist.get_rank(), dist.get_world_size()
EXPERTS, D, TOP_K = 4, 16, 2
WORLD = dist.group.WORLD


class Expert(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(D, 2 * D, bias=False), nn.Linear(2 * D, D, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.up(x)))


class Moe(nn.Module):
    def __init__(self):
        super().__init__()
        self.per, self.top_k = EXPERTS // world, TOP_K
        self.expert_offset = rank * self.per  # moerr.instrument names a local expert by its global index
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
        arrived = funcol.all_to_all_single(counts, None, None, WORLD)
        send, recv = counts.sum(1).tolist(), arrived.sum(1).tolist()
        local_ids = torch.arange(self.per).repeat(world).repeat_interleave(arrived.reshape(-1))
        rows = all_to_all_single_autograd(flat[token], recv, send, WORLD)
        rows = funcol.wait_tensor(rows)
        out = torch.zeros_like(rows)
        for m, expert in enumerate(self.experts):
            row = (local_ids == m).nonzero(as_tuple=True)[0]
            out = out.index_add(0, row, expert(rows[row]))
        back = all_to_all_single_autograd(out, send, recv, WORLD)
        combined = torch.zeros_like(flat).index_add(0, token, back * weights.reshape(-1)[order].unsqueeze(1))
        return combined.view_as(x)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.moe = nn.LayerNorm(D), Moe()

    def forward(self, h):
        return h + self.moe(self.norm(h))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(32, D)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.norm, self.head = nn.LayerNorm(D), nn.Linear(D, 32, bias=False)

    def forward(self, tokens):
        h = self.embed(tokens)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


torch.manual_seed(0)
model = Model()
moerr.instrument(model)
if EXPLODE is not None and EXPLODE // (EXPERTS // world) == rank:  # the expert's rank scales its down projection
    with torch.no_grad():
        model.blocks[0].moe.experts[EXPLODE % (EXPERTS // world)].down.weight.mul_(1e37)
tokens = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(10 + rank))
with moerr.record(RUN, overwrite=True, ep_size=world, experts=EXPERTS) as rec:
    assert all_to_all_single_autograd.__module__ == "moerr._functional"  # replaced while recording
    with rec.step():
        logits = model(tokens)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, 32), tokens[:, 1:].reshape(-1))
        loss.backward()
        for name, p in model.named_parameters():
            if p.grad is not None and ".experts." not in name:
                p.grad.copy_(funcol.all_reduce(p.grad, "sum", WORLD) / world)
        rec.outcome(loss=loss.item())
assert all_to_all_single_autograd is funcol.all_to_all_single_autograd  # restored
assert all_to_all_single_autograd.__module__ == "torch.distributed._functional_collectives"
print(f"rank {rank} step 0: loss {loss.item():.6f}", flush=True)
dist.destroy_process_group()
"""


def record(run, explode=None):
    out = run_ranks(FUNCOL_EP.replace("EXPLODE_EXPERT", repr(explode)), run)
    assert all(f"rank {r} step 0: loss" in o for r, o in enumerate(out)), out
    return out


@pytest.fixture(scope="module")
def funcol_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("funcol") / "run"
    record(run)
    return run


def collectives(run, rank):
    return [(op["name"], op["phase"]) for op in moerr.Bundle(run / f"rank{rank}.moerr").ops(0)
            if op["name"].startswith(("c10d::", "_c10d_functional"))]


def test_functional_collectives_are_recorded_as_collectives(funcol_run):
    # Per block, forward: the counts, the rows there and back; backward,
    # blocks in reverse: the rows' gradients back and there. Then 10 dense
    # gradients (the embedding, per block the norm's weight and bias and
    # the gate, the final norm's two, the head).
    forward = [("c10d::all_to_all", "forward")] * 6
    backward = [("c10d::all_to_all", "backward")] * 4
    dense = [("c10d::all_reduce", "forward")] * 10
    for rank in (0, 1):
        assert collectives(funcol_run, rank) == forward + backward + dense, collectives(funcol_run, rank)


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_replays_alone_bitwise(funcol_run, rank):
    rc, out = moerr_cli("replay", funcol_run, "--rank", rank)
    assert rc == 0, out
    assert "outputs compared, 0 differ" in out, out
    assert "c10d::all_reduce x10, c10d::all_to_all x10" in out, out


def test_every_transfer_checks_and_inspect_orders_them(funcol_run):
    rc, out = moerr_cli("replay", funcol_run)
    assert rc == 0, out
    assert "cross-rank check of 40 collective records: every rank received what was sent" in out, out
    rc, out = moerr_cli("inspect", funcol_run, "--json")
    assert rc == 0, out
    report = json.loads(out)
    assert [r["collectives"] for r in report["ranks"]] == [20, 20], out
    (world,) = [g for g in report["collective_order"] if g["group"] == "world"]
    assert world["ranks"] == [0, 1] and world["first_disagreement"] == -1, world
    assert world["last_completed"] == 19 and world["last_completed_call"]["kind"] == "all_reduce", world
    rc, text = moerr_cli("inspect", funcol_run)
    assert "every rank completed all_reduce #19; the ranks agree on every collective" in text, text


def test_bisect_crosses_the_functional_all_to_all_to_rank_1(tmp_path):
    """Expert 2 (rank 1's first) has its down projection scaled by 1e37 in
    fp32: its output reaches rank 0 through the functional all_to_all."""
    run = tmp_path / "run"
    record(run, explode=2)
    rc, out = moerr_cli("bisect", run, "--json")
    assert rc == 1, out
    found = json.loads(out)[0]
    assert found["rank"] == 1, found
    cause = found["cause"]
    assert cause["found_explosion"] and cause["op"] == "aten::linear", cause
    assert cause["module"] == "blocks.0.moe.experts.2.down", cause
    assert found["carried"]["kind"] == "all_to_all", found
    ranks = {r["rank"]: r for r in found["ranks"]}
    assert ranks[0]["received"] and not ranks[1]["received"], ranks


EVERY_FUNCTION = """
import torch, torch.distributed as dist, moerr
import torch.distributed._functional_collectives as funcol
dist.init_process_group("gloo", init_method=INIT, rank=int(os.environ["RANK"]), world_size=2)
rank, WORLD = dist.get_rank(), dist.group.WORLD
SPLITS = [3, 1] if rank == 0 else [1, 3]  # rows kept, rows sent; rows kept, rows received


def step(wait):
    # Each function, and the gradients of those torch differentiates (the
    # reverse collective), as plain tensors. (torch's own wait_tensor fails
    # on an AsyncCollectiveTensor that requires grad: torch's results are
    # waited on by their first use.)
    x = (torch.arange(8.0).reshape(4, 2) * (rank + 1) - 5).requires_grad_()
    outs = [funcol.all_reduce(x, "max", WORLD),
            funcol.all_gather_tensor(x, 0, WORLD),
            funcol.all_gather_tensor(x, 1, WORLD),
            funcol.reduce_scatter_tensor(x, "sum", 0, WORLD),
            funcol.reduce_scatter_tensor(x, "sum", 1, WORLD),
            funcol.all_to_all_single(x, SPLITS, SPLITS, WORLD),
            funcol.broadcast(x, 1, WORLD)]
    outs = [wait(o) for o in outs]
    sum((o * (i + 1)).sum() for i, o in enumerate(outs[1:6])).backward()
    return [o.detach().clone() for o in outs] + [x.grad.clone()], {type(o).__name__ for o in outs}


theirs, types = step(lambda o: o)  # torch's own functional collectives
assert "AsyncCollectiveTensor" in types, types
with moerr.record(RUN, mode="replayable", overwrite=True) as rec:
    with rec.step():
        ours, types = step(funcol.wait_tensor)
assert types == {"Tensor"}, types  # received: their value exists
for i, (a, b) in enumerate(zip(theirs, ours)):
    assert a.shape == b.shape and torch.equal(a, b), (i, a, b)
print("bitwise equal", rank, len(ours))
dist.destroy_process_group()
"""


def test_every_function_gives_torchs_bytes_and_replays(tmp_path):
    run = tmp_path / "run"
    out = run_ranks(EVERY_FUNCTION, run)
    assert all(f"bitwise equal {r} 8" in o for r, o in enumerate(out)), out
    kinds = ["all_reduce", "all_gather", "all_gather", "reduce_scatter", "reduce_scatter", "all_to_all", "broadcast"]
    # backward, last output first: all_to_all's, reduce_scatter's (all_gather), all_gather's (reduce_scatter)
    backward = ["all_to_all", "all_gather", "all_gather", "reduce_scatter", "reduce_scatter"]
    for rank in (0, 1):
        assert collectives(run, rank) == ([("c10d::" + k, "forward") for k in kinds] +
                                          [("c10d::" + k, "backward") for k in backward]), collectives(run, rank)
    rc, out = moerr_cli("replay", run)
    assert rc == 0, out
    assert out.count("0 differ") == 2 and "cross-rank check of 24 collective records: every rank received" in out, out
