"""torch's own Flight Recorder analyzer (torch/distributed/flight_recorder:
loader.read_dir + builder.build_db, what `torch.distributed.flight_recorder
.fr_trace` runs) as a reference verdict for the dumps that
flight_recorder_jobs.py writes.

    python torch_fr_analysis.py DUMP_DIR WORLD_SIZE [--allow-incomplete-ranks]

torch's analyzer refuses gloo dumps twice over: Op() asserts that every
profiling_name starts with "nccl:" or "xccl:", and gloo leaves pg_config
unfilled ({'': {'name': '', 'desc': '', 'ranks': '[]'}}), so no entry's
process group can be resolved. torch_verdict therefore analyzes a COPY of
the dumps (a temp dir; the originals are never touched) in which
  - every profiling_name "gloo:X" is rewritten "nccl:X", and
  - pg_config lists every group seen in the rank's entries, keyed by the
    entry's process_group[0], with desc process_group[1] and ranks = all
    world ranks (true for these jobs: the default group and one
    new_group(all ranks)).
Only files named <prefix><rank> are copied (read_dir would try to unpickle
anything holding the prefix). torch_refuses runs the analyzer on the
untouched dumps and returns its exception text.

The verdict describes the first collective (in db.collectives order) whose
pass_check is False or that has missing_ranks; "ok" is True when none
does. torch's logger output (its mismatch report) is captured into "log".
"""
import argparse
import contextlib
import io
import json
import logging
import os
import pickle
import re
import sys
import tempfile

RANK_FILE = re.compile(r"^(?P<prefix>[A-Za-z_\-]*?)(?P<rank>\d+)$")


def _analyze(trace_dir, allow_incomplete=False):
    """Run read_dir + build_db exactly as fr_trace.main does; returns the db."""
    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.config_manager import JobConfig
    from torch.distributed.flight_recorder.components.loader import read_dir
    argv = [trace_dir] + (["--allow-incomplete-ranks"] if allow_incomplete else [])
    args = JobConfig().parse_args(argv)
    details, version = read_dir(args)
    return build_db(details, args, version)


@contextlib.contextmanager
def _captured_torch_log():
    """Route the "Flight Recorder" logger into a buffer for the block. The
    components are imported first: importing them installs torch's own
    stderr handler, which this must replace."""
    import torch.distributed.flight_recorder.components.builder  # noqa: F401
    logger = logging.getLogger("Flight Recorder")
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(logging.Formatter("%(message)s"))
    saved, logger.handlers = logger.handlers, [handler]
    try:
        yield buf
    finally:
        logger.handlers = saved


def _gloo_as_nccl(dump, world_size, rename=True):
    """The rewrite described in the module docstring (on a copied dict);
    rename=False fills pg_config only."""
    ranks = str(list(range(world_size)))
    pg_config = {}
    for entry in dump["entries"]:
        name = entry["profiling_name"]
        if rename and name.startswith("gloo:"):
            entry["profiling_name"] = "nccl:" + name[len("gloo:"):]
        pg_name, desc = entry["process_group"]
        pg_config[pg_name] = {"name": pg_name, "desc": desc, "ranks": ranks}
    dump["pg_config"] = pg_config
    return dump


def _rank_files(dump_dir):
    return sorted(f for f in os.listdir(dump_dir) if RANK_FILE.match(f))


def _copy_dumps(dump_dir, out_dir, rewrite=None):
    """Copy the rank files, passing each loaded dump through rewrite."""
    for name in _rank_files(dump_dir):
        with open(os.path.join(dump_dir, name), "rb") as f:
            dump = pickle.load(f)
        with open(os.path.join(out_dir, name), "wb") as f:
            pickle.dump(rewrite(dump) if rewrite else dump, f)


def _culprits(collective):
    """Ranks torch blames: keys of mismatch_collectives plus the culprit
    rank named in type_of_mismatch, if any."""
    found = set((collective.mismatch_collectives or {}).keys())
    culprit = getattr(collective.type_of_mismatch, "culprit", None)
    if isinstance(culprit, int):
        found.add(culprit)
    return sorted(found)


def _mismatch_states(collective):
    infos = [c.type_of_mismatch for c in (collective.mismatch_collectives or {}).values()]
    infos.append(collective.type_of_mismatch)
    return sorted({i.state.name for i in infos if i is not None})


def _first_bad(collectives):
    for c in collectives:
        if not c.pass_check or c.missing_ranks:
            return {"group": c.group_id, "desc": c.pg_desc, "seq": c.collective_seq_id,
                    "collective": c.collective_name, "culprits": _culprits(c),
                    "mismatch": _mismatch_states(c), "missing_ranks": sorted(c.missing_ranks or [])}
    return None


def torch_verdict(dump_dir, world_size, allow_incomplete=False):
    """torch's verdict on the (rewritten copy of the) dumps in dump_dir."""
    with tempfile.TemporaryDirectory() as tmp, _captured_torch_log() as log:
        _copy_dumps(dump_dir, tmp, lambda d: _gloo_as_nccl(d, world_size))
        try:
            db = _analyze(tmp, allow_incomplete)
        except (AssertionError, ValueError, KeyError) as exc:
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "log": log.getvalue()}
    bad = _first_bad(db.collectives)
    dumps = sorted(int(RANK_FILE.match(f)["rank"]) for f in _rank_files(dump_dir))
    # With allow_incomplete, torch passes every collective it cannot judge
    # and only logs "We cannot decide ..."; count those so "ok" is not
    # mistaken for a clean job.
    verdict = {"ok": bad is None, "collectives": len(db.collectives), "dumps": dumps,
               "missing_dumps": sorted(set(range(world_size)) - set(dumps)),
               "undecided": log.getvalue().count("We cannot decide")}
    verdict.update(bad or {})
    verdict["log"] = log.getvalue()
    return verdict


def torch_refuses(dump_dir, fill_pg_config_for=None):
    """The exception torch's analyzer raises on the untouched gloo dumps,
    as text ("" if, unexpectedly, it accepts them). With
    fill_pg_config_for=world_size only pg_config is filled, which shows
    the second refusal, of the 'gloo:' names."""
    rewrite = None
    if fill_pg_config_for:
        rewrite = lambda d: _gloo_as_nccl(d, fill_pg_config_for, rename=False)  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp, _captured_torch_log():
        _copy_dumps(dump_dir, tmp, rewrite)
        try:
            _analyze(tmp)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
    return ""


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dump_dir")
    parser.add_argument("world_size", type=int)
    parser.add_argument("--allow-incomplete-ranks", action="store_true")
    parser.add_argument("--log", action="store_true", help="keep torch's log in the output")
    args = parser.parse_args(argv)
    verdict = torch_verdict(args.dump_dir, args.world_size, args.allow_incomplete_ranks)
    if not args.log:
        verdict.pop("log")
    verdict["refused_untouched"] = torch_refuses(args.dump_dir)
    verdict["refused_gloo_names"] = torch_refuses(args.dump_dir, args.world_size)
    json.dump(verdict, sys.stdout, indent=1, default=str)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
