"""Real torch.distributed gloo jobs whose c10d Flight Recorder (FR) dumps
feed the flight-recorder importer tests: one pickle per rank, named
``nccl_trace_rank_<rank>`` (torch's default dump prefix, so torch's own
analyzer, torch/distributed/flight_recorder, infers it).

    python flight_recorder_jobs.py OUT --ranks N --scenario S [--json]

Scenarios ("odd" rank: 2 at 4 ranks, 1 at 2 ranks; "killed" rank: 3 at 4
ranks, 1 at 2 ranks). Every rank runs the same prelude (all_reduce,
all_gather, all_to_all_single, broadcast, reduce_scatter_tensor, and an
all_reduce in a second group made with dist.new_group(all ranks)), then
three "gradient bucket" all_reduces; the scenarios differ in bucket 1:

  ok     every rank runs bucket 1 as all_reduce.
  skip   the odd rank skips bucket 1.
  kind   the odd rank calls all_gather in bucket 1.
  sizes  the odd rank all_reduces a tensor of another size in bucket 1.
  kill   the killed rank SIGKILLs itself just before bucket 1; its dump is
         missing.
  beside as "kind", with moerr.record running too (python package on
         PYTHONPATH): after the prelude every rank enters moerr.record(OUT +
         "_moerr"), which writes rank<K>.moerr there, and runs one step of a
         model whose modules layers.0 and layers.1 each call a collective in
         their forward, the odd rank an all_gather in layers.1 where its peer
         all_reduces. Flight Recorder sees the collectives of the prelude and
         moerr.record's own start too; moerr numbers from the recording's
         start.

What gloo does (torch 2.11, CPU): it pairs collectives by their tag, i.e.
by per-group call order, never by kind, size or call site. In "skip" the
odd rank's bucket 2 pairs with the others' bucket 1 and completes silently;
the others' bucket 2 then waits for a peer that will never come, and each
raises "Timed out waiting 5000ms" (the odd rank lingers, see below, so the
peers see a timeout; the first rank to time out closes its pairs, so a
neighbour may report "Connection closed by peer" instead). In "kind" the
all_gather and the all_reduces exchange mismatched messages and every rank
times out. In "sizes" the neighbour that receives the odd rank's bigger
chunks dies at once: gloo's "op.preamble.length <= op.nbytes" enforce
throws on its I/O thread, std::terminate, SIGABRT, uncatchable from Python;
the others then fail with "Connection reset" or a timeout. In "kill" the
peers of the dead rank see "Connection reset by peer" or a timeout.

Dumps on failure (all dumps hold the full FR buffer, including the
failing collective, which FR records when it is enqueued): this torch does NOT dump FR by itself on a gloo timeout.
TORCH_FR_DUMP_ON_TIMEOUT / TORCH_NCCL_DUMP_ON_TIMEOUT with
TORCH_FR_DUMP_TEMP_FILE / TORCH_NCCL_DEBUG_INFO_TEMP_FILE were set in a
trial and no file appeared: the dump-on-timeout path belongs to
ProcessGroupNCCL's watchdog (the NCCL variable is only read in
libtorch_cuda / libtorch_python), and ProcessGroupGloo has no watchdog; it
just raises from wait(). So each rank catches the collective's exception,
calls torch._C._distributed_c10d._dump_fr_trace() itself and writes the
file, exactly what a job's own error handler would do. For the rank gloo
aborts in "sizes", a stall watchdog thread (below) writes the dump first:
the odd rank calls its oversized all_reduce ODD_DELAY_S late, so that every
peer has been stuck STALL_S and has dumped before the abort.

Gloo specifics visible in the dumps: every entry stays in state
"scheduled" (gloo never marks FR entries started/completed), send/recv are
not recorded, pg_config is {'': {'name': '', 'desc': '', 'ranks': '[]'}},
reduce_scatter_tensor is recorded as one 'gloo:all_reduce' of the whole
input (gloo emulates it), and all_gather / all_to_all_single record as
'gloo:all_gather' / 'gloo:all_to_all'. dist.barrier would record
'gloo:barrier', which torch's analyzer rejects as unsupported, so no job
uses it (ranks meet through the store instead).

With --json, the JSON variant (_dump_fr_trace_json) of each dump is
written to the sibling directory ``OUT_json`` under the same names plus
".json": torch's read_dir walks OUT recursively and would try to unpickle
any file holding the prefix, so OUT holds the pickles only.
"""
import argparse
import datetime
import functools
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time

