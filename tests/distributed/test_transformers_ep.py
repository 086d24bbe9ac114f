"""An expert-parallel training step of a transformers 5 MoE model on two Gloo
rank processes: examples.py's transformers_expert_parallel_main, a tiny
Qwen2MoeForCausalLM (fused experts, eager) whose experts module on each rank
keeps 2 of the 4 experts and dispatches its slots by all_to_all_single
(shard_transformers_experts), recorded with moerr.record(model=,
hf_config=). Each rank replays alone bitwise; `replay --ranks 1` rebuilds
the model and agrees within the stated tolerance; with one expert of rank 1
scaled by 1e37, bisect names rank 1, the experts module and the expert.

transformers' own expert parallelism is not what runs here:
from_pretrained(distributed_config=) needs accelerate; applied by hand it
is test_transformers_own_ep.py.

Run by ctest with PYTHONPATH=BUILD/python and MOERR_BIN=the moerr binary."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "python"))
pytest.importorskip("transformers")

import moerr  # noqa: E402
from test_distributed_hf import header_of  # noqa: E402
from test_distributed_record import moerr_cli, run_ranks  # noqa: E402

LAYER, EXPERT = 1, 3  # expert 3 of 4: rank 1's second (its expert_offset is 2)
MAIN = ("from moerr.examples import transformers_expert_parallel_main\n"
        "transformers_expert_parallel_main(RUN, init_method=INIT{})\n")


@pytest.fixture(scope="module")
def ep_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("transformers_ep") / "run"
    out = run_ranks(MAIN.format(""), run)
    assert all(f"rank {r} step 0: loss" in o for r, o in enumerate(out)), out
    return run


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_records_its_experts_and_replays_alone_bitwise(ep_run, rank):
    header, _ = header_of(ep_run / "hf" / f"rank{rank}.safetensors")
    experts = sorted({int(n.split(".experts.")[1].split(".")[0]) for n in header
                      if n.startswith("param/model.layers.1.mlp.experts.")})
    assert experts == [2 * rank, 2 * rank + 1], experts  # fused experts split, under their global index
    rc, out = moerr_cli("replay", ep_run, "--rank", rank)
    assert rc == 0, out
    # 2 layers x (counts, rows, rows back) forward, 2 x 2 backward.
    assert "outputs compared, 0 differ" in out and "c10d::all_to_all x10" in out, out


def test_replay_on_one_rank_agrees_within_the_tolerance(ep_run):
    rc, out = moerr_cli("replay", ep_run, "--ranks", 1, "--json")
    assert rc == 0, out
    report = json.loads(out[out.index("{"):])
    assert report["ok"] and report["original_ranks"] == 2 and report["ranks"] == 1, out
    kinds = {}
    for row in report["compared"]:
        kinds.setdefault(row["kind"], []).append(row)
        assert row["relative"] is not None and row["relative"] <= report["tolerance"], row
    assert set(kinds) == {"output", "loss", "dense gradient", "expert gradient"}, kinds.keys()
    assert len(kinds["output"]) == 2 * 3 and len(kinds["loss"]) == 2, out  # 2 layers and the logits, per rank
    assert all(r["scale"] > 0 for r in kinds["expert gradient"]), kinds["expert gradient"]
    # 2 ranks x 16 tokens x top-2, 2 layers: every decision served from the record.
    assert report["routing"] == {"served_slots": 128, "router_agrees": 128, "decisions_routed_live": 0}, out
    assert report["diverged_parameters"] == [] and report["loop_precision"] == "fp32", out


def test_bisect_names_the_rank_and_the_expert_of_a_one_rank_fault(tmp_path):
    run = tmp_path / "run"
    run_ranks(MAIN.format(f", explode=({LAYER}, {EXPERT})"), run)
    rc, out = moerr_cli("bisect", run, "--json")
    assert rc == 1, out
    found = json.loads(out[out.index("["):])[0]
    assert found["rank"] == 1 and found["carried"]["kind"] == "all_to_all", found
    cause = found["cause"]
    assert cause["found_explosion"] and cause["op"] == "aten::linear", cause
    assert cause["module"] == f"model.layers.{LAYER}.mlp.experts", cause
    # The linear's weight is aten::select(down_proj, 0, j): local expert j, global 2 + j on rank 1.
    ops = moerr.Bundle(run / "rank1.moerr").ops(0)
    weight = ops[cause["op_index"]]["args"][1]["value"]
    select = next(op for op in ops if any(o and o["id"] == weight for o in op["outputs"]))
    assert select["name"] == "aten::select", select
    assert [a["value"] for a in select["args"][1:]] == [0, EXPERT - 2], select
