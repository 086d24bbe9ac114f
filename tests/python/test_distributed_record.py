"""moerr.record inside a torch.distributed loop: two real rank processes over
Gloo on 127.0.0.1 write one bundle per rank and world.json; each rank
replays alone bitwise with its collectives served from the record, and the
cross-rank check finds what every rank received equal to what was sent.

Run by ctest with PYTHONPATH=BUILD/python and MOERR_BIN=the moerr binary."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

import moerr

MOERR = os.environ.get("MOERR_BIN", "moerr")
TIMEOUT = 120  # seconds per process: a hung rank fails the test, never the suite


def run_ranks(code, run_dir, world=2):
    """Runs `code` (Python, with RUN the run directory and INIT the
    rendezvous: a FileStore next to it, so no port can be taken) in `world`
    rank processes; returns their outputs once all exited 0."""
    env = dict(os.environ, WORLD_SIZE=str(world), GLOO_SOCKET_IFNAME="lo",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    store = f"{run_dir}.store"
    prelude = f"import os\nRUN = {str(run_dir)!r}\nINIT = {'file://' + store!r}\n"
    procs = [subprocess.Popen([sys.executable, "-c", prelude + textwrap.dedent(code)],
                              env=dict(env, RANK=str(r)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    outputs = []
    for r, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"rank {r} still running after {TIMEOUT} s")
        outputs.append(out)
        assert p.returncode == 0, f"rank {r} exited {p.returncode}:\n{out}"
    return outputs


def moerr_cli(*args):
    p = subprocess.run([MOERR, *map(str, args)], capture_output=True, text=True, timeout=TIMEOUT)
    return p.returncode, p.stdout + p.stderr


@pytest.fixture(scope="module")
def ep_run(tmp_path_factory):
    """examples.py's two-rank expert-parallel step, recorded."""
    run = tmp_path_factory.mktemp("ep") / "run"
    out = run_ranks("from moerr.examples import expert_parallel_main\n"
                    "expert_parallel_main(RUN, init_method=INIT)\n", run)
    assert "step 0: loss" in out[0]
    return run


def test_one_bundle_per_rank_and_the_manifest(ep_run):
    assert sorted(os.listdir(ep_run)) == ["rank0.moerr", "rank1.moerr", "world.json"]
    world = json.loads((ep_run / "world.json").read_text())
    assert world["world_size"] == 2 and world["ep_size"] == 2 and world["experts"] == 4
    assert world["groups"]["world"] == [[0, 1]]
    assert [r["experts"] for r in world["ranks"]] == [[0, 1], [2, 3]]
    for rank in (0, 1):
        names = [op["name"] for op in moerr.Bundle(ep_run / f"rank{rank}.moerr").ops(0)]
        # counts, rows there and back, their gradients back and there; 5 dense grads; the losses
        assert names.count("c10d::all_to_all") == 5
        assert names.count("c10d::all_reduce") == 5
        assert names.count("c10d::all_gather") == 1
        assert not [n for n in names if n.startswith("c10d::") and n.endswith("_")], "the dispatcher's c10d op leaked"


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_replays_alone_bitwise(ep_run, rank):
    rc, out = moerr_cli("replay", ep_run, "--rank", rank)
    assert rc == 0, out
    assert "outputs compared, 0 differ" in out and "c10d::all_to_all x5" in out, out


def test_replay_of_the_run_checks_every_transfer(ep_run):
    rc, out = moerr_cli("replay", ep_run)
    assert rc == 0, out
    assert out.count("0 differ") == 2, out
    assert "cross-rank check of 22 collective records: every rank received what was sent" in out, out


def test_fewer_ranks_say_the_loop_cannot_be_rebuilt(ep_run):
    # The loop's own model is not one moerr rebuilds: said before any rank starts.
    for args in (["--ranks", 1], ["--ranks", 2]):
        rc, out = moerr_cli("replay", ep_run, *args)
        assert rc == 2, out
        assert "cannot rebuild this run's model" in out and f"moerr replay {ep_run} --rank K" in out, out
        assert "moerr.record(RUN, model=model, hf_config=config)" in out, out
        assert "launching" not in out, out
    rc, out = moerr_cli("proxy", ep_run, "--keep", "1/2", "-o", ep_run.parent / "proxy")
    assert rc == 2 and "model replay needs a bundle recorded from the reference trainer" in out, out