DUMP_PREFIX = "nccl_trace_rank_"
SCENARIOS = ("ok", "skip", "kind", "sizes", "kill", "beside")
TIMEOUT_S = 5           # collective timeout given to init_process_group
LINGER_S = TIMEOUT_S + 3   # how long a finished rank waits for its peers
JOB_DEADLINE_S = 25     # the parent kills whatever still runs after this
NUMEL = 8               # elements of every "normal" tensor


def odd_rank(world):
    """The rank that misbehaves in skip/kind/sizes (2 at 4 ranks, 1 at 2)."""
    return 2 if world > 2 else 1


def killed_rank(world):
    """The rank SIGKILLed in the kill scenario (3 at 4 ranks, 1 at 2)."""
    return min(3, world - 1)


def free_port():
    """A TCP port free right now (the tiny race until rank 0 binds it is
    acceptable for tests)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- stall watchdog ------------------------------------------------------
# gloo kills a rank outright (C++ std::terminate, SIGABRT) when it receives
# more bytes than it posted, e.g. from a peer all_reducing a bigger tensor;
# Python cannot catch that. Like NCCL's watchdog, a thread therefore dumps
# FR when the main thread has been inside one collective for STALL_S; the
# final dump, written if the process survives, overwrites it. A dump takes
# about 1.4 s when 4 ranks dump at once on 2 cores (it symbolizes frames).
STALL_S = 0.5
ODD_DELAY_S = 3.0       # < TIMEOUT_S, > STALL_S + a dump's duration
_in_flight = {"since": None, "dumped": False, "final": False}
_dump_lock = threading.Lock()   # one writer at a time; final wins


def collective(fn):
    """Mark fn as a collective call for the stall watchdog."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        _in_flight.update(since=time.monotonic(), dumped=False)
        try:
            return fn(*args, **kwargs)
        finally:
            _in_flight["since"] = None
    return wrapper


def say(line):
    """One write per line, so that lines of concurrent ranks do not mix."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def stall_watchdog(rank, out_dir, as_json):
    while True:
        time.sleep(0.05)
        since = _in_flight["since"]
        if since is None or _in_flight["dumped"] or time.monotonic() - since < STALL_S:
            continue
        _in_flight["dumped"] = True
        with _dump_lock:
            if _in_flight["final"]:
                return
            path, count = write_dumps(rank, out_dir, as_json)
        say(f"rank {rank}: watchdog wrote {path} ({count} entries; stalled {STALL_S} s)")


# --- collectives: one function each, so every call site (and FR frame) is
# --- on its own line ------------------------------------------------------

@collective
def warmup_all_reduce(dist, torch, world):
    dist.all_reduce(torch.ones(NUMEL))


@collective
def prelude_all_gather(dist, torch, world):
    dist.all_gather([torch.zeros(NUMEL) for _ in range(world)], torch.ones(NUMEL))


@collective
def prelude_all_to_all(dist, torch, world):
    dist.all_to_all_single(torch.zeros(NUMEL * world), torch.ones(NUMEL * world))


@collective
def prelude_broadcast(dist, torch, world):
    dist.broadcast(torch.ones(NUMEL), src=0)


@collective
def prelude_reduce_scatter(dist, torch, world):
    # Gloo emulates this: FR records one 'gloo:all_reduce' of NUMEL*world.
    dist.reduce_scatter_tensor(torch.zeros(NUMEL), torch.ones(NUMEL * world))


@collective
def subgroup_all_reduce(dist, torch, world, group):
    dist.all_reduce(torch.ones(NUMEL), group=group)


@collective
def bucket_all_reduce(dist, torch, world, bucket):
    dist.all_reduce(torch.full((NUMEL,), float(bucket)))


@collective
def odd_bucket_all_gather(dist, torch, world):
    dist.all_gather([torch.zeros(NUMEL) for _ in range(world)], torch.ones(NUMEL))


@collective
def odd_bucket_all_reduce_resized(dist, torch, world):
    dist.all_reduce(torch.ones(2 * NUMEL))


def prelude(dist, torch, world):
    warmup_all_reduce(dist, torch, world)
    prelude_all_gather(dist, torch, world)
    prelude_all_to_all(dist, torch, world)
    prelude_broadcast(dist, torch, world)
    prelude_reduce_scatter(dist, torch, world)
    # new_group is itself collective (store based, not recorded by FR).
    subgroup_all_reduce(dist, torch, world, dist.new_group(list(range(world))))


def middle_bucket(dist, torch, rank, world, scenario):
    """Bucket 1, where the scenarios differ."""
    if scenario == "kill" and rank == killed_rank(world):
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    odd = rank == odd_rank(world)
    if odd and scenario == "skip":
        return
    if odd and scenario == "kind":
        odd_bucket_all_gather(dist, torch, world)
    elif odd and scenario == "sizes":
        # Late, so that the peers' watchdogs dump before its oversized
        # chunks make gloo abort them.
        time.sleep(ODD_DELAY_S)
        odd_bucket_all_reduce_resized(dist, torch, world)
    else:
        bucket_all_reduce(dist, torch, world, 1)


def beside_model(dist, torch, rank, world):
    """Two layers, each a module whose forward calls a collective: the odd
    rank's layers.1 all_gathers where its peers all_reduce."""
    class Layer(torch.nn.Module):
        def __init__(self, odd):
            super().__init__()
            self.odd = odd

        def forward(self, x):
            if self.odd:
                odd_bucket_all_gather(dist, torch, world)
            else:
                bucket_all_reduce(dist, torch, world, 1)
            return x * 2

    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([Layer(False), Layer(rank == odd_rank(world))])
    return model


