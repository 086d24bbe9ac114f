"""`moerr import fr` + `moerr inspect` of a large job's Flight Recorder
dumps against torch's own analyzer (torch.distributed.flight_recorder) on
the same files, in one script.

    bench_flight_recorder.py BUILD_DIR WORK_DIR [--ranks 64] [--entries 2000]

Writes --ranks dumps of --entries entries each, as NCCL's recorder lays them
out (pickles of plain data: one default group with pg_config, all_reduce,
all_gather, reduce_scatter and all_to_all in turn, 12 Python frames per
entry); rank 37 calls all_gather where the others all_reduce at
collective_seq_id 1500, so both tools have a desync to find. Times: moerr's
import and inspect (two processes, start-up included), torch's analyzer
in-process (read_dir + build_db) and as its CLI (`python -m
torch.distributed.flight_recorder.fr_trace`, interpreter and torch import
included). Floors: two moerr processes that do nothing, and Python's C
unpickler on the same files. Best of 3; moerr reads and writes a rank per
task on every core.

Then `inspect --beside`'s alignment (analysis/beside_run.h) on the same
import: build/bench/beside_bench writes a moerr recording of every rank's
collectives from collective_seq_id 6 on (BESIDE_OFFSET later in the dump)
and times the order analysis and the alignment (the recording's 64 bundles
read, and the offset fitted by the kinds' correlation)."""
import json
import os
import pickle
import shutil
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

KINDS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]
ODD_RANK, ODD_SEQ = 37, 1500
BESIDE_OFFSET = 5


def arg(name, default):
    return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


def entry(rank, world, seq):
    kind = KINDS[seq % len(KINDS)]
    if rank == ODD_RANK % world and seq == ODD_SEQ:
        kind = "all_gather" if kind != "all_gather" else "all_reduce"
    size = [1024, 4096]
    out = [world * 1024, 4096] if kind == "all_gather" else ([1024 // world, 4096] if kind == "reduce_scatter" else size)
    frames = [{"filename": "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py",
               "line": 2800 + (seq % 4), "name": kind}] + [
        {"filename": f"/job/train/layer{i}.py", "line": 100 + i, "name": f"f{i}"} for i in range(11)]
    return {"record_id": seq - 1, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": seq,
            "p2p_seq_id": 0, "op_id": seq, "profiling_name": f"nccl:{kind}", "time_created_ns": 10**18 + seq,
            "duration_ms": 1.5, "input_sizes": [size], "input_dtypes": ["BFloat16"], "output_sizes": [out],
            "output_dtypes": ["BFloat16"], "state": "completed" if seq < ODD_SEQ else "scheduled",
            "time_discovered_started_ns": 10**18 + seq, "time_discovered_completed_ns": None, "retired": True,
            "timeout_ms": 600000, "is_p2p": False, "frames": frames, "thread_id": "1", "thread_name": "python"}


def write_dumps(root, world, entries):
    os.makedirs(root, exist_ok=True)
    ranks = str(list(range(world)))
    for r in range(world):
        dump = {"version": "2.10", "comm_lib_version": "2.21.5",
                "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": ranks}},
                "pg_status": {"0": {"last_enqueued_collective": entries, "last_started_collective": ODD_SEQ,
                                    "last_completed_collective": ODD_SEQ - 1}},
                "entries": [entry(r, world, s) for s in range(1, entries + 1)]}
        with open(os.path.join(root, f"nccl_trace_rank_{r}"), "wb") as f:
            pickle.dump(dump, f, protocol=2)


def best(fn, rounds=3):
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return min(times), result


def moerr_run(moerr, dumps, run):
    subprocess.run([moerr, "import", "fr", dumps, "-o", run, "--force", "--json"], check=True, capture_output=True)
    out = subprocess.run([moerr, "inspect", run, "--json"], capture_output=True, text=True)
    assert out.returncode == 1, out.stderr
    return json.loads(out.stdout)["collective_order"][0]


