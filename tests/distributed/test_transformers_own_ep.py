"""transformers' own expert parallelism, recorded: a tiny Qwen2MoeForCausalLM
(examples.QWEN2_MOE_TINY, eager experts) on two Gloo rank processes, made
expert-parallel by transformers.distributed.expert_parallel's
apply_expert_parallelism with the config's EP plan (grouped_gemm shards,
ep_dispatch_experts), so its AllToAllEP dispatches: the counts by
torch.distributed.all_to_all_single, the rows there and back by
torch.distributed._functional_collectives.all_to_all_single_autograd, both
imported by name into transformers' module before moerr.record starts.

The plan's grouped_gemm style makes each rank's experts DTensor parameters.
Their gradients and the optimizer's ops on them run on DTensors, wrapper
tensors with no storage, at the top of the dispatcher: a replayable
recording cannot capture them and refuses by name. With those shards made
plain local parameters (their values unchanged), the step records (with
model= and hf_config=), each rank replays alone bitwise, `replay --ranks 1`
agrees within the tolerance, and with one expert of rank 1 scaled by 1e37
bisect names rank 1, the experts module and the expert's linear.

Run by ctest with PYTHONPATH=BUILD/python and MOERR_BIN=the moerr binary."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "python"))
pytest.importorskip("transformers")

from test_distributed_record import moerr_cli, run_ranks  # noqa: E402

OWN_EP = """
import json, torch, torch.distributed as dist, transformers, moerr
import transformers.distributed.expert_parallel as ep
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from moerr.examples import QWEN2_MOE_TINY
LOCAL, EXPLODE = LOCAL_SHARDS, EXPLODE_EXPERT
dist.init_process_group("gloo", init_method=INIT, rank=int(os.environ["RANK"]), world_size=2)
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("ep", "tp"))  # experts over both ranks, no TP
config = transformers.Qwen2MoeConfig(**QWEN2_MOE_TINY)
config._experts_implementation = "eager"
torch.manual_seed(0)  # one model on every rank
model = transformers.Qwen2MoeForCausalLM(config).float()
plan = {key.replace("layers.*", f"model.layers.{i}"): style  # the config's own plan, per layer
        for i in range(config.num_hidden_layers) for key, style in config.base_model_ep_plan.items()}
ep.apply_expert_parallelism(model, mesh["ep"], mesh["tp"], plan)
for layer in model.model.layers:
    experts = layer.mlp.experts
    assert "install_forward" in experts.forward.__qualname__, experts.forward  # transformers' dispatch
    if LOCAL:  # each DTensor shard as a plain parameter of the same values
        for name, p in list(experts.named_parameters(recurse=False)):
            setattr(experts, name, torch.nn.Parameter(p.to_local().detach().clone()))
    layer.mlp.expert_offset = rank * experts.num_experts  # moerr.instrument names experts by global index
if EXPLODE is not None and EXPLODE[1] // 2 == rank:
    with torch.no_grad():
        model.model.layers[EXPLODE[0]].mlp.experts.down_proj[EXPLODE[1] % 2].mul_(1e37)
moerr.instrument(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
ids = torch.randint(0, config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(100 + rank))
try:
    for_fewer_ranks = dict(model=model, hf_config=json.loads(config.to_json_string())) if LOCAL else {}
    with moerr.record(RUN, overwrite=True, ep_size=2, experts=config.num_experts, **for_fewer_ranks) as rec:
        assert ep.all_to_all_single_autograd.__module__ == "moerr._functional"
        with rec.step():
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            for name, p in model.named_parameters():
                if p.grad is not None and ".experts." not in name:  # experts live on one rank
                    dist.all_reduce(p.grad)
                    p.grad.div_(2)
            with moerr.scope("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
            rec.outcome(loss=loss.item())
    print(f"rank {rank} step 0: loss {loss.item():.6f}", flush=True)
except ValueError as e:
    print(f"rank {rank} refused: {e}", flush=True)
assert ep.all_to_all_single_autograd.__module__ == "torch.distributed._functional_collectives"
dist.destroy_process_group()
"""


def record(run, local=True, explode=None):
    return run_ranks(OWN_EP.replace("LOCAL_SHARDS", repr(local)).replace("EXPLODE_EXPERT", repr(explode)), run)


@pytest.fixture(scope="module")
def own_ep_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("transformers_own_ep") / "run"
    out = record(run)
    assert all(f"rank {r} step 0: loss" in o for r, o in enumerate(out)), out
    return run


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_replays_alone_bitwise(own_ep_run, rank):
    rc, out = moerr_cli("replay", own_ep_run, "--rank", rank)
    assert rc == 0, out
    # 2 layers x (counts, rows, rows back) forward, 2 x 2 backward; 31 dense gradients.
    assert "outputs compared, 0 differ" in out and "c10d::all_reduce x31, c10d::all_to_all x10" in out, out


def test_the_ranks_agree_on_every_transfer(own_ep_run):
    rc, out = moerr_cli("replay", own_ep_run)
    assert rc == 0, out
    assert "cross-rank check of 82 collective records: every rank received what was sent" in out, out


def test_replay_on_one_rank_agrees_within_the_tolerance(own_ep_run):
    # record(model=, hf_config=): moerr's own Qwen2-MoE rebuilt from the
    # config, every rank's batch on one process, the routing served.
    rc, out = moerr_cli("replay", own_ep_run, "--ranks", 1, "--json")
    assert rc == 0, out
    report = json.loads(out[out.index("{"):])
    assert report["ok"] and report["original_ranks"] == 2 and report["ranks"] == 1, out
    assert report["compared"], out
    assert all(r["relative"] is not None and r["relative"] <= report["tolerance"] for r in report["compared"]), out
    assert report["routing"] == {"served_slots": 128, "router_agrees": 128, "decisions_routed_live": 0}, out


def test_bisect_names_rank_1_and_its_expert(tmp_path):
    run = tmp_path / "run"
    record(run, explode=(1, 3))  # expert 3 of layer 1: rank 1's second
    rc, out = moerr_cli("bisect", run, "--json")
    assert rc == 1, out
    found = json.loads(out[out.index("["):])[0]
    assert found["rank"] == 1 and found["carried"]["kind"] == "all_to_all", found
    cause = found["cause"]
    assert cause["found_explosion"] and cause["op"] == "aten::linear", cause
    assert cause["module"] == "model.layers.1.mlp.experts", cause


def test_dtensor_expert_shards_are_refused_by_name(tmp_path):
    out = record(tmp_path / "run", local=False)
    assert all(f"rank {r} refused: capturing" in o and "its bytes are not readable here" in o
               for r, o in enumerate(out)), out
