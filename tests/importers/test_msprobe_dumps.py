"""msprobe itself as a client: its PrecisionDebugger (mindstudio-probe from
PyPI, run on the CPU) dumps one training step of a tiny transformers
Qwen2-MoE model whose layer-1 expert 2 has its down projection scaled by
1e37 (msprobe_step.py). Each dump is imported with `moerr import msprobe`
and read by bisect, lint, diff and report. Bisect must name the cause that
moerr names on its own recording of the same step: the expert's linear in
model.layers.1.mlp.experts, with the same magnitude.

Run by ctest with PYTHONPATH=BUILD/python and MOERR_BIN=the moerr binary."""
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

MOERR = os.environ.get("MOERR_BIN", "moerr")
HERE = os.path.dirname(os.path.abspath(__file__))
EXPERTS = "model.layers.1.mlp.experts"

# name: msprobe_step.py arguments after TASK LEVEL DUMP_PATH
DUMPS = {
    "stat_l1": ["statistics", "L1"],
    "stat_mix": ["statistics", "mix"],
    "md5_l1": ["statistics", "L1", "--summary", "md5"],
    "xor_l1": ["statistics", "L1", "--summary", "xor"],
    # The same step with the expert scaled by 1e36 instead: other values from its linear on.
    "xor_other": ["statistics", "L1", "--summary", "xor", "--scale", "1e36"],
    "tensor_mix": ["tensor", "mix"],
    "stat_l0": ["statistics", "L0"],
    "grouped_mix": ["statistics", "mix", "--experts", "grouped_mm"],
    "two_ranks": ["statistics", "L1", "--world", "2", "--proj", "gate_up_proj", "--scale", "1e20"],
}


def run(*args, ok=(0,)):
    p = subprocess.run([MOERR, *map(str, args)], capture_output=True, text=True)
    assert p.returncode in ok, (args, p.stdout + p.stderr)
    return p.stdout


def dump(out, args):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    task, level, *rest = args
    p = subprocess.run([sys.executable, os.path.join(HERE, "msprobe_step.py"), task, level, str(out), *rest],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each dump, imported: name -> run directory."""
    root = tmp_path_factory.mktemp("msprobe")
    with ThreadPoolExecutor(2) as pool:
        dumps = dict(zip(DUMPS, pool.map(lambda n: dump(root / n, DUMPS[n]), DUMPS)))
    # msprobe's own overflow analysis of the two-rank dump, next to it.
    msprobe = os.path.join(os.path.dirname(sys.executable), "msprobe")
    p = subprocess.run([msprobe, "overflow_check", "--input_path", str(dumps["two_ranks"] / "step0"),
                        "--output_path", str(dumps["two_ranks"])], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    out = {}
    for name, path in dumps.items():
        summary = json.loads(run("import", "msprobe", path, "-o", root / f"run_{name}", "--json"))
        assert summary["bundles"], summary
        out[name] = root / f"run_{name}"
    return out


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    """moerr's own recording of the same step (rank 0's, one process)."""
    path = tmp_path_factory.mktemp("own") / "own.moerr"
    code = f"""
import sys, torch, moerr
sys.path.insert(0, {HERE!r})
import msprobe_step
model = msprobe_step.tiny_qwen2_moe("eager")
with torch.no_grad():
    model.model.layers[msprobe_step.LAYER].mlp.experts.down_proj[msprobe_step.EXPERT].mul_(1e37)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
torch.manual_seed(100)
ids = torch.randint(0, 64, (2, 8))
with moerr.record({str(path)!r}, mode="stats", overwrite=True) as rec:
    moerr.instrument(model)
    with rec.step(0):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return bisect(path)


def bisect(path):
    """Bisect's one step: (result, exit code 1 when it found an overflow)."""
    p = subprocess.run([MOERR, "bisect", str(path), "--json"], capture_output=True, text=True)
    assert p.returncode in (0, 1), p.stdout + p.stderr
    results = json.loads(p.stdout)
    assert len(results) == 1, results
    return results[0]


def test_moerrs_own_recording_names_the_experts_linear(own):
    assert own["found"]
    assert own["cause"]["found_explosion"]
    assert own["cause"]["op"] == "aten::linear"
    assert own["cause"]["module"] == EXPERTS
    # The scaled weight (a parameter) is the input that made it.
    assert own["cause"]["outside_input_abs_max"] > 1e35


@pytest.mark.parametrize("name", ["stat_l1", "md5_l1", "stat_mix", "tensor_mix"])
def test_bisect_names_the_cause_moerr_names_on_its_own_recording(runs, own, name):
    found = bisect(runs[name])
    cause = found["cause"]
    assert found["found"] and cause["found_explosion"], found
    assert cause["op"] == "Functional.linear", cause
    # The same value as moerr's own recording's cause: the same op.
    assert cause["abs_max"] == pytest.approx(own["cause"]["abs_max"], rel=1e-6)
    assert cause["outside_input_abs_max"] > 1e35
    if name.endswith("mix"):
        # construct.json gives the module; a Module.* entry is a scope, never the cause.
        assert cause["module"] == EXPERTS
        assert all(not link["op"].startswith("Module.") for link in found["chain"][:1])
    else:
        assert cause["module"] == ""  # L1 dumps have no module nesting