def test_bisect_reads_the_run(ep_run):
    rc, out = moerr_cli("bisect", ep_run, "--json")
    assert rc == 0, out
    assert json.loads(out) == [{"found": False, "step": 0}]


SUBGROUPS = """
import torch, torch.distributed as dist, moerr
dist.init_process_group("gloo", init_method=INIT, rank=int(os.environ["RANK"]), world_size=2)
rank = dist.get_rank()
both, second = dist.new_group([0, 1]), dist.new_group([1])
real = dist.all_reduce
from torch.distributed import all_reduce as imported_before  # recorded all the same: from the dispatcher
with moerr.record(RUN, overwrite=True) as rec:
    assert dist.all_reduce is real
    with rec.step():
        x = torch.arange(6.0).reshape(3, 2) * (rank + 1)
        dist.broadcast(x, 1, group=both)            # group rank 1 sends
        work = imported_before(x, async_op=True)    # asynchronous: torch's own work
        assert type(work) is dist.Work, type(work)
        work.wait()
        out = torch.empty(4, 2)
        dist.all_to_all_single(out, torch.cat([x, x[:1]]) + rank, [2, 2], [2, 2])
        if rank == 1:
            dist.all_reduce(out, group=second)       # a group rank 0 is not in
        gathered = torch.empty(2, 4, 2)
        dist.all_gather(list(gathered.unbind(0)), out)  # into views of one buffer
        y = (gathered * 2).sum(0)
        dist.barrier()
        dist.reduce(y, 0)
        if rank == 0:
            dist.send(y, 1)
        else:
            dist.recv(y, 0)
        names = [None, None]
        dist.all_gather_object(names, f"rank {rank}")   # objects: not recorded
        assert names == ["rank 0", "rank 1"]
        try:
            dist.gather(y, [torch.empty_like(y), torch.empty_like(y)] if rank == 0 else None)
        except RuntimeError as e:
            assert "not recorded" in str(e)
        (y + 1).sum()
assert dist.all_reduce is real
try:
    with moerr.record(RUN):
        pass
except FileExistsError as e:
    print("refused:", e)
dist.destroy_process_group()
"""


def test_subgroups_async_and_refusal(tmp_path):
    run = tmp_path / "run"
    outputs = run_ranks(SUBGROUPS, run)
    assert all("refused:" in out for out in outputs), outputs
    world = json.loads((run / "world.json").read_text())
    assert world["groups"] == {"world": [[0, 1]], "ranks:0,1": [[0, 1]], "ranks:1": [[1]]}
    assert world["ep_size"] == 1 and world["experts"] == 0
    groups = {rank: [(op["name"]) for op in moerr.Bundle(run / f"rank{rank}.moerr").ops(0)
                     if op["name"].startswith("c10d::")] for rank in (0, 1)}
    common = ["c10d::broadcast", "c10d::all_reduce", "c10d::all_to_all"]
    after = ["c10d::all_gather", "c10d::barrier", "c10d::reduce"]
    assert groups[0] == common + after + ["c10d::send"]
    assert groups[1] == common + ["c10d::all_reduce"] + after + ["c10d::recv"]
    for rank in (0, 1):
        # The async all_reduce takes its place when its work completed: the
        # ops after the wait read what arrived.
        ops = moerr.Bundle(run / f"rank{rank}.moerr").ops(0)
        reduce = next(op for op in ops if op["name"] == "c10d::all_reduce")
        arrived = reduce["outputs"][0]["id"]
        reads = [op for op in ops[reduce["index"] + 1:] if op["name"] == "aten::slice"]
        assert reads and reads[0]["args"][0]["value"] == arrived, ops
        # The all_gather into views of one buffer arrived as the whole
        # buffer: what reads the buffer next reads a view of it.
        gather = next(op for op in ops if op["name"] == "c10d::all_gather")
        doubled = next(op for op in ops[gather["index"] + 1:] if op["name"] == "aten::mul")
        read = moerr.Bundle(run / f"rank{rank}.moerr").tensor_meta(0, doubled["args"][0]["value"])
        assert read["view_of"] == gather["outputs"][0]["id"], (read, gather)
    rc, out = moerr_cli("replay", run)
    assert rc == 0, out
    assert out.count("0 differ") == 2 and "every rank received what was sent" in out, out


