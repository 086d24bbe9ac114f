"""Python loops as users write them: Python numbers in the step replay
bitwise, a step that raises is recorded as raised, and the loop's named
metrics are recorded and drive the anomaly trigger.

Run by ctest with PYTHONPATH=BUILD/python and MOERR_BIN=the moerr binary."""
import json
import os
import subprocess

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

import moerr
from moerr.examples import TinyMoe

MOERR = os.environ.get("MOERR_BIN", "moerr")


def run(*args, ok=(0,)):
    p = subprocess.run([MOERR, *map(str, args)], capture_output=True, text=True)
    assert p.returncode in ok, p.stdout + p.stderr
    return p.stdout


def replays_bitwise(path):
    """Every recorded step replays with 0 outputs differing, twice alike."""
    steps = json.loads(run("replay", path, "--check", "--json"))
    assert steps, path
    for s in steps:
        assert s["compared"] > 0, s
        assert s["differ"] == 0, s
        assert s["first_divergence"] is None, s
        assert s["bitwise_identical_twice"], s
    return steps


# Each case: one step of a Linear under SGD, with Python numbers where a
# loop puts them. The value 1.0000001 is not exact in float32.
def scalar_times_float(m, x, opt):
    loss = (m(x) * 1.0000001).pow(2).sum()
    loss.backward()
    t = torch.tensor(0.8365891, dtype=torch.float32) * 1.0000001
    (t + 1e-6).item()


def int_and_bool_operands(m, x, opt):
    y = m(x)
    loss = ((y * 3) + 2 + True).pow(2).mean() / 7
    loss.backward()
    (y > 0).sum() * 2


def clip_grad_norm(m, x, opt):
    m(x).pow(2).sum().backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)


def lr_schedule(m, x, opt):
    for group in opt.param_groups:
        group["lr"] = 0.1 * 0.9 ** 3 / 1.7  # a schedule's Python float
    m(x).pow(2).sum().backward()


def loss_scaling(m, x, opt):
    scale = 1024.0 / 3.0
    (m(x).pow(2).sum() * scale).backward()
    for p in m.parameters():
        p.grad.div_(scale)


def in_place_forms(m, x, opt):
    m(x).pow(2).sum().backward()
    with torch.no_grad():
        for p in m.parameters():
            p.grad.mul_(0.3333333)
            p.add_(p.grad, alpha=-0.0123456789)
            p.mul_(1 - 1e-4 * 0.1)


def combine_adds_zero_times_sum(m, x, opt):
    # An expert-parallel combine's `out + out.sum() * 0.0` (every expert in the
    # graph): the product is an f32 zero, not an f64 one.
    y = m(x)
    (y + y.sum() * 0.0).pow(2).sum().backward()


CASES = [scalar_times_float, int_and_bool_operands, clip_grad_norm, lr_schedule, loss_scaling, in_place_forms,
         combine_adds_zero_times_sum]


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_python_numbers_replay_bitwise(tmp_path, case, autocast):
    torch.manual_seed(0)
    m = nn.Linear(8, 8)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    path = tmp_path / "run.moerr"
    with moerr.record(path, mode="replayable") as rec:
        with rec.step():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                case(m, x, opt)
            opt.step()
            opt.zero_grad()
    replays_bitwise(path)


def test_a_python_number_is_recorded_as_the_number_used(tmp_path):
    path = tmp_path / "run.moerr"
    with moerr.record(path, mode="replayable") as rec:
        with rec.step():
            torch.tensor(0.8365891, dtype=torch.float32) * 1.0000001
    ops = moerr.Bundle(path).ops(0)
    mul = [op for op in ops if op["name"] == "aten::mul"]
    assert mul, [op["name"] for op in ops]
    assert ("wrapped_float", 1.0000001) in [(a["kind"], a.get("value")) for a in mul[0]["args"]], mul[0]


def test_a_loop_as_users_write_it_replays_bitwise(tmp_path):
    """Activation checkpointing, bf16 autocast, gradient clipping and AdamW."""
    torch.manual_seed(0)
    model = TinyMoe()
    moerr.instrument(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + 0.1 * s))
    tokens = torch.randint(0, 16, (4, 10), generator=torch.Generator().manual_seed(1))
    path = tmp_path / "loop.moerr"
    with moerr.record(path, mode="replayable") as rec:
        for _ in range(2):
            with rec.step():
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    logits = torch.utils.checkpoint.checkpoint(model, tokens[:, :-1], use_reentrant=False)
                loss = F.cross_entropy(logits.float().reshape(-1, 16), tokens[:, 1:].reshape(-1))
                (loss / 2.0).backward()
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                with moerr.scope("optimizer"):
                    opt.step()
                    sched.step()
                    opt.zero_grad(set_to_none=True)
                rec.outcome(loss=loss.item(), grad_norm=norm.item())
    steps = replays_bitwise(path)
    assert [s["step"] for s in steps] == [0, 1]


class CudaFault(RuntimeError):
    pass