def test_a_statistics_dump_walks_back_through_links_it_rebuilt(runs):
    found = bisect(runs["stat_l1"])
    # The first non-finite value is the norm's pow, far from the cause.
    assert found["op"] == "Tensor.pow", found
    assert len(found["chain"]) > 3, found["chain"]
    # Links matched by the largest value alone (the dump names no tensor,
    # and index_add_ / __getitem__ leave gaps) are reported as such.
    hows = {u["how"] for u in found["uncertain_links"]}
    assert hows <= {"extreme", "ambiguous"}, found["uncertain_links"]


def test_an_op_the_dump_does_not_hold_is_said_so(runs):
    """transformers' default grouped_mm experts run no API msprobe hooks:
    the cause is the first dumped op that holds the large value, in the
    experts module, and its input is said to come from outside the dump."""
    found = bisect(runs["grouped_mix"])
    cause = found["cause"]
    assert cause["module"] == EXPERTS, cause
    assert cause["outside_input_abs_max"] >= cause["abs_max"] / 4096, cause


def test_a_level_l0_dump_holds_no_non_finite_value_and_lint_sees_the_headroom(runs):
    assert bisect(runs["stat_l0"])["found"] is False
    findings = json.loads(run("lint", runs["stat_l0"], "--json", ok=(0, 1)))
    modules = [f["where"] for f in findings if f["check"] == "dtype-headroom"]
    assert any(m.startswith("model.layers.1.mlp") for m in modules), findings


def test_two_ranks_name_the_rank_whose_overflow_did_not_arrive_through_a_collective(runs):
    """Rank 1's expert's gate and up projection reach 3.6e19 and their
    product overflows; its NaN gradients reach rank 0 in the first
    Distributed.all_reduce, rank 0's first non-finite op."""
    found = bisect(runs["two_ranks"])
    assert found["rank"] == 1, found
    assert found["op"] == "Tensor.__mul__", found
    # The expert's token rows come through Tensor.__getitem__, which msprobe
    # does not dump: the linear has no computed input, and is named by its
    # peers (the other experts' linears) and the growth past its weight.
    assert found["cause"]["op"] == "Functional.linear" and found["cause"]["found_explosion"], found["cause"]
    by_rank = {r["rank"]: r for r in found["ranks"]}
    assert by_rank[0]["op"] == "c10d::all_reduce" and by_rank[0]["arrived"], by_rank
    assert by_rank[1]["op"] == "Tensor.__mul__"
    assert not by_rank[1]["arrived"]
    assert found["spread"]["kind"] == "all_reduce" and found["spread"]["to"] == [0]
    # msprobe's own overflow_check, found next to the dump, names the same first anomaly.
    check = found["msprobe_overflow_check"]
    assert check["agrees"] and check["entry"].startswith("Tensor.__mul__."), check


def test_checksums_tell_diff_which_op_differs_where_no_statistic_does(runs):
    """The xor summary writes no Max, Min, Mean or Norm, only a checksum."""
    blind = bisect(runs["xor_l1"])
    assert blind["found"] is False and blind["statistics"] is False, blind
    same = json.loads(run("diff", runs["xor_l1"], runs["xor_l1"], "--json"))
    assert same["diverged_ops"] == 0 and same["outputs_compared"] > 500, same
    report = json.loads(run("diff", runs["xor_l1"], runs["xor_other"], "--json", ok=(1,)))
    first = report["diverged"][0]
    assert first["op"] == "Functional.linear", first
    assert "checksums differ" in json.dumps(first), first
    md5 = json.loads(run("diff", runs["md5_l1"], runs["md5_l1"], "--json"))
    assert md5["diverged_ops"] == 0, md5


def test_statistics_and_tensor_dumps_of_one_step_agree_in_diff(runs):
    report = json.loads(run("diff", runs["stat_mix"], runs["tensor_mix"], "--json"))
    assert report["diverged_ops"] == 0, report
    assert report["matched"] > 500 and report["only_a"] == report["only_b"] == 0, report


@pytest.mark.parametrize("name", list(DUMPS))
def test_lint_and_report_read_every_dump(runs, name, tmp_path):
    run("lint", runs[name], ok=(0, 1))
    html = tmp_path / "report.html"
    run("report", runs[name], "-o", html)
    assert html.stat().st_size > 1000
    # An import is never replayable, full or not: the verdict says so.
    page = html.read_text()
    if name == "tensor_mix":  # a full import: it was called replayable
        assert "overflows; the cause is in" in page
    if "overflows; the cause is in" in page:
        assert "not a stats bundle or an imported dump" in page


def test_replay_of_an_import_is_refused_by_name(runs):
    p = subprocess.run([MOERR, "replay", str(runs["stat_l1"])], capture_output=True, text=True)
    assert p.returncode == 2
    assert "imported from msprobe" in p.stderr