def run_beside(dist, torch, rank, world, out_dir):
    import moerr
    model = beside_model(dist, torch, rank, world)
    moerr.instrument(model)
    with moerr.record(out_dir.rstrip("/") + "_moerr", overwrite=True) as rec:
        with rec.step():
            x = torch.ones(NUMEL)
            for layer in model.layers:
                x = layer(x)


def run_scenario(dist, torch, rank, world, scenario, out_dir):
    prelude(dist, torch, world)
    if scenario == "beside":
        run_beside(dist, torch, rank, world, out_dir)
        return
    bucket_all_reduce(dist, torch, world, 0)
    middle_bucket(dist, torch, rank, world, scenario)
    bucket_all_reduce(dist, torch, world, 2)


# --- one rank ------------------------------------------------------------

def write_dumps(rank, out_dir, as_json):
    """Write this process's FR buffer; returns (path, entry count)."""
    import pickle
    from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json
    blob = _dump_fr_trace()
    path = os.path.join(out_dir, f"{DUMP_PREFIX}{rank}")
    with open(path, "wb") as f:
        f.write(blob)
    if as_json:
        json_path = os.path.join(out_dir.rstrip("/") + "_json", f"{DUMP_PREFIX}{rank}.json")
        os.makedirs(os.path.dirname(json_path), exist_ok=True)
        with open(json_path, "wb") as f:   # the binding returns bytes
            f.write(_dump_fr_trace_json())
    return path, len(pickle.loads(blob)["entries"])


def wait_count(store, key, target, deadline):
    while store.add(key, 0) < target and time.monotonic() < deadline:
        time.sleep(0.05)


def linger(rank, expected):
    """Keep this process (and its gloo sockets) alive until `expected` ranks
    have dumped or LINGER_S passed, so that a rank that finished early does
    not turn its peers' timeout into "connection closed by peer". Uses the
    default group's store, never a collective (which would itself hang).
    Rank 0 hosts the store, so it leaves last: it also waits for the others
    to say they stopped using the store ("fr_left")."""
    import torch.distributed as dist
    store = dist.distributed_c10d._get_default_store()
    deadline = time.monotonic() + LINGER_S
    try:
        store.add("fr_dumped", 1)
        wait_count(store, "fr_dumped", expected, deadline)
        if rank == 0:
            wait_count(store, "fr_left", expected - 1, deadline)
        else:
            store.add("fr_left", 1)
    except Exception:   # the store's host is gone: nothing left to wait for
        pass


