"""Flight Recorder dumps of coalesced ops as ProcessGroupNCCL writes them,
for the coalesced-group tests: the pinned torch's gloo does not record
coalesced groups entry by entry (a `_coalescing_manager` block of two
all_reduces is one 'gloo:all_reduce' entry holding both inputs, and
batch_isend_irecv records nothing), so these dumps are written from the
layout of torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (2.7 and later):
inside `_coalescing_manager` each collective records its own entry, all
with the group's next collective_seq_id, and endCoalescing records one
more, "nccl:coalesced", with the same number and no sizes; a
batch_isend_irecv records each send ("nccl:send 0->1") and recv
("nccl:recv 0<-1") with is_p2p and one shared p2p_seq_id (collective_seq_id
0), closed by "nccl:coalesced" with that p2p_seq_id. Fields as
flight_recorder_jobs' real dumps hold them (version "2.10").

    write_coalesced_dumps(out_dir, world=2, odd_rank=1, odd="sizes")

Each rank: all_reduce [4] (#1); a coalesced group of all_reduce [4] and
all_reduce [8] (#2; the odd rank's second op is all_reduce [16] with
odd="sizes"); a batch_isend_irecv exchanging [3] with each neighbour
(p2p #1; the odd rank receives [5] from its lower neighbour with
odd="p2p"; none with p2p=False); all_reduce [4] (#3). Returns the collective_seq_id of the
coalesced group.
"""
import os
import pickle


def _entry(record_id, name, sizes, out_sizes, seq, p2p_seq, state, line):
    dtypes = ["Float"] * len(sizes)
    return {"record_id": record_id, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": seq,
            "p2p_seq_id": p2p_seq, "op_id": record_id + 1, "profiling_name": name,
            "time_created_ns": 10**18 + record_id, "duration_ms": None, "input_sizes": sizes,
            "input_dtypes": dtypes, "output_sizes": out_sizes, "output_dtypes": ["Float"] * len(out_sizes),
            "state": state, "time_discovered_started_ns": None, "time_discovered_completed_ns": None,
            "retired": False, "timeout_ms": 600000, "is_p2p": p2p_seq > 0,
            "frames": [{"filename": "train.py", "line": line, "name": "step"}], "thread_id": "1",
            "thread_name": "python"}


def rank_entries(rank, world, odd_rank, odd, p2p=True):
    second = [16] if rank == odd_rank and odd == "sizes" else [8]
    calls = [("nccl:all_reduce", [[4]], [[4]], 1, 0, 10)]
    calls += [("nccl:all_reduce", [[4]], [[4]], 2, 0, 20), ("nccl:all_reduce", [second], [second], 2, 0, 21),
              ("nccl:coalesced", [], [], 2, 0, 22)]
    up, down = (rank + 1) % world, (rank - 1) % world
    recv = [5] if rank == odd_rank and odd == "p2p" else [3]
    if p2p:
        calls += [(f"nccl:send {rank}->{up}", [[3]], [[3]], 0, 1, 30),
                  (f"nccl:recv {rank}<-{down}", [recv], [recv], 0, 1, 31), ("nccl:coalesced", [], [], 0, 1, 32)]
    calls += [("nccl:all_reduce", [[4]], [[4]], 3, 0, 40)]
    # Every rank completed #1; the rest is still scheduled when the dump is taken.
    return [_entry(i, name, s, o, seq, p2p, "completed" if i == 0 else "scheduled", line)
            for i, (name, s, o, seq, p2p, line) in enumerate(calls)]


def write_coalesced_dumps(out_dir, world=2, odd_rank=1, odd="sizes", p2p=True):
    os.makedirs(out_dir, exist_ok=True)
    ranks = str(list(range(world)))
    for r in range(world):
        dump = {"version": "2.10", "comm_lib_version": "2.21.5",
                "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": ranks}},
                "pg_status": {"0": {"last_enqueued_collective": 3, "last_started_collective": 1,
                                    "last_completed_collective": 1}},
                "entries": rank_entries(r, world, odd_rank, odd, p2p)}
        with open(os.path.join(out_dir, f"nccl_trace_rank_{r}"), "wb") as f:
            pickle.dump(dump, f, protocol=2)
    return 2
