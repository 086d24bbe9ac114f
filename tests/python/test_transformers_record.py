"""A training step of a transformers 5 MoE model (a tiny random-config
Qwen2-MoE, fused experts: mlp.experts.gate_up_proj [E, 2I, H] and
mlp.experts.down_proj [E, H, I]) recorded with moerr.record, under both of
transformers' experts implementations ("eager", a loop of F.linear per
expert; "grouped_mm", the CPU default): the step replays bitwise, the
routing recorded is the model's own router output, an expert's down
projection scaled by 1e37 is named by bisect, and record(model=,
hf_config=) splits the fused experts per expert for `moerr replay --ranks`.

Run by ctest with PYTHONPATH=BUILD/python and MOERR_BIN=the moerr binary."""
import json
import os
import subprocess

import pytest
import torch
import torch.distributed as dist

import moerr

transformers = pytest.importorskip("transformers")

MOERR = os.environ.get("MOERR_BIN", "moerr")
IMPLEMENTATIONS = ["eager", "grouped_mm"]
LAYER, EXPERT = 1, 2


def run(*args, ok=(0,)):
    p = subprocess.run([MOERR, *map(str, args)], capture_output=True, text=True)
    assert p.returncode in ok, p.stdout + p.stderr
    return p.stdout


def tiny_qwen2_moe(experts):
    config = transformers.Qwen2MoeConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        shared_expert_intermediate_size=16, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        num_experts=4, num_experts_per_tok=2, max_position_embeddings=64, tie_word_embeddings=False)
    config._experts_implementation = experts
    torch.manual_seed(0)
    return transformers.Qwen2MoeForCausalLM(config).float()


def train(path, net, steps=2, **record):
    """`steps` AdamW steps of causal-LM training recorded into `path`;
    returns each step's router outputs (layer -> (top-k ids, weights)) as
    the model computed them."""
    moerr.instrument(net)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    torch.manual_seed(1)
    ids = torch.randint(0, 64, (2, 8))
    seen = []
    for i, layer in enumerate(net.model.layers):
        layer.mlp.gate.register_forward_hook(
            lambda gate, args, out, i=i: seen[-1].__setitem__(i, (out[2].clone(), out[1].clone())))
    with moerr.record(path, mode="replayable", overwrite=True, **record) as rec:
        for _ in range(steps):
            seen.append({})
            with rec.step():
                loss = net(input_ids=ids, labels=ids).loss
                loss.backward()
                with moerr.scope("optimizer"):
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                rec.outcome(loss=loss.item())
    return seen


@pytest.mark.parametrize("experts", IMPLEMENTATIONS)
def test_a_training_step_replays_bitwise(tmp_path, experts):
    path = tmp_path / "run.moerr"
    train(path, tiny_qwen2_moe(experts))
    steps = json.loads(run("replay", path, "--check", "--json"))
    assert [s["step"] for s in steps] == [0, 1], steps
    for s in steps:
        assert s["compared"] > 1000 and s["differ"] == 0 and s["first_divergence"] is None, s
        assert s["bitwise_identical_twice"], s
    names = {op["name"] for op in moerr.Bundle(path).ops(0) if op["module"].endswith("mlp.experts")}
    assert ("aten::_grouped_mm" in names) == (experts == "grouped_mm"), names


@pytest.mark.parametrize("experts", IMPLEMENTATIONS)
def test_the_routing_recorded_is_the_routers_own(tmp_path, experts):
    path = tmp_path / "run.moerr"
    seen = train(path, tiny_qwen2_moe(experts))
    bundle = moerr.Bundle(path)
    for step, router in enumerate(seen):
        recorded = bundle.routing(step)
        assert [r["layer"] for r in recorded] == [0, 1, 2], recorded
        for r in recorded:
            ids, weights = router[r["layer"]]
            assert torch.equal(r["topk_ids"], ids) and torch.equal(r["topk_weights"], weights), r
            assert r["logits"].shape == (16, 4) and sum(r["token_counts"]) == 32, r


@pytest.mark.parametrize("experts", IMPLEMENTATIONS)
def test_bisect_names_the_scaled_experts_linear(tmp_path, experts):
    model = tiny_qwen2_moe(experts)
    with torch.no_grad():
        model.model.layers[LAYER].mlp.experts.down_proj[EXPERT].mul_(1e37)
    path = tmp_path / "bad.moerr"
    train(path, model, steps=1)
    p = subprocess.run([MOERR, "bisect", path, "--json"], capture_output=True, text=True)
    assert p.returncode == 1, p.stdout + p.stderr
    cause = json.loads(p.stdout)[0]["cause"]
    assert cause["found_explosion"] and cause["module"] == f"model.layers.{LAYER}.mlp.experts", cause
    assert cause["outside_input_abs_max"] > 1e35, cause
    if experts == "grouped_mm":
        assert cause["op"] == "aten::_grouped_mm", cause  # all experts in one op: no index to name
        return
    # eager: the linear's weight is aten::select(down_proj, 0, j), which names the expert.
    ops = moerr.Bundle(path).ops(0)
    assert cause["op"] == "aten::linear", cause
    weight = ops[cause["op_index"]]["args"][1]["value"]
    select = next(op for op in ops if any(o and o["id"] == weight for o in op["outputs"]))
    assert select["name"] == "aten::select", select
    assert [a["value"] for a in select["args"][1:]] == [0, EXPERT], select


def safetensors_names(path):
    blob = open(path, "rb").read()
    return set(json.loads(blob[8:8 + int.from_bytes(blob[:8], "little")])) - {"__metadata__"}


@pytest.mark.parametrize("experts", IMPLEMENTATIONS)
def test_record_with_hf_config_splits_the_fused_experts(tmp_path, experts):
    model = tiny_qwen2_moe(experts)
    hf_config = json.loads(model.config.to_json_string())  # config.json's keys
    run_dir = tmp_path / "run"
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1)
    try:
        train(run_dir, model, steps=1, model=model, hf_config=hf_config)
    finally:
        dist.destroy_process_group()
    names = safetensors_names(run_dir / "hf" / "rank0.safetensors")
    for kind in ("param", "grad"):
        for j in range(4):
            for m in ("gate_proj", "up_proj", "down_proj"):
                assert f"{kind}/model.layers.1.mlp.experts.{j}.{m}.weight" in names, sorted(names)
    assert not any("gate_up_proj" in n or n.endswith("experts.down_proj") for n in names), sorted(names)
    p = subprocess.run([MOERR, "replay", run_dir, "--ranks", "1", "--json"], capture_output=True, text=True)
    report = json.loads(p.stdout[p.stdout.index("{"):])
    assert p.returncode == 0 and report["ok"], p.stdout + p.stderr
    kinds = {row["kind"] for row in report["compared"]}
    assert {"output", "loss", "dense gradient", "expert gradient"} <= kinds, kinds
    assert all(row["relative"] <= report["tolerance"] for row in report["compared"]), report
    assert report["routing"]["decisions_routed_live"] == 0, report["routing"]
