"""`moerr reduce` of a vendor op's verdict: a step with no overflow whose
vendor op is wrong, cut down to that op against its reference. record_fake_npu
records, in full mode, one step of fakenpu::npu_swiglu (correct) and
fakenpu::npu_swiglu_backward (its gate gradient doubled) from a library the
moerr process never loads; torch_npu's shipped npu_swiglu references stand
for them (--reference). The reduce keeps the backward alone; its repro, in a
fresh torch-only process, shows the recorded output far from the
reference; with the reference's own output in its place it passes; run with
the fake library loaded and a device argument, it judges the op itself.

Run by ctest with MOERR_BIN, RECORD_FAKE_NPU, FAKE_NPU_LIB (the library of
the fakenpu ops) and MOERR_REFERENCES (the shipped references)."""
import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

MOERR = os.environ.get("MOERR_BIN", "moerr")
RECORD = os.environ.get("RECORD_FAKE_NPU", "record_fake_npu")
REFERENCES = os.environ.get("MOERR_REFERENCES", "")
BACKWARD = "fakenpu::npu_swiglu_backward"
SPECS = ["--reference", f"fakenpu::npu_swiglu={REFERENCES}/npu_swiglu.pt",
         "--reference", f"{BACKWARD}={REFERENCES}/npu_swiglu_backward.pt"]


def moerr_run(*args, code=0):
    p = subprocess.run([MOERR, *map(str, args)], capture_output=True, text=True, timeout=300)
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    return p


def record(path, mode, *what):
    subprocess.run([RECORD, str(path), mode, *what], check=True, timeout=120)
    return path


def run_repro(script, *args, preload=None):
    """The script in a fresh process of this Python, without moerr on its path; `preload`: a library of
    ops loaded first, as a device's would be."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = "import runpy, sys, torch\n"
    if preload:
        code += f"torch.ops.load_library({str(preload)!r})\n"
    code += f"sys.argv = [{str(script)!r}, *{list(args)!r}]\nrunpy.run_path(sys.argv[0], run_name='__main__')\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=str(script.parent.parent), timeout=120)


@pytest.fixture(scope="module")
def reduced(tmp_path_factory):
    d = tmp_path_factory.mktemp("vendor")
    full = record(d / "full.moerr", "full")
    out = d / "small.moerr"
    report = json.loads(moerr_run("reduce", full, "-o", out, "--json", *SPECS).stdout)
    return full, out, report


def test_the_kept_op_is_bisects_suspect_vendor_op(reduced):
    full, _, r = reduced
    f = r["failure"]
    assert r["level"] == "ops" and f["kind"] == "vendor_op" and f["op"] == BACKWARD, r
    assert f["phase"] == "backward" and r["kept"] == [f["op_index"]] and r["ops_after"] == 1, r
    assert r["checked_ops"] == 2 and r["suspect_ops"] == 1, r  # the forward is right
    assert f["recorded_ulps"] > f["allowed_ulps"] == 2 * max(f["reference_ulps"], 4), f
    # The same op and numbers as bisect's verdict on the whole step.
    bisect = json.loads(moerr_run("bisect", full, "--json", *SPECS, code=1).stdout)
    step = bisect[0] if isinstance(bisect, list) else bisect
    (suspect,) = step["vendor_ops"]
    assert (suspect["op_index"], suspect["recorded_ulps"]) == (f["op_index"], f["recorded_ulps"]), (suspect, f)
    assert r["bytes_after"] < r["bytes_before"], r


def test_the_repro_fails_in_a_fresh_process_against_the_copied_reference(reduced):
    _, out, r = reduced
    script = out.with_name("small.repro.py")
    assert out.with_name("small.repro.reference.pt").is_file()
    p = run_repro(script)
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert "AssertionError: " + r["assertion"] in p.stderr, (r["assertion"], p.stderr)


def test_the_repro_passes_with_the_references_output_in_place(reduced, tmp_path):
    _, out, _ = reduced
    values = load_file(str(out.with_name("small.repro.safetensors")))
    reference = torch.jit.load(str(out.with_name("small.repro.reference.pt")))
    # npu_swiglu_backward(grad_output, x, dim): x has the shape of the gradient it makes, grad_output half.
    inputs = [values[n] for n in values if n.startswith("v/")]
    (x,) = [t for t in inputs if t.shape == values["recorded_output"].shape]
    (grad,) = [t for t in inputs if t.shape != x.shape]
    for name in ("small.repro.py", "small.repro.reference.pt"):
        (tmp_path / name).write_bytes(out.with_name(name).read_bytes())
    healed = dict(values)
    healed["recorded_output"] = reference(grad, x, -1)
    save_file(healed, str(tmp_path / "small.repro.safetensors"))
    p = run_repro(tmp_path / "small.repro.py")
    assert p.returncode == 0 and "does not reproduce" in p.stdout, (p.stdout, p.stderr)


def test_with_a_device_the_repro_judges_the_op_itself_where_its_library_is_loaded(reduced):
    _, out, _ = reduced
    script = out.with_name("small.repro.py")
    p = run_repro(script, "cpu")
    assert p.returncode != 0 and "is not an op of this torch" in p.stderr, (p.stdout, p.stderr)
    p = run_repro(script, "cpu", preload=os.environ["FAKE_NPU_LIB"])
    assert p.returncode == 1 and "its output on cpu 0 is" in p.stderr, (p.stdout, p.stderr)


def test_the_reduced_bundle_repeats_the_verdict_in_isolated_replay(reduced):
    _, out, r = reduced
    replay = json.loads(moerr_run("replay", out, "--isolated", "--json", *SPECS, code=1).stdout)
    step = replay[0] if isinstance(replay, list) else replay
    assert step["ops"] == 1, step
    checks = [c for c in step["reference_checks"] if c["verdict"] == "suspect"]
    assert [c["recorded_ulps"] for c in checks] == [r["failure"]["recorded_ulps"]], step


@pytest.mark.parametrize("mode", ["stats", "replayable"])
def test_a_recording_without_the_ops_outputs_is_refused(tmp_path, mode):
    bundle = record(tmp_path / f"{mode}.moerr", mode)
    p = moerr_run("reduce", bundle, "-o", tmp_path / "small.moerr", *SPECS, code=2)
    assert 'record with mode "full"' in p.stderr, p.stderr
    assert not (tmp_path / "small.moerr").exists() and not (tmp_path / "small.repro.py").exists()


def test_a_step_whose_vendor_ops_are_right_has_nothing_to_reduce(tmp_path):
    # npu_fusion_attention and its grad, correct, judged by the shipped references by name.
    bundle = record(tmp_path / "attention.moerr", "full", "attention")
    p = moerr_run("reduce", bundle, "-o", tmp_path / "small.moerr", code=2)
    assert "each of the 2 ops with a reference is within what its reference allows" in p.stderr, p.stderr
