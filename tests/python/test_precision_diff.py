"""`moerr diff` tells rounding from a bug: one plain-PyTorch MoE step
(activation checkpointing, AdamW, clipping) recorded in full mode in fp32,
in fp64 and under CPU bf16 autocast, healthy and with one bug each: a wrong
kernel (aten::silu of one expert computing gelu, or 1% too large, through a
TorchDispatchMode, as a device's kernel would), a hand-written backward off
by 1%, a program that calls gelu where the other calls silu. Each bug is
named by the first op introducing error beyond its budget, however much the
precisions differ everywhere else; the healthy pairs exit 0.

Run by ctest with PYTHONPATH=BUILD/python and MOERR_BIN=the moerr binary."""
import json
import os
import subprocess

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch.utils._python_dispatch import TorchDispatchMode

import moerr
from moerr.examples import TinyMoe

MOERR = os.environ.get("MOERR_BIN", "moerr")
EXPERT = "layers.1.mlp.experts.3"


def run(*args, ok=(0,)):
    p = subprocess.run([MOERR, *map(str, args)], capture_output=True, text=True, timeout=300)
    assert p.returncode in ok, p.stdout + p.stderr
    return p.stdout


class ScaledSilu(torch.autograd.Function):
    """silu with a hand-written backward whose last factor is `scale`
    (1.0 is right)."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(x)
        ctx.scale = scale
        return F.silu(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return g * (s * (1 + x * (1 - s))) * ctx.scale, None


class WrongKernel(TorchDispatchMode):
    """aten::silu, while `on`, computes what `kernel` says: a device's
    wrong kernel, the op and its arguments unchanged."""

    def __init__(self, kernel):
        super().__init__()
        self.kernel, self.on = kernel, False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.on and func is torch.ops.aten.silu.default:
            return self.kernel(args[0])
        return func(*args, **(kwargs or {}))


def record(path, precision="fp32", kernel=None, backward_scale=1.0, gelu_in_code=False):
    torch.manual_seed(0)
    model = TinyMoe(vocab=32, d=32, experts=4, layers=2)
    if precision == "fp64":
        model = model.double()
    moerr.instrument(model)
    expert = model.layers[1].mlp.experts[3]
    act = (lambda x: F.gelu(x)) if gelu_in_code else (lambda x: ScaledSilu.apply(x, backward_scale))
    expert.forward = lambda x: expert.down_proj(act(expert.gate_proj(x)) * expert.up_proj(x))
    mode = WrongKernel(kernel)
    if kernel is not None:
        expert.register_forward_pre_hook(lambda m, a: setattr(mode, "on", True))
        expert.register_forward_hook(lambda m, a, o: setattr(mode, "on", False))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    tokens = torch.randint(0, 32, (4, 12), generator=torch.Generator().manual_seed(1))
    with moerr.record(path, mode="full") as rec, mode, rec.step():
        step(model, opt, tokens, precision)
    return path


def step(model, opt, tokens, precision):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        logits = torch.utils.checkpoint.checkpoint(model, tokens[:, :-1], use_reentrant=False)
    loss = F.cross_entropy(logits.float().reshape(-1, 32), tokens[:, 1:].reshape(-1))
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    # A Python number computed from an .item(): it differs between the
    # precisions as the gradients do, and is no program difference.
    torch._foreach_mul_([p.grad for p in model.parameters()], 0.9 + 0.1 / (1.0 + norm.item()))
    with moerr.scope("optimizer"):
        opt.step()
    opt.zero_grad()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("precision")
    variants = {
        "fp32": {},
        "fp64": {"precision": "fp64"},
        "bf16": {"precision": "bf16"},
        "bf16_gelu_kernel": {"precision": "bf16", "kernel": torch.ops.aten.gelu.default},
        "bf16_scaled_kernel": {"precision": "bf16", "kernel": lambda x: torch.ops.aten.silu.default(x) * 1.01},
        "bf16_backward": {"precision": "bf16", "backward_scale": 1.01},
        "bf16_gelu_code": {"precision": "bf16", "gelu_in_code": True},
    }
    return {name: record(d / f"{name}.moerr", **kw) for name, kw in variants.items()}


def diff(a, b, *extra, ok=(0, 1)):
    return json.loads(run("diff", a, b, "--json", *extra, ok=ok))


def first(report):
    f = report["introduced"]["first"]
    assert f is not None, report["introduced"]
    return f


@pytest.mark.parametrize("a,b", [("fp32", "bf16"), ("fp64", "fp32")])
def test_a_healthy_pair_is_within_rounding(runs, a, b):
    report = diff(runs[a], runs[b], ok=(0,))
    intro = report["introduced"]
    assert sum(op["observed"] > 0 for op in intro["ops"]) > 100  # the precisions differ almost everywhere
    assert not intro["estimated"] and intro["within_rounding"] and intro["first"] is None, intro["first"]
    assert intro["measured_a"] > 500 and intro["measured_b"] > 500, intro
    assert intro["largest"] is not None
    for op in intro["ops"]:
        for side in (op["a"], op["b"]):
            assert side is None or not side["beyond"], op


def test_a_number_computed_from_an_item_is_no_program_difference(runs):
    report = diff(runs["fp32"], runs["bf16"], ok=(0,))
    scaled = [op for op in report["introduced"]["ops"] if op["op"] == "aten::_foreach_mul_"]
    assert scaled and scaled[0]["arguments"] and scaled[0]["arguments_after_item"], scaled
    assert not scaled[0]["beyond"], scaled[0]


def test_the_text_says_within_bf16_rounding(runs):
    text = run("diff", runs["fp32"], runs["bf16"])
    assert "differences within bf16 rounding" in text, text
    assert "largest introduced error:" in text, text


@pytest.mark.parametrize("bug", ["bf16_gelu_kernel", "bf16_scaled_kernel"])
def test_a_wrong_kernel_is_the_first_op_introducing_error(runs, bug):
    report = diff(runs["fp32"], runs[bug], ok=(1,))
    f = first(report)
    assert f["kind"] == "introduced", f
    op = f["op"]
    assert (op["op"], op["module"], op["phase"]) == ("aten::silu", EXPERT, "forward"), op
    assert op["b"]["beyond"] and not op["a"]["beyond"], op
    # What it adds, not what it inherits: bf16's rounding of its inputs.
    assert op["b"]["introduced"] > 2 * op["inherited"], op


def test_a_backward_off_by_one_percent_is_named_in_the_backward(runs):
    report = diff(runs["fp32"], runs["bf16_backward"], ok=(1,))
    f = first(report)
    assert f["kind"] == "arguments", f
    assert f["op"]["phase"] == "backward" and f["op"]["op"] == "aten::mul", f
    assert "1 vs 1.01" in f["op"]["arguments"], f


def test_a_program_calling_another_op_is_named(runs):
    report = diff(runs["bf16"], runs["bf16_gelu_code"], ok=(1,))
    f = first(report)
    assert f["kind"] == "program", f
    names = {(o["op"], o["module"]) for o in f["difference"]["only_a"]} | {
        (o["op"], o["module"]) for o in f["difference"]["only_b"]}
    assert ("aten::silu", EXPERT) in names and ("aten::gelu", EXPERT) in names, f


def test_statistics_are_estimated_and_say_so(runs):
    healthy = diff(runs["fp32"], runs["bf16"], "--estimate", ok=(0,))
    assert healthy["introduced"]["estimated"] and healthy["introduced"]["within_rounding"], healthy["introduced"]
    broken = diff(runs["fp32"], runs["bf16_gelu_kernel"], "--fingerprints", ok=(1,))
    f = first(broken)
    assert broken["introduced"]["estimated"] and f["op"]["module"] == EXPERT and f["op"]["op"] == "aten::silu", f
    text = run("diff", runs["fp32"], runs["bf16_gelu_kernel"], "--estimate", ok=(1,))
    assert "estimate" in text and 'record(mode="full")' in text, text


def test_the_html_report_plots_introduced_and_inherited_error(runs, tmp_path):
    html = tmp_path / "diff.html"
    run("diff", runs["fp32"], runs["bf16_gelu_kernel"], "--html", html, ok=(1,))
    page = html.read_text()
    assert "inherited from the inputs" in page and "introduced, beyond budget" in page


EP_RANK = """
import torch, torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
import moerr
from moerr.examples import MIXTRAL_TINY, MixtralForCausalLM, hf_expert_parallel_step, _init_gloo

