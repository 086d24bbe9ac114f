"""`moerr bisect` names the cause of an overflow, not only the first NaN: a
plain-PyTorch fp32 MoE step where one expert's down projection is scaled by
1e37. The expert's output reaches ~3e36, finite in fp32; the first non-finite
value appears later, in the next layer's layer_norm, which squares it.

Run by ctest with PYTHONPATH=BUILD/python and MOERR_BIN=the moerr binary."""
import json
import os
import subprocess

import torch
import torch.nn.functional as F

import moerr
from moerr.examples import TinyMoe

MOERR = os.environ.get("MOERR_BIN", "moerr")
BROKEN = "layers.0.mlp.experts.1"


def record_scaled_expert_step(path, dtype=None):
    torch.manual_seed(0)
    model = TinyMoe()
    with torch.no_grad():
        model.layers[0].mlp.experts[1].down_proj.weight.mul_(1e37)
    moerr.instrument(model)
    tokens = torch.randint(0, 16, (8, 12), generator=torch.Generator().manual_seed(1))
    with moerr.record(path, mode="stats", overwrite=True) as rec:
        with rec.step():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype is not None):
                logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, 16), tokens[:, 1:].reshape(-1))
            loss.backward()
            rec.outcome(loss=loss.item())


def bisect(path, *flags):
    p = subprocess.run([MOERR, "bisect", str(path), "--json", *flags], capture_output=True, text=True)
    assert p.returncode == 1, (p.returncode, p.stderr)  # 1: an overflow was found
    return json.loads(p.stdout)[0]


def test_bisect_names_the_scaled_expert_not_the_later_layer_norm(tmp_path):
    path = tmp_path / "scaled.moerr"
    record_scaled_expert_step(path)
    found = bisect(path)
    # The first non-finite output, under the keys bisect has always printed.
    assert found["found"] and found["op"] == "aten::layer_norm", found
    assert found["module"] == "layers.1.norm" and found["phase"] == "forward", found
    # Its cause: the broken expert's down projection, whose output rose
    # ~120 bits over its input and over the other experts' projections.
    cause = found["cause"]
    assert cause["found_explosion"] and cause["exploded"], cause
    assert cause["module"].startswith(BROKEN), cause
    assert cause["op"] == "aten::linear", cause
    assert cause["op_index"] < found["op_index"]
    assert 1e35 < cause["abs_max"] < 3.4e38, cause
    assert cause["input_rise_bits"] > 100 and cause["peer_rise_bits"] > 100, cause
    # The chain runs from the cause to the first non-finite op.
    chain = found["chain"]
    assert chain[0] == {k: v for k, v in cause.items() if k != "found_explosion"}, chain[0]
    assert chain[-1]["op_index"] == found["op_index"]
    assert [c["op_index"] for c in chain] == sorted(c["op_index"] for c in chain)
    assert not any(c["exploded"] for c in chain[1:]), chain

    text = subprocess.run([MOERR, "bisect", str(path)], capture_output=True, text=True).stdout
    assert f"overflow caused by op {cause['op_index']} " in text, text
    assert "first overflowing op %d " % found["op_index"] in text, text


def test_bisect_names_the_scaled_expert_under_bf16_autocast(tmp_path):
    path = tmp_path / "bf16.moerr"
    record_scaled_expert_step(path, dtype=torch.bfloat16)
    found = bisect(path)
    assert found["cause"]["module"].startswith(BROKEN), found["cause"]
    assert not found["module"].startswith(BROKEN), found["module"]


def test_bool_masks_are_never_overflow_candidates(tmp_path):
    # A bool mask of ones is at its dtype's maximum; --fraction must not
    # flag it. A healthy step has no overflow at half of fp32's range.
    path = tmp_path / "mask.moerr"
    with moerr.record(path, mode="stats", overwrite=True) as rec:
        with rec.step():
            x = torch.randn(4, 8, requires_grad=True)
            mask = torch.ones(4, 8, dtype=torch.bool)
            y = torch.where(mask, x, torch.zeros_like(x)).sum()
            y.backward()
    p = subprocess.run([MOERR, "bisect", str(path), "--json", "--fraction", "0.5"], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert json.loads(p.stdout)[0]["found"] is False, p.stdout
    assert any(op["name"] == "aten::ones" for op in moerr.Bundle(path).ops(0))


def test_a_one_off_rescale_without_peers_is_its_own_cause(tmp_path):
    # weight.mul_(1e38) inside the step, before the forward: an op with no
    # peers whose only input is a parameter. Judged on its inputs alone
    # (+126 bits), it is the cause; the first NaN comes after it.
    path = tmp_path / "rescale.moerr"
    torch.manual_seed(0)
    m = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)
    with moerr.record(path, mode="stats") as rec:
        with rec.step():
            with torch.no_grad():
                m.weight.mul_(1e38)
            m(x).pow(2).sum().backward()
    found = bisect(path)
    assert found["op"] != "aten::mul_", found
    cause = found["cause"]
    assert cause["found_explosion"] and cause["op"] == "aten::mul_", cause
    assert cause["input_rise_bits"] > 100, cause