DDP = """
import torch, torch.distributed as dist, moerr
from torch.nn.parallel import DistributedDataParallel
dist.init_process_group("gloo", init_method=INIT, rank=int(os.environ["RANK"]), world_size=2)
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with moerr.record(RUN, overwrite=True) as rec:
    with rec.step():
        x = torch.arange(12.0).reshape(3, 4) / 10 + rank
        model(x).square().sum().backward()   # DDP's reducer all-reduces the gradients from C++
        with moerr.scope("optimizer"):
            opt.step()
print("weight", rank, model.module[0].weight.sum().item())
dist.destroy_process_group()
"""


def test_ddp_gradients_are_recorded_from_the_dispatcher(tmp_path):
    """DDP's reducer calls the process group from C++, in backward: no
    Python function is called, and the dispatcher's op is recorded."""
    run = tmp_path / "run"
    outputs = run_ranks(DDP, run)
    weights = [out.split("weight %d " % r)[1].split()[0] for r, out in enumerate(outputs)]
    assert weights[0] == weights[1], outputs  # the gradients were averaged
    for rank in (0, 1):
        ops = moerr.Bundle(run / f"rank{rank}.moerr").ops(0)
        reduced = [op for op in ops if op["name"] == "c10d::all_reduce"]
        assert [op["phase"] for op in reduced] == ["backward"], ops
        # The reducer waits on the work's future, then reads the bucket:
        # what it reads is what arrived.
        arrived = reduced[0]["outputs"][0]["id"]
        reads = [op for op in ops[reduced[0]["index"] + 1:] if op["args"] and op["args"][0]["kind"] == "tensor"]
        assert reads and reads[0]["args"][0]["value"] == arrived, ops
    rc, out = moerr_cli("replay", run)
    assert rc == 0, out
    assert out.count(" 0 differ") == 2 and "every rank received what was sent" in out, out


PEER_DIES = """
import datetime, torch, torch.distributed as dist, moerr
dist.init_process_group("gloo", init_method=INIT, rank=int(os.environ["RANK"]), world_size=2,
                        timeout=datetime.timedelta(seconds=5))
rank = dist.get_rank()
x = torch.ones(4)
with moerr.record(RUN, overwrite=True) as rec:
    try:
        with rec.step():
            with moerr.scope("model.layers.0.mlp"):
                dist.all_reduce(x)
                if rank == 1:
                    os._exit(0)                       # dies inside the step
                work = dist.all_reduce(x * 2, async_op=True)
                work.wait()                           # rank 0: the peer is gone
    except RuntimeError as e:
        print("raised:", str(e).splitlines()[0][:80])
"""


def test_a_collective_whose_peer_died_is_the_one_this_rank_waited_in(tmp_path):
    run = tmp_path / "run"
    outputs = run_ranks(PEER_DIES, run)
    assert "raised:" in outputs[0], outputs
    failed = moerr.Bundle(run / "rank0.moerr").annotation("collective_failed")
    assert failed["kind"] == "all_reduce" and failed["group"] == "world" and failed["seq"] == 1, failed
    assert failed["module"] == "model.layers.0.mlp", failed
    rc, out = moerr_cli("inspect", run)
    assert "rank 0" in out and "all_reduce #1 in world" in out, out


UNWAITED = """
import time, torch, torch.distributed as dist, moerr
dist.init_process_group("gloo", init_method=INIT, rank=int(os.environ["RANK"]), world_size=2)
rank = dist.get_rank()
x = torch.ones(4)
with moerr.record(RUN, overwrite=True) as rec:
    with rec.step():
        if rank == 1:
            time.sleep(1.0)                      # rank 0's stays in flight past its recording
        work = dist.all_reduce(x, async_op=True)
        y = torch.ones(3) * 2
work.wait()                                      # after rank 0's recorder is gone
print("sum", rank, x.sum().item())
dist.destroy_process_group()
"""


def test_a_collective_in_flight_when_the_recording_stops_is_left_alone(tmp_path):
    run = tmp_path / "run"
    outputs = run_ranks(UNWAITED, run)
    assert "sum 0 8.0" in outputs[0], outputs
    names = [op["name"] for op in moerr.Bundle(run / "rank0.moerr").ops(0)]
    assert "c10d::all_reduce" not in names and "aten::mul" in names, names
    rc, out = moerr_cli("replay", run / "rank0.moerr")
    assert rc == 0 and " 0 differ" in out, out


