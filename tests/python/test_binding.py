"""The Python binding on a small MoE written in plain PyTorch (not the C++
reference model): recording, and the moerr command on what it recorded.

Run by ctest with PYTHONPATH=BUILD/python and MOERR_BIN=the moerr binary."""
import json
import os
import subprocess

import pytest
import torch
import torch.nn.functional as F

import moerr
from moerr.examples import TinyMoe

MOERR = os.environ.get("MOERR_BIN", "moerr")


def train(path, mode="replayable", steps=2, autocast=False, break_expert=False):
    torch.manual_seed(0)
    model = TinyMoe()
    if break_expert:  # its down projection's outputs pass fp32's range
        with torch.no_grad():
            expert = model.layers[0].mlp.experts[1]
            expert.up_proj.weight.mul_(1e3)
            expert.down_proj.weight.fill_(3e38)
    moerr.instrument(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 16, (8, 12), generator=torch.Generator().manual_seed(1))
    with moerr.record(path, mode=mode, overwrite=True) as rec:
        rec.name_parameters(model)
        for _ in range(steps):
            with rec.step():
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                    logits = model(tokens[:, :-1])
                loss = F.cross_entropy(logits.float().reshape(-1, 16), tokens[:, 1:].reshape(-1))
                loss.backward()
                with moerr.scope("optimizer"):
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                rec.outcome(loss=loss.item())
    return model


def run(*args, ok=(0,)):
    p = subprocess.run([MOERR, *map(str, args)], capture_output=True, text=True)
    assert p.returncode in ok, p.stderr
    return p.stdout


def test_a_python_step_replays_bitwise_in_moerr(tmp_path):
    path = tmp_path / "run.moerr"
    train(path)
    inspect = run("inspect", path)
    assert "complete steps: 0, 1" in inspect
    replay = run("replay", path, "--check")
    assert replay.count(", 0 differ") == 2, replay
    assert replay.count("bitwise identical") == 2, replay
    steps = json.loads(run("replay", path, "--check", "--json"))
    assert [s["step"] for s in steps] == [0, 1]
    assert all(s["differ"] == 0 and s["compared"] > 0 and s["first_divergence"] is None for s in steps), steps
    assert all(s["bitwise_identical_twice"] for s in steps), steps

    bundle = moerr.Bundle(path)
    assert bundle.steps == [0, 1]
    modules = {op["module"] for op in bundle.ops(0)}
    assert "layers.0.mlp.experts.1.down_proj" in modules
    assert "optimizer" in modules
    routing = bundle.routing(0)
    assert sorted({r["layer"] for r in routing}) == [0, 1]
    assert routing[0]["topk_ids"].shape == (8 * 11, 2)
    assert sum(routing[0]["token_counts"]) == 8 * 11 * 2
    assert any(name.startswith("param/layers.0.mlp.gate.weight") for name, _ in bundle.tensor_names())


def test_bisect_names_the_broken_expert(tmp_path):
    path = tmp_path / "broken.moerr"
    train(path, mode="stats", steps=1, break_expert=True)
    found = json.loads(run("bisect", path, "--json", ok=(1,)))[0]
    assert found["found"]
    assert found["module"].startswith("layers.0.mlp.experts.1"), found
    assert found["phase"] == "forward"


def test_diff_sees_bf16_autocast_and_calls_it_rounding(tmp_path):
    a, b = tmp_path / "fp32.moerr", tmp_path / "bf16.moerr"
    train(a, steps=1)
    train(b, steps=1, autocast=True)
    same = json.loads(run("diff", a, a, "--json"))
    assert same["diverged_ops"] == 0 and same["only_a"] == 0
    assert same["introduced"]["within_rounding"], same["introduced"]["first"]
    # The outputs differ from the first autocast op on, and every op's
    # share of it is within bf16 rounding (estimated: replayable bundles).
    report = json.loads(run("diff", a, b, "--json"))
    assert report["diverged_ops"] > 0 and report["diverged"][0]["module"].startswith("layers.0"), report["diverged"][0]
    assert report["introduced"]["estimated"] and report["introduced"]["within_rounding"], report["introduced"]["first"]


