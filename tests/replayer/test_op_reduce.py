"""`moerr reduce` on a step moerr cannot rebuild as a model: a plain-PyTorch
MoE of the user's own (not an HF family, not moerr's example), one expert's
down projection scaled by 1e37 so the step overflows in fp32. The expert's
output reaches ~6e36, still finite; the next block's layer_norm makes NaN.
The op-level reduce cuts the recorded op sequence down to the ops that keep
that first overflow and its cause, and writes repro.py, which needs torch
alone.

Run by ctest with PYTHONPATH=BUILD/python and MOERR_BIN=the moerr binary."""
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

import moerr

MOERR = os.environ.get("MOERR_BIN", "moerr")
SCALE = 1e37


class Expert(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.up = nn.Linear(d, h)
        self.down = nn.Linear(h, d)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """Top-2 of 4 experts, tokens gathered per expert and summed back with index_add."""

    def __init__(self, d=16, h=32, n=4, k=2):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.gate = nn.Linear(d, n, bias=False)
        self.experts = nn.ModuleList(Expert(d, h) for _ in range(n))
        self.k = k

    def forward(self, x):
        h = self.norm(x)
        top, idx = self.gate(h).softmax(-1).topk(self.k, -1)
        out = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):
            rows = (idx == e).any(-1).nonzero().squeeze(-1)
            if rows.numel():
                weight = (top * (idx == e)).sum(-1)[rows].unsqueeze(-1)
                out = out.index_add(0, rows, (expert(h[rows]) * weight).to(out.dtype))
        return x + out


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 16)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(16, 20)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def record_step(path, mode, autocast=False):
    """A training step with expert 2 of block 0 broken (the forward under CPU
    bf16 autocast with `autocast`); returns that expert's weight."""
    torch.manual_seed(0)
    model = Net()
    broken = model.blocks[0].experts[2].down.weight
    with torch.no_grad():
        broken.mul_(SCALE)
    moerr.instrument(model)
    tokens = torch.randint(0, 20, (24,), generator=torch.Generator().manual_seed(1))
    with moerr.record(path, mode=mode, overwrite=True) as rec:
        with rec.step():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                logits = model(tokens[:-1])
            loss = F.cross_entropy(logits.float(), tokens[1:])
            loss.backward()
    return broken.detach().clone()


def moerr_json(*args, code=0):
    p = subprocess.run([MOERR, *args, "--json"], capture_output=True, text=True)
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    return json.loads(p.stdout)