class Gelu(TorchDispatchMode):  # aten::silu computes gelu: a wrong kernel
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.silu.default:
            return torch.ops.aten.gelu.default(args[0])
        return func(*args, **(kwargs or {}))

_init_gloo(INIT)
rank, world = dist.get_rank(), dist.get_world_size()
config = dict(MIXTRAL_TINY, num_local_experts=4, num_hidden_layers=1)
torch.manual_seed(0)
model = MixtralForCausalLM(config, rank, world)
moerr.instrument(model)
block = model.model.layers[0].block_sparse_moe
if BUG is not None and block.expert_offset <= BUG < block.expert_offset + len(block.experts):
    mode, expert = Gelu(), block.experts[BUG - block.expert_offset]
    def enter(m, a):
        mode.__enter__()
    def leave(m, a, o):
        mode.__exit__(None, None, None)
    expert.register_forward_pre_hook(enter)
    expert.register_forward_hook(leave)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
batch = torch.randint(0, 32, (4, 8), generator=torch.Generator().manual_seed(100))  # the world's
tokens = batch[rank * 4 // world:(rank + 1) * 4 // world]
with moerr.record(RUN, ep_size=world, experts=4, mode="full", overwrite=True) as rec:
    with rec.step():
        hf_expert_parallel_step(model, opt, tokens)
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def ep_runs(tmp_path_factory):
    """One expert-parallel step of a Mixtral-layout model on one global
    batch: on 2 ranks, healthy and with expert 2 (rank 1's first) running a
    wrong kernel; and healthy on 4 ranks."""
    from test_distributed_record import run_ranks
    d = tmp_path_factory.mktemp("ep")
    runs = {"healthy": d / "healthy", "broken": d / "broken", "healthy4": d / "healthy4"}
    run_ranks("BUG = None\n" + EP_RANK, runs["healthy"])
    run_ranks("BUG = 2\n" + EP_RANK, runs["broken"])
    run_ranks("BUG = None\n" + EP_RANK, runs["healthy4"], world=4)
    return runs


def test_two_expert_parallel_runs_are_judged_rank_by_rank(ep_runs):
    report = json.loads(run("diff", ep_runs["healthy"], ep_runs["broken"], "--json", ok=(1,)))
    parts = {p["what"]: p["introduced"] for p in report["parts"]}
    assert set(parts) == {"rank 0", "rank 1"}, parts
    assert parts["rank 0"]["within_rounding"] and not parts["rank 0"]["estimated"], parts["rank 0"]["first"]
    f = parts["rank 1"]["first"]
    assert f is not None and f["kind"] == "introduced", parts["rank 1"]
    assert f["op"]["op"] == "aten::silu" and f["op"]["module"] == "model.layers.0.block_sparse_moe.experts.2", f


def test_worlds_of_two_sizes_are_judged_expert_by_expert(ep_runs):
    report = json.loads(run("diff", ep_runs["healthy4"], ep_runs["broken"], "--json", ok=(1,)))
    parts = {p["what"]: p["introduced"] for p in report["parts"]}
    assert set(parts) == {f"expert {e}" for e in range(4)}, parts
    for e in (0, 1, 3):
        assert parts[f"expert {e}"]["within_rounding"], (e, parts[f"expert {e}"]["first"])
    f = parts["expert 2"]["first"]
    assert f is not None and f["kind"] == "introduced" and f["op"]["op"] == "aten::silu", parts["expert 2"]