def rank_main(rank, world, scenario, out_dir, port, as_json, outcomes):
    """Child process body. Invariant: it always leaves through os._exit, so
    no destroy_process_group / atexit hook can hang on a broken group."""
    os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"   # must precede init
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    # The first FR dump lazily imports torch._inductor (seconds on a busy
    # 2-core box, under the GIL); pay that now, not when a dump must be fast.
    torch._C._distributed_c10d._dump_fr_trace()
    threading.Thread(target=stall_watchdog, args=(rank, out_dir, as_json), daemon=True).start()
    outcome = "completed"
    try:
        run_scenario(dist, torch, rank, world, scenario, out_dir)
    except Exception as exc:   # gloo raises RuntimeError / DistBackendError
        outcome = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    with _dump_lock:
        _in_flight["final"] = True
        path, count = write_dumps(rank, out_dir, as_json)
    say(f"rank {rank}: wrote {path} ({count} entries; {outcome})")
    outcomes.put((rank, outcome))
    linger(rank, world - (scenario == "kill"))
    os._exit(0)


# --- the job -------------------------------------------------------------

def expected_ranks(world, scenario):
    """Ranks whose dump must exist after the job."""
    dead = {killed_rank(world)} if scenario == "kill" else set()
    return [r for r in range(world) if r not in dead]


def allowed_exits(rank, world, scenario):
    """Exit codes a rank may end with: 0, or -SIGKILL for the killed rank,
    or -SIGABRT in "sizes", where gloo aborts the receiver of the oversized
    chunks (its dump then comes from the stall watchdog)."""
    if scenario == "kill" and rank == killed_rank(world):
        return {-signal.SIGKILL}
    return {0, -signal.SIGABRT} if scenario == "sizes" else {0}


def reap(procs, deadline):
    """Join every child by the deadline, then SIGKILL any leftover."""
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()


def run_job(out_dir, world, scenario, as_json=False):
    """Run one job; returns a dict with wall time, per-rank outcome and exit
    code, and whether every expected dump exists."""
    assert scenario in SCENARIOS and world >= 2
    os.makedirs(out_dir, exist_ok=True)
    for r in range(world):   # a stale dump must never pass for a new one
        stale = os.path.join(out_dir, f"{DUMP_PREFIX}{r}")
        if os.path.exists(stale):
            os.remove(stale)
    ctx = multiprocessing.get_context("spawn")
    outcomes = ctx.Queue()
    port = free_port()
    start = time.monotonic()
    procs = [ctx.Process(target=rank_main, args=(r, world, scenario, out_dir, port, as_json, outcomes))
             for r in range(world)]
    for p in procs:
        p.start()
    reap(procs, start + JOB_DEADLINE_S)
    wall = time.monotonic() - start
    got = {}
    while not outcomes.empty():
        rank, outcome = outcomes.get()
        got[rank] = outcome
    present = [r for r in range(world) if os.path.exists(os.path.join(out_dir, f"{DUMP_PREFIX}{r}"))]
    exitcodes = [p.exitcode for p in procs]
    # Success: every expected rank dumped and exited cleanly; a killed rank
    # died by SIGKILL (exit code -9), not by the parent's reaping.
    want = expected_ranks(world, scenario)
    clean = all(exitcodes[r] in allowed_exits(r, world, scenario) for r in range(world))
    return {"scenario": scenario, "ranks": world, "wall_s": round(wall, 2),
            "outcomes": got, "exitcodes": exitcodes, "dumps": present,
            "ok": clean and set(want) <= set(present)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--scenario", choices=SCENARIOS, default="ok")
    parser.add_argument("--json", action="store_true", help="also write OUT_json/<prefix><rank>.json")
    args = parser.parse_args(argv)
    result = run_job(args.out, args.ranks, args.scenario, args.json)
    print(f"job {args.scenario} x{args.ranks}: {result['wall_s']} s, dumps {result['dumps']}, "
          f"exit codes {result['exitcodes']}", file=sys.stderr)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