def run_repro(script):
    """The script in a fresh process of this Python, without moerr on its path."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                          cwd=str(script.parent.parent))


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_reduce_cuts_a_plain_pytorch_step_to_a_standalone_repro(tmp_path, autocast):
    path = tmp_path / "step.moerr"
    broken = record_step(path, "replayable", autocast)
    found = moerr_json("bisect", str(path), code=1)[0]  # 1: an overflow was found
    cause = found["cause"]
    assert cause["found_explosion"] and cause["module"] == "blocks.0.experts.2.down", cause

    out = tmp_path / "small.moerr"
    r = moerr_json("reduce", str(path), "-o", str(out))
    assert r["level"] == "ops" and r["step"] == 0, r
    # The kept ops: the first overflow (last) and its cause, and a handful around them.
    assert r["failure"]["op_index"] == found["op_index"] and r["failure"]["cause_op_index"] == cause["op_index"], r
    assert r["kept"][-1] == found["op_index"] and cause["op_index"] in r["kept"], r
    assert r["kept"] == sorted(r["kept"]) and r["ops_after"] == len(r["kept"]), r
    assert 2 <= r["ops_after"] <= 12 and r["ops_before"] > 20 * r["ops_after"], r
    assert r["bytes_after"] < r["bytes_before"] and r["candidates"] > 0, r
    # The expert's routed tokens, with the index that places them, lost rows.
    assert 0 < r["elements_after"] < r["elements_before"], r
    assert r["assertion"] == "op %d %s produces NaN from finite inputs" % (r["ops_after"] - 1, found["op"]), r

    # The reduced bundle replays bitwise and fails as the original did.
    replayed = moerr_json("replay", str(out))[0]
    assert replayed["ops"] == r["ops_after"] and replayed["differ"] == 0 and replayed["first_divergence"] is None, replayed
    small = moerr_json("bisect", str(out), code=1)[0]
    assert small["op"] == found["op"] and small["module"] == found["module"], small
    assert small["cause"]["module"] == cause["module"] and small["cause"]["op"] == cause["op"], small

    # repro.py: torch alone, in a fresh process, fails the way the original did.
    script, values = tmp_path / "small.repro.py", tmp_path / "small.repro.safetensors"
    text = script.read_text()
    assert "moerr" not in [line.split()[1] for line in text.splitlines() if line.startswith("import ")]
    # Each op runs under the autocast state it was recorded with.
    assert ('with torch.autocast("cpu", dtype=torch.bfloat16)' in text) == autocast
    p = run_repro(script)
    assert p.returncode != 0 and f"AssertionError: {r['assertion']}" in p.stderr, (p.stdout, p.stderr)

    # The broken expert's weight (or a block of it, when the reduce shrank
    # its rows or columns) is the one huge kept value; healed, the repro passes.
    kept = load_file(str(values))
    faulty = [name for name, t in kept.items() if t.is_floating_point() and t.numel() and t.abs().max() > SCALE / 1e6]
    assert len(faulty) == 1, sorted(kept)
    t = kept[faulty[0]]
    (rows, cols), (all_rows, all_cols) = t.shape, broken.shape
    assert any(torch.equal(t, broken[i:i + rows, j:j + cols])
               for i in range(all_rows - rows + 1) for j in range(all_cols - cols + 1)), (t.shape, broken.shape)
    kept[faulty[0]] = t / SCALE
    save_file(kept, str(values))
    p = run_repro(script)
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert "the failure does not reproduce" in p.stdout, p.stdout


def test_reduce_of_a_full_recording_keeps_the_same_ops(tmp_path):
    replayable, full = tmp_path / "r.moerr", tmp_path / "f.moerr"
    record_step(replayable, "replayable")
    record_step(full, "full")
    a = moerr_json("reduce", str(replayable), "-o", str(tmp_path / "a.moerr"))
    b = moerr_json("reduce", str(full), "-o", str(tmp_path / "b.moerr"))
    assert a["kept"] == b["kept"] and a["assertion"] == b["assertion"], (a, b)
    assert b["bytes_after"] < b["bytes_before"] / 10, b


def test_a_stats_recording_is_refused_for_want_of_values(tmp_path):
    path = tmp_path / "stats.moerr"
    record_step(path, "stats")
    p = subprocess.run([MOERR, "reduce", str(path), "-o", str(tmp_path / "small.moerr")], capture_output=True, text=True)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "stats mode" in p.stderr and "not values" in p.stderr, p.stderr
    assert not (tmp_path / "small.moerr").exists() and not (tmp_path / "small.repro.py").exists()


def test_a_step_without_overflow_is_refused_naming_what_is_kept(tmp_path):
    path = tmp_path / "healthy.moerr"
    torch.manual_seed(0)
    model = Net()
    with moerr.record(path, mode="replayable") as rec:
        with rec.step():
            F.cross_entropy(model(torch.arange(12) % 20), torch.arange(12) % 20).backward()
    p = subprocess.run([MOERR, "reduce", str(path), "-o", str(tmp_path / "small.moerr")], capture_output=True, text=True)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "has no overflow" in p.stderr and "none of its ops has a reference" in p.stderr, p.stderr


def test_the_reference_trainers_step_is_reduced_as_a_model_unless_ops_are_asked_for(tmp_path):
    # The tiny preset's expert-overflow under fp16 emulation: an fp16 cast
    # (aten::to with a ScalarType argument) overflows.
    run = tmp_path / "run"
    subprocess.run([MOERR, "train", "--preset", "tiny", "--fault", "expert-overflow", "--steps", "1",
                    "--warmup-steps", "0", "--record", "replayable", "-o", str(run)],
                   check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    bundle = run / "run.moerr"
    found = moerr_json("bisect", str(bundle), code=1)[0]
    r = moerr_json("reduce", str(bundle), "-o", str(tmp_path / "ops.moerr"), "--ops")
    assert r["level"] == "ops" and r["kept"][-1] == found["op_index"], r
    assert found["cause"]["op_index"] in r["kept"] and r["ops_after"] <= 8, (found["cause"], r)
    script = tmp_path / "ops.repro.py"
    assert "torch.float16" in script.read_text()  # the cast's dtype, as torch.ops takes it
    p = run_repro(script)
    assert p.returncode != 0 and f"AssertionError: {r['assertion']}" in p.stderr, (p.stdout, p.stderr)
    # Without --ops the step is rebuilt as a model and loses experts and layers.
    model = moerr_json("reduce", str(bundle), "-o", str(tmp_path / "model.moerr"))
    assert "level" not in model and model["after"]["experts"] < model["before"]["experts"], model
    assert not (tmp_path / "model.repro.py").exists()


def test_each_rank_of_a_run_reduces_with_its_received_collectives_as_recorded_inputs(tmp_path):
    # Two expert-parallel ranks; the broken expert lives on one of them. Its
    # bundle reduces on its own, collectives served from the record. The
    # other rank's first overflow is the all_to_all that brings the Inf in:
    # no op of its own made it, so reducing it alone is refused, naming the
    # collective and where to look.
    run = tmp_path / "run"
    subprocess.run([MOERR, "train", "--preset", "tiny", "--ranks", "2", "--ep", "2", "--fault", "expert-overflow",
                    "--steps", "1", "--warmup-steps", "0", "--record", "replayable", "-o", str(run)],
                   check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    origin = moerr_json("bisect", str(run / "run"), code=1)[0]["rank"]
    bundle = run / "run" / f"rank{origin}.moerr"
    found = moerr_json("bisect", str(bundle), code=1)[0]
    reduced = moerr_json("reduce", str(bundle), "-o", str(tmp_path / "origin-alone.moerr"), "--ops")
    assert reduced["level"] == "ops" and reduced["kept"][-1] == found["op_index"], (found, reduced)
    p = run_repro(tmp_path / "origin-alone.repro.py")
    assert p.returncode != 0 and f"AssertionError: {reduced['assertion']}" in p.stderr, (p.stdout, p.stderr)
    other = run / "run" / f"rank{1 - origin}.moerr"
    assert moerr_json("bisect", str(other), code=1)[0]["op"].startswith("c10d::")
    p = subprocess.run([MOERR, "reduce", str(other), "-o", str(tmp_path / "other.moerr"), "--ops"],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "a collective: its peers made them" in p.stderr, (p.stdout, p.stderr)
    # The run directory: by default the rank where bisect says the overflow
    # began (the broken expert's, not the one that received its Inf).
    r = moerr_json("reduce", str(run / "run"), "-o", str(tmp_path / "origin.moerr"), "--ops")
    assert r["rank"] == origin and r["kept"] == reduced["kept"], (origin, r)
    p = subprocess.run([MOERR, "reduce", str(run / "run"), "--rank", str(1 - origin), "-o",
                        str(tmp_path / "other.moerr"), "--ops"], capture_output=True, text=True)
    assert p.returncode == 2 and "c10d::" in p.stderr, (p.stdout, p.stderr)


def test_tokens_of_a_batch_of_sequences_shrink_along_their_own_dimension(tmp_path):
    # [batch, tokens, hidden] activations, an overflowing projection: the
    # values cut free lose tokens (dim 1), not only rows (dim 0).
    torch.manual_seed(0)
    proj, norm = nn.Linear(8, 8), nn.LayerNorm(8)
    with torch.no_grad():
        proj.weight.mul_(SCALE)
    x = torch.randn(2, 12, 8)
    path = tmp_path / "seq.moerr"
    with moerr.record(path, mode="replayable", overwrite=True) as rec:
        with rec.step():
            norm(proj(torch.tanh(x))).sum().backward()
    r = moerr_json("reduce", str(path), "-o", str(tmp_path / "small.moerr"))
    assert r["elements_after"] < r["elements_before"], r
    values = load_file(str(tmp_path / "small.repro.safetensors"))
    activations = [t for t in values.values() if t.dim() == 3]
    assert activations and all(t.shape[1] < 12 for t in activations), {k: t.shape for k, t in values.items()}
    p = run_repro(tmp_path / "small.repro.py")
    assert p.returncode != 0 and f"AssertionError: {r['assertion']}" in p.stderr, (p.stdout, p.stderr)
