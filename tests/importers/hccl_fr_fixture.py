"""Flight Recorder dumps as torch_npu's ProcessGroupHCCL writes them, for a
4-rank HCCL job where rank `odd_rank` calls all_gather where the others call
all_reduce (a desync at one collective_seq_id).

    python hccl_fr_fixture.py OUT_DIR [WORLD] [ODD_RANK]

Sources: github.com/Ascend/pytorch at master 9e73e708ab9350d203475609f36f8a43f6a0c2ab
(the same layout in branches v2.8.0, v2.9.0, v2.9.0-26.1.0 ...):
  - torch_npu/csrc/distributed/TraceUtils.h: HCCLTraceBuffer::dump() is
    pickle_str() of a c10::Dict through torch::jit::Pickler (protocol 2,
    tag_aggregates=false: plain EMPTY_DICT/EMPTY_LIST/TUPLE, no GLOBAL);
    keys in insertion order: "version" = "2.4", "pg_config"
    {name: {name, desc, ranks: "[0, 1, 2, 3]"}}, "pg_status" {str(pg_id):
    {last_enqueued_collective, last_started_collective,
    last_completed_collective}} (int64; strings only in dump_json),
    "entries" (getCollectiveTrace: frames, record_id, pg_id, process_group
    (name, desc) tuple, collective_seq_id, p2p_seq_id, op_id,
    profiling_name, time_created_ns, duration_ms only with timing,
    input_sizes, input_dtypes ("Float", c10::toString), output_sizes,
    output_dtypes, state "completed"|"started"|"scheduled",
    time_discovered_{started,completed}_ns (None when not seen), retired,
    timeout_ms, is_p2p); "hccl_comm_state" only when a dump map is given
    (dumpDebuggingInfo passes nullopt). No thread_id/thread_name, no
    comm_lib_version (torch's NCCL dumps have both).
  - torch_npu/csrc/distributed/ProcessGroupHCCL.cpp: collective() records
    initWork(devices, rank_, opType, "", ...): profiling_name is "" for every
    plain collective; only coalesced ops ("hccl:coalesced",
    "hccl:<op>_coalesced") and p2p ("hccl:send 1->0") have names. pg_name is
    "group_name_" + options->group_id ("group_name_0"); record() gets
    (pg_name_, pg_desc_); pg_id is uid_ (process_group_id++).
    dumpDebuggingInfo() writes dump_hccl_trace(true, true, false) through
    DebugInfoWriter (HCCLUtils.cpp): file TORCH_HCCL_DEBUG_INFO_TEMP_FILE
    (default "/tmp/hccl_trace_rank_") + global rank. Env:
    TORCH_HCCL_TRACE_BUFFER_SIZE, TORCH_HCCL_DUMP_ON_TIMEOUT,
    TORCH_HCCL_ENABLE_MONITORING, TORCH_HCCL_ENABLE_TIMING.
  - test/distributed/test_flight_recorder.py: version "2.4", pg_config key
    "group_name_0", process_group ("group_name_0", "") (pg_desc_ stays "":
    ProcessGroupHCCL::setGroupDesc hides the non-virtual
    Backend::setGroupDesc), pg_status key "0", last_started -1 without
    timing, first collective_seq_id 1, record_id from 0, timeout_ms 3636000,
    profiling_name "" ("profiling is not supported").
  - tools/flight_recorder/components/types.py (torch_npu's own analyzer):
    Op takes the kind from frames[0]["name"], the innermost Python frame.
Assumed: frames are the torch.distributed function (innermost first) then
the caller, file paths and line numbers made up; op_id == collective_seq_id;
completed entries are retired, the pending one is not; all_gather's output
recorded as one [world, n] tensor; times made up. named=True writes
"hccl:<kind>" names instead of "" (what torch_npu's skipped
test_barrier_profiling expects: "hccl:all_reduce"), a layout no current
torch_npu writes.
"""
import os
import pickle
import sys

PREFIX = "hccl_trace_rank_"  # DebugInfoWriter's default, minus "/tmp/"
C10D = "/usr/local/lib/python3.10/site-packages/torch/distributed/distributed_c10d.py"
LINES = {"all_reduce": 2806, "all_gather": 3487}


def _entry(rank, seq, kind, world, state, named):
    n = 1024
    out = [world, n] if kind == "all_gather" else [n]
    t0 = 1_760_000_000_000_000_000 + seq * 1_000_000
    done = state == "completed"
    frames = [{"name": kind, "filename": C10D, "line": LINES[kind]},
              {"name": "wrapper", "filename": C10D.replace("distributed_c10d", "c10d_logger"), "line": 81},
              {"name": "train_step", "filename": "/job/train.py", "line": 40}]
    return {
        "frames": frames, "record_id": seq - 1, "pg_id": 0,
        "process_group": ("group_name_0", ""),
        "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq,
        "profiling_name": f"hccl:{kind}" if named else "",
        "time_created_ns": t0,
        "input_sizes": [[n]], "input_dtypes": ["Float"],
        "output_sizes": [out], "output_dtypes": ["Float"],
        "state": state,
        "time_discovered_started_ns": None,
        "time_discovered_completed_ns": t0 + 500_000 if done else None,
        "retired": done, "timeout_ms": 3636000, "is_p2p": False,
    }


def dumps(world=4, odd_rank=2, hang_seq=3, named=False):
    """{rank: dump dict}; collectives 1..hang_seq-1 completed on every rank,
    hang_seq scheduled (all_gather on odd_rank, all_reduce elsewhere)."""
    out = {}
    for rank in range(world):
        entries = [_entry(rank, s, "all_reduce", world, "completed", named) for s in range(1, hang_seq)]
        kind = "all_gather" if rank == odd_rank else "all_reduce"
        entries.append(_entry(rank, hang_seq, kind, world, "scheduled", named))
        out[rank] = {
            "version": "2.4",
            "pg_config": {"group_name_0": {"name": "group_name_0", "desc": "",
                                           "ranks": "[" + ", ".join(map(str, range(world))) + "]"}},
            "pg_status": {"0": {"last_enqueued_collective": hang_seq, "last_started_collective": -1,
                                "last_completed_collective": hang_seq - 1}},
            "entries": entries,
        }
    return out


def write_hccl_dumps(out_dir, world=4, odd_rank=2, hang_seq=3, named=False):
    """Write <out_dir>/hccl_trace_rank_<r>; returns the desynced collective_seq_id."""
    os.makedirs(out_dir, exist_ok=True)
    for rank, dump in dumps(world, odd_rank, hang_seq, named).items():
        with open(os.path.join(out_dir, f"{PREFIX}{rank}"), "wb") as f:
            f.write(pickle.dumps(dump, protocol=2))
    return hang_seq


if __name__ == "__main__":
    args = sys.argv[1:]
    print(write_hccl_dumps(args[0], *map(int, args[1:3])))