TENSOR_COLLECTIVES = """
import torch, torch.distributed as dist, moerr
dist.init_process_group("gloo", init_method=INIT, rank=int(os.environ["RANK"]), world_size=2)
rank = dist.get_rank()
with moerr.record(RUN, overwrite=True) as rec:
    with rec.step():
        x = torch.arange(8.0).reshape(4, 2) * (rank + 1)
        half = torch.empty(2, 2)
        dist.reduce_scatter_tensor(half, x)                  # rows 2r, 2r+1 summed
        listed = torch.empty(2, 2)
        dist.reduce_scatter(listed, list((x + 1).chunk(2)))
        both = torch.empty(4, 2)
        dist.all_gather_into_tensor(both, half + listed)
        b = (both * 0.5).to(torch.bfloat16)
        dist.all_reduce(b)                                   # bf16 over Gloo, as bf16
        pair = [x.clone(), half.clone()]
        dist.all_reduce_coalesced(pair)                      # Gloo's work for it has no future
        assert pair[0].equal(x * 3 / (rank + 1))
        print("result", rank, half.tolist(), listed.tolist(), b.dtype, b.float().sum().item())
dist.destroy_process_group()
"""


def test_reduce_scatter_all_gather_into_tensor_and_bf16_are_recorded(tmp_path):
    run = tmp_path / "run"
    outputs = run_ranks(TENSOR_COLLECTIVES, run)
    x = [[[float((2 * i + j) * (r + 1)) for j in range(2)] for i in range(4)] for r in range(2)]
    for rank, out in enumerate(outputs):
        summed = [[x[0][i][j] + x[1][i][j] for j in range(2)] for i in range(4)]
        assert f"result {rank} {summed[2 * rank:2 * rank + 2]}" in out, out
        assert "torch.bfloat16" in out, out
    kinds = {rank: [op["name"] for op in moerr.Bundle(run / f"rank{rank}.moerr").ops(0)
                    if op["name"].startswith("c10d::")] for rank in (0, 1)}
    assert kinds[0] == kinds[1] == ["c10d::reduce_scatter", "c10d::reduce_scatter", "c10d::all_gather",
                                    "c10d::all_reduce", "c10d::all_reduce"], kinds
    # Wrapped (reduce_scatter) and dispatched calls share one numbering.
    for rank in (0, 1):
        seqs = [op["args"][2]["value"] for op in moerr.Bundle(run / f"rank{rank}.moerr").ops(0)
                if op["name"].startswith("c10d::")]
        assert seqs == list(range(5)), seqs
    rc, out = moerr_cli("replay", run)
    assert rc == 0, out
    assert out.count("0 differ") == 2 and "every rank received what was sent" in out, out


def test_ep_layout_needs_torch_distributed(tmp_path):
    with pytest.raises(ValueError, match="torch.distributed"):
        with moerr.record(tmp_path / "x.moerr", ep_size=2, experts=4):
            pass


CORRUPT_LINK = """
import torch, torch.distributed as dist, moerr
dist.init_process_group("gloo", init_method=INIT, rank=int(os.environ["RANK"]), world_size=2)
rank = dist.get_rank()
real = dist.recv

def bad_link(tensor, *args, **kwargs):  # rank 1 receives rank 0's rows damaged
    work = real(tensor, *args, **kwargs)
    tensor[0] += 1
    return work

dist.recv = bad_link
with moerr.record(RUN, overwrite=True) as rec:
    with rec.step():
        x = torch.arange(8.0).reshape(4, 2) + 10 * rank
        out = torch.empty(4, 2)
        dist.all_to_all_single(out, x)
        if rank == 0:
            dist.send(out, 1)
        else:
            dist.recv(out, 0)
        out.sum()
dist.destroy_process_group()
"""


def test_cross_rank_check_names_a_corrupt_transfer(tmp_path):
    run = tmp_path / "run"
    run_ranks(CORRUPT_LINK, run)
    rc, out = moerr_cli("replay", run)
    assert rc != 0, out
    assert out.count("0 differ") == 2, out  # each rank replays what it received
    assert "cross-rank check of 4 collective records: MISMATCH" in out, out
    assert "recv #0 in p2p:0,1: rank 0 -> rank 1: the bytes differ: rank 0 sent hash" in out, out