def test_errors_carry_moerr_messages(tmp_path):
    with pytest.raises(ValueError, match="stats, replayable or full"):
        with moerr.record(tmp_path / "x.moerr", mode="everything"):
            pass
    (tmp_path / "junk.moerr").write_bytes(b"not a bundle" * 10)
    with pytest.raises(ValueError):
        moerr.Bundle(tmp_path / "junk.moerr")
    with pytest.raises(FileNotFoundError):
        moerr.Bundle(tmp_path / "absent.moerr")


def test_routing_of_an_unknown_router(tmp_path):
    path = tmp_path / "r.moerr"
    with moerr.record(path, mode="stats", overwrite=True) as rec:
        with rec.step():
            logits = torch.randn(5, 6)
            weights, ids = torch.topk(torch.softmax(logits, -1), 2)
            moerr.routing(3, ids, weights, logits)
            moerr.routing(4, ids, weights)  # a router that shows no logits
    routing = moerr.Bundle(path).routing(0)
    assert [r["layer"] for r in routing] == [3, 4]
    assert torch.equal(routing[0]["topk_ids"].long(), ids)
    assert routing[0]["logits"] is not None and routing[1]["logits"] is None
    assert sum(routing[1]["token_counts"]) == ids.numel()


def test_a_step_the_bundle_lacks_is_an_error(tmp_path):
    path = tmp_path / "run.moerr"
    train(path, mode="stats", steps=2)
    for command in (["bisect", path], ["lint", path], ["replay", path], ["report", path, "-o", tmp_path / "r.html"]):
        p = subprocess.run([MOERR, *map(str, command), "--step", "7"], capture_output=True, text=True)
        assert p.returncode == 2, (command, p.stdout)
        assert "step 7 is not in" in p.stderr and "(its steps: 0, 1)" in p.stderr, p.stderr
    assert not (tmp_path / "r.html").exists()
    assert "step 1: no overflowing op" in run("bisect", path, "--step", "1")


def test_an_output_never_overwrites_an_input(tmp_path):
    path = tmp_path / "run.moerr"
    train(path, mode="stats", steps=1)
    before = path.read_bytes()
    same = str(tmp_path / "." / "run.moerr")  # the same file by another name
    for command in (["report", path, "-o", same, "--force"], ["salvage", path, "-o", same, "--force"],
                    ["diff", path, path, "--html", same], ["reduce", path, "-o", same, "--force"]):
        p = subprocess.run([MOERR, *map(str, command)], capture_output=True, text=True)
        assert p.returncode == 2, (command, p.stdout)
        assert "write the output elsewhere" in p.stderr, p.stderr
    assert path.read_bytes() == before
    assert json.loads(run("verify", path, "--json"))["ok"]
    (tmp_path / "cut.moerr").write_bytes(before[: len(before) // 2])
    cut = json.loads(run("verify", tmp_path / "cut.moerr", "--json", ok=(1,)))
    assert not cut["ok"] and "moerr salvage" in cut["damage"], cut


def test_work_directories_are_the_commands_own(tmp_path):
    (tmp_path / "run.moerr").write_bytes(b"someone's recording")
    p = subprocess.run([MOERR, "demo", "--dir", str(tmp_path), "--preset", "tiny"], capture_output=True, text=True)
    assert p.returncode == 2 and "pass another directory" in p.stderr, p.stderr
    assert (tmp_path / "run.moerr").read_bytes() == b"someone's recording"
    p = subprocess.run([MOERR, "proxy-eval", "-o", str(tmp_path)], capture_output=True, text=True)
    assert p.returncode == 2 and "pass another directory" in p.stderr, p.stderr
    # A directory an earlier run left (no marker) with its --json report in
    # it, named by another spelling: the command's own, so it goes on (to
    # the model, which is bad here: a preset of the table, so past the
    # option's check, that the default family cannot have).
    old = tmp_path / "old-eval"
    (old / "warmup").mkdir(parents=True)
    (old / "report.json").write_text("{}")
    p = subprocess.run([MOERR, "proxy-eval", "-o", "old-eval", "--json", "./old-eval/../old-eval/report.json",
                        "--preset", "tiny-mla"], capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 2 and "preset tiny-mla has DeepSeek-V3's" in p.stderr, p.stderr