def torch_in_process(dumps):
    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.config_manager import JobConfig
    from torch.distributed.flight_recorder.components.loader import read_dir
    args = JobConfig().parse_args([dumps])
    details, version = read_dir(args)
    db = build_db(details, args, version)
    return next(c for c in db.collectives if not c.pass_check)


def main():
    build, work = sys.argv[1], sys.argv[2]
    world, entries = arg("--ranks", 64), arg("--entries", 2000)
    moerr = os.path.join(build, "tools", "moerr")
    dumps, run = os.path.join(work, "dumps"), os.path.join(work, "run")
    write_dumps(dumps, world, entries)
    size = sum(os.path.getsize(os.path.join(dumps, f)) for f in os.listdir(dumps))
    moerr_s, ours = best(lambda: moerr_run(moerr, dumps, run))
    import logging
    logging.disable(logging.CRITICAL)  # torch's analyzer logs every mismatch it finds
    torch_s, theirs = best(lambda: torch_in_process(dumps))
    cli_s, _ = best(lambda: subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", dumps],
                                           capture_output=True, check=True), rounds=1)
    # Floors: a moerr process that does nothing (LibTorch's start-up), and
    # Python's C unpickler reading the same files.
    start_s, _ = best(lambda: subprocess.run([moerr, "--help"], capture_output=True, check=True))
    load_s, _ = best(lambda: [pickle.load(open(os.path.join(dumps, f), "rb")) for f in os.listdir(dumps)])
    beside = subprocess.run([os.path.join(build, "bench", "beside_bench"), run, os.path.join(work, "moerr_run"),
                             "--offset", str(BESIDE_OFFSET)], capture_output=True, text=True, check=True)
    beside = json.loads(beside.stdout)
    odd = [s for s in ours["sides"] if s["state"] != "waiting"]
    print(f"{world} ranks x {entries} entries, {size / 1e6:.0f} MB of pickles; rank {ODD_RANK % world} desyncs at "
          f"collective_seq_id {ODD_SEQ}; best of 3 (the CLI: one run); moerr on every core, torch on one\n")
    print("| analyzer | seconds | vs moerr |\n|---|---|---|")
    print(f"| `moerr import fr` + `moerr inspect --json` (two processes) | {moerr_s:.2f} | 1.0x |")
    print(f"| torch's analyzer in-process (read_dir + build_db) | {torch_s:.2f} | {torch_s / moerr_s:.1f}x |")
    print(f"| torchfrtrace CLI (`python -m torch.distributed.flight_recorder.fr_trace`) | {cli_s:.2f} | "
          f"{cli_s / moerr_s:.1f}x |")
    print(f"| floor: `moerr --help`, twice (process start-up, LibTorch's static init) | {2 * start_s:.2f} | "
          f"{2 * start_s / moerr_s:.1f}x |")
    print(f"| floor: Python's `pickle.load` of every dump | {load_s:.2f} | {load_s / moerr_s:.1f}x |")
    print(f"\n| `inspect --beside`, in-process (best of 3) | seconds |\n|---|---|")
    print(f"| order analysis (CheckCollectiveOrder) | {beside['order_s']:.2f} |")
    print(f"| alignment with a moerr recording of the same {world} ranks (AlignBeside: its bundles read, the offset "
          f"fitted) | {beside['align_s']:.2f} |")
    print(f"\nalignment: offset {beside['offset']} (the recording starts {beside['true_offset']} collectives into "
          f"the dump); {beside['other_offsets']} other offsets fit too (the kinds repeat every {len(KINDS)}).")
    sides = "; ".join(f"ranks {s['ranks']} {s['state']}" for s in odd)
    print(f"\nmoerr: first disagreement at collective_seq_id {ours['flight_recorder_seq']}, "
          f"{sides}. torch: first failing collective "
          f"at collective_seq_id {theirs.collective_seq_id}, {theirs.collective_name}.")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