def raising_loop(path, trigger="always", raise_at=1, steps=3, **kw):
    torch.manual_seed(0)
    model = TinyMoe()
    moerr.instrument(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tokens = torch.randint(0, 16, (4, 10), generator=torch.Generator().manual_seed(1))
    with pytest.raises(CudaFault, match="illegal memory access"):
        with moerr.record(path, mode="replayable", trigger=trigger, **kw) as rec:
            for step in range(steps):
                with rec.step():
                    loss = F.cross_entropy(model(tokens[:, :-1]).reshape(-1, 16), tokens[:, 1:].reshape(-1))
                    if step == raise_at:
                        raise CudaFault("CUDA error: an illegal memory access was encountered")
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
                    rec.outcome(loss=loss.item())


def test_a_step_that_raises_is_recorded_as_raised(tmp_path):
    path = tmp_path / "raised.moerr"
    raising_loop(path)  # the exception reaches the loop unchanged
    assert moerr.Bundle(path).steps == [0]  # complete steps only

    text = run("inspect", path)
    first = text.splitlines()[1]
    assert first.startswith("  step 1 RAISED CudaFault: CUDA error: an illegal memory access"), text
    assert "after op" in first and "aten::" in first, first
    assert "raised steps: 1" in text, text
    summary = json.loads(run("inspect", path, "--json"))
    raised = summary["raised_steps"]["1"]
    assert raised["type"] == "CudaFault"
    assert "raise CudaFault" in raised["traceback"]
    assert raised["last_op"]["name"].startswith("aten::")

    # bisect and replay read the raised step with the complete one, and say so first.
    bisect = run("bisect", path)
    assert "step 1 RAISED CudaFault" in bisect, bisect
    replay = run("replay", path, "--step", 1)
    lines = replay.splitlines()
    assert lines[0].startswith("step 1 RAISED CudaFault"), replay
    assert "up to where the original step stopped" in lines[1], replay
    steps = json.loads(run("replay", path, "--json"))
    assert [s["step"] for s in steps] == [0, 1]
    assert steps[1]["raised"].startswith("step 1 RAISED") and steps[1]["differ"] == 0, steps[1]

    report = tmp_path / "report.html"
    run("report", path, "-o", report)
    assert "Step 1 raised CudaFault" in report.read_text()


def test_the_anomaly_trigger_keeps_a_raised_step(tmp_path):
    path = tmp_path / "anomaly.moerr"
    raising_loop(path, trigger="anomaly", raise_at=3, steps=5, ring=2)
    summary = json.loads(run("inspect", path, "--json"))
    assert summary["complete_steps"] == [2], summary["complete_steps"]
    assert list(summary["raised_steps"]) == ["3"], summary["raised_steps"]


def metrics_loop(path, kl_at=None, reward_at=None, **kw):
    torch.manual_seed(0)
    m = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with moerr.record(path, mode="stats", **kw) as rec:
        for step in range(8):
            with rec.step():
                loss = m(x).pow(2).mean()
                loss.backward()
                kl = 0.02 + 0.001 * step if step != kl_at else 0.9
                reward = 0.6 + 0.01 * step if step != reward_at else 0.05
                rec.outcome(loss=loss.item(), reward=reward, kl=kl, entropy=1.5, response_length=37)
    return rec


def test_named_metrics_are_recorded_and_shown(tmp_path):
    path = tmp_path / "metrics.moerr"
    metrics_loop(path)
    text = run("inspect", path)
    header = [line for line in text.splitlines() if line.strip().startswith("step") and "reward" in line]
    assert header and header[0].split() == ["step", "loss", "entropy", "kl", "response_length", "reward"], text
    outcomes = json.loads(run("inspect", path, "--json"))["outcomes"]
    assert sorted(outcomes, key=int) == [str(s) for s in range(8)]
    assert outcomes["3"]["kl"] == pytest.approx(0.023) and outcomes["3"]["reward"] == pytest.approx(0.63)
    report = tmp_path / "r.html"
    run("report", path, "-o", report)
    assert "kl per RL step" in report.read_text()


@pytest.mark.parametrize("watch,at,step", [({"kl": "spike"}, {"kl_at": 5}, 5),
                                           ({"reward": "collapse"}, {"reward_at": 6}, 6),
                                           ({"reward": ("collapse", 0.05)}, {"reward_at": 6}, None)])
def test_the_anomaly_trigger_watches_named_metrics(tmp_path, watch, at, step):
    path = tmp_path / "watched.moerr"
    if step is None:  # a threshold the collapse does not pass: nothing written
        with pytest.warns(moerr.RecordingWarning, match="no step was anomalous"):
            rec = metrics_loop(path, trigger="anomaly", ring=2, watch=watch, **at)
        assert rec.written_steps == []
        return
    rec = metrics_loop(path, trigger="anomaly", ring=2, watch=watch, **at)
    assert rec.written_steps == [step - 1, step]
    name = next(iter(watch))
    assert f"{name}" in json.dumps(moerr.Bundle(path).annotation("anomaly", step=step))


def test_metric_misuse_is_refused(tmp_path):
    with pytest.raises(ValueError, match="anomaly trigger"):
        metrics_loop(tmp_path / "a.moerr", watch={"kl": "spike"})
    with pytest.raises(ValueError, match="spike.*collapse"):
        metrics_loop(tmp_path / "b.moerr", trigger="anomaly", watch={"kl": "rise"})
    with pytest.raises(TypeError, match="reward=.*float"):
        with moerr.record(tmp_path / "c.moerr") as rec:
            with rec.step():
                rec.outcome(reward="high")