def test_bad_collective_calls_are_refused(tmp_path):
    import torch
    from moerr import _moerr
    with pytest.raises(ValueError, match="splits must fit"):
        _moerr.CollectiveCall("all_to_all", "world", 0, 0, 2, -1, [-1, 3], [1, 1])
    with pytest.raises(ValueError, match="splits must fit"):
        _moerr.CollectiveCall("broadcast", "world", 0, 2, 2)
    rec = _moerr.Recorder(str(tmp_path / "x.moerr"), "replayable", "always", 0, 2**62, 2, 10.0, False)
    call = _moerr.CollectiveCall("all_to_all", "world", 0, 0, 2, -1, [1, 1], [1, 1])
    with pytest.raises(ValueError, match="send rows add up to 2"):
        rec.collective(call, [torch.zeros(3)], [torch.zeros(2)], False, lambda: None)
    rec.stop()


def test_bisect_crosses_the_all_to_all_to_the_rank_whose_expert_exploded(tmp_path):
    """Expert 2 (on rank 1) has its down projection scaled by 1e37 in fp32.
    Its large values reach rank 0 through the all_to_alls before anything
    overflows, so both ranks first overflow at the same op; rank 0's cause
    walk ends at a collective that received them. The origin is rank 1."""
    run = tmp_path / "run"
    run_ranks("from moerr.examples import expert_parallel_main\n"
              "expert_parallel_main(RUN, init_method=INIT, explode=2)\n", run)
    rc, out = moerr_cli("bisect", run, "--json")
    assert rc == 1, out
    found = json.loads(out)[0]
    assert found["rank"] == 1, found
    assert not found["cause"]["op"].startswith("c10d::") and found["cause"]["found_explosion"], found["cause"]
    ranks = {r["rank"]: r for r in found["ranks"]}
    assert ranks[0]["received"] and not ranks[1]["received"], ranks
    assert found["carried"]["kind"] == "all_to_all", found


FUNCTIONAL = """
import torch, torch.distributed as dist, moerr
import torch.distributed._functional_collectives as funcol
rank = int(os.environ["RANK"])
dist.init_process_group("gloo", init_method=INIT, rank=rank, world_size=2)
try:
    with moerr.record(RUN, mode=MODE, overwrite=True) as rec:
        with rec.step():
            x = (torch.arange(8.0) * (rank + 1)).requires_grad_()
            y = CALL
            torch.nn.functional.linear(y, torch.ones(3, 2)).sum().backward()
    print("recorded", rank)
except ValueError as e:
    print("refused", rank, e)
"""
CALLS = {
    # torch's function, replaced while recording (moerr/_functional.py).
    "function": "funcol.all_to_all_single_autograd(x.view(4, 2), None, None, dist.group.WORLD)",
    # Its op, called directly: an AsyncCollectiveTensor, no bytes until waited on.
    "op": "funcol._maybe_wrap_tensor(torch.ops._c10d_functional.all_to_all_single("
          "x.view(4, 2), [2, 2], [2, 2], funcol._resolve_group_name(dist.group.WORLD)))",
}


@pytest.mark.parametrize("mode", ["stats", "replayable"])
@pytest.mark.parametrize("call", ["function", "op"])
def test_functional_collectives_are_recorded_without_a_crash(tmp_path, mode, call):
    # torch's functional collectives (transformers' own expert parallelism
    # uses them): their functions are recorded as collectives, the
    # gradient's all_to_all too, and each rank replays alone. Called through
    # the op, its pending result has no bytes when the recorder reads it:
    # its fingerprint is marked unknown, and a replayable recording, which
    # must capture it, is refused by name. (Once, the recorder read the null
    # storage and both ranks segfaulted.)
    run = tmp_path / "run"
    out = run_ranks(FUNCTIONAL.replace("MODE", repr(mode)).replace("CALL", CALLS[call]), run)
    if mode == "replayable" and call == "op":
        assert all(f"refused {r}" in o and "its bytes are not readable here" in o for r, o in enumerate(out)), out
        return
    assert [f"recorded {r}" in o for r, o in enumerate(out)] == [True, True], out
    for rank in (0, 1):
        names = [op["name"] for op in moerr.Bundle(run / f"rank{rank}.moerr").ops(0)]
        assert "aten::linear" in names, names
        assert names.count("c10d::all_to_all") == (2 if call == "function" else 0), names
    rc, text = moerr_cli("inspect", run)
    assert rc == 0, text
    if mode == "replayable":
        rc, text = moerr_cli("replay", run, "--rank", 1)
        assert rc == 0 and "outputs compared, 0 differ" in text and "c10d::all_to_all x2" in text, text
