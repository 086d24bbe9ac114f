"""A plain-PyTorch torch.distributed loop over an HF-layout MoE model
(examples.py's MixtralForCausalLM, experts spread over 4 ranks), recorded
with moerr.record(model=, hf_config=), and `moerr replay RUN --ranks M`
rebuilding moerr's model from it: on 2 ranks (c10d Gloo) and on 1, every
layer output, loss and gradient within the tolerance docs/DISTRIBUTED.md
states. A model outside moerr's families is refused when recording, and a
run recorded without model= is refused by replay --ranks, naming what to pass.

Run by ctest with PYTHONPATH=BUILD/python and MOERR_BIN=the moerr binary."""
import json

import pytest

from test_distributed_record import moerr_cli, run_ranks

WORLD = 4


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("hf") / "run"
    out = run_ranks("from moerr.examples import hf_expert_parallel_main\n"
                    "hf_expert_parallel_main(RUN, init_method=INIT)\n", run, world=WORLD)
    assert all("step 0: loss" in o for o in out), out
    return run


def header_of(path):
    """A safetensors file's header (its JSON object)."""
    blob = open(path, "rb").read()
    return json.loads(blob[8:8 + int.from_bytes(blob[:8], "little")]), blob


def edit_capture(path, edit):
    """Rewrites the capture `path` with edit(tensors) applied."""
    import torch
    from moerr import _hf
    header, blob = header_of(path)
    meta = header.pop("__metadata__")
    start = 8 + int.from_bytes(blob[:8], "little")
    tensors = {}
    for name, e in header.items():
        lo, hi = e["data_offsets"]
        dtype = {"F32": torch.float32, "I64": torch.int64}[e["dtype"]]
        tensors[name] = torch.frombuffer(bytearray(blob[start + lo:start + hi]), dtype=dtype).reshape(e["shape"])
    edit(tensors)
    _hf.write_safetensors(str(path), tensors, meta)


def test_each_rank_writes_its_part_of_the_model(hf_run):
    import moerr
    for r in range(WORLD):
        b = moerr.Bundle(hf_run / f"rank{r}.moerr")
        a = b.annotation("hf_model")
        assert a["step"] == 0 and a["objective"] == "causal-lm-cross-entropy" and a["config"]["model_type"] == "mixtral"
        # The rank's experts under their global index: 8 experts over 4 ranks, 2 each.
        header, _ = header_of(hf_run / a["file"])
        experts = sorted({int(n.split(".experts.")[1].split(".")[0]) for n in header if n.startswith("param/")
                          and ".experts." in n})
        assert experts == [2 * r, 2 * r + 1], experts
        assert "batch/input_ids" in header and "out/model.layers.1" in header and "out/loss" in header
        assert "grad/model.layers.0.block_sparse_moe.gate.weight" in header


@pytest.mark.parametrize("ranks", [2, 1])
def test_replay_on_fewer_ranks_agrees_with_the_record(hf_run, ranks):
    rc, out = moerr_cli("replay", hf_run, "--ranks", ranks, "--json")
    assert rc == 0, out
    report = json.loads(out[out.index("{"):])
    assert report["ok"] and report["original_ranks"] == WORLD and report["ranks"] == ranks, out
    kinds = {}
    for row in report["compared"]:
        kinds.setdefault(row["kind"], []).append(row)
        assert row["relative"] <= report["tolerance"], row
    # Every rank's two layer outputs and logits, its loss, its dense
    # gradients; every expert's gradient (3 matrices x 8 experts x 2 layers,
    # less any expert no token reached).
    assert len(kinds["output"]) == WORLD * 3 and len(kinds["loss"]) == WORLD, kinds.keys()
    assert len(kinds["dense gradient"]) == WORLD * 17, len(kinds["dense gradient"])
    assert 30 <= len(kinds["expert gradient"]) <= 48, len(kinds["expert gradient"])
    # Not vacuous: the gradients compared are not zero.
    assert all(r["scale"] > 0 for r in kinds["expert gradient"])
    # The routers were served every recorded decision: 4 ranks x 16 tokens x top-2, 2 layers.
    assert report["routing"] == {"served_slots": 256, "router_agrees": 256, "decisions_routed_live": 0}, out
    assert report["diverged_parameters"] == [] and report["loop_precision"] == "fp32", out


def test_replay_text_names_the_largest_deviation(hf_run):
    rc, out = moerr_cli("replay", hf_run, "--ranks", 1)
    assert rc == 0, out
    assert "the Python loop's mixtral model rebuilt from its hf_config, 4 ranks replayed on 1" in out, out
    assert "expert gradient" in out and "agrees with the record within the tolerance" in out, out
    assert "routing: the recorded decisions served, 256 slots; the replay's router chose 256 of them alike" in out, out


def test_a_damaged_capture_is_reported(hf_run, tmp_path):
    # Rank 2's recorded loss changed: the replay says it differs, rank 2's
    # loss; made NaN, it differs too (a NaN agrees with a NaN only).
    import shutil
    for damage, shown in ((lambda t: t["out/loss"].add_(0.01), "loss"),
                          (lambda t: t["out/loss"].fill_(float("nan")), "inf")):
        run = tmp_path / shown
        shutil.copytree(hf_run, run)
        edit_capture(run / "hf" / "rank2.safetensors", damage)
        rc, out = moerr_cli("replay", run, "--ranks", 2)
        assert rc == 1, out
        assert "DIFFERS: 1 tensors past the tolerance" in out and "loss, rank 2" in out, out
    rc, out = moerr_cli("replay", run, "--ranks", 1, "--json")
    rows = [r for r in json.loads(out[out.index("{"):])["compared"] if r["relative"] is None]
    assert rc == 1 and [(r["kind"], r["rank"], r["nonfinite"]) for r in rows] == [("loss", 2, 1)], out


def test_a_nan_step_reproduced_agrees(tmp_path):
    # An inf in one embedding row makes the loss and most gradients NaN;
    # the replay reproduces them at the same elements, which is agreement.
    run = tmp_path / "run"
    out = run_ranks("""
        import torch, torch.distributed as dist, moerr
        from moerr.examples import MixtralForCausalLM, MIXTRAL_TINY, causal_lm_loss
        dist.init_process_group("gloo", init_method=INIT, rank=0, world_size=1)
        model, tokens = MixtralForCausalLM(), torch.arange(1, 17).view(2, 8)
        moerr.instrument(model)
        with torch.no_grad():
            model.model.embed_tokens.weight[5, 3] = float("inf")
        with moerr.record(RUN, model=model, hf_config=MIXTRAL_TINY) as rec:
            with rec.step():
                loss = causal_lm_loss(model(tokens), tokens)
                loss.backward()
        print("loss", loss.item())
        dist.destroy_process_group()
        """, run, world=1)
    assert "loss nan" in out[0], out
    rc, out = moerr_cli("replay", run, "--ranks", 1, "--json")
    report = json.loads(out[out.index("{"):])
    assert rc == 0 and report["ok"], out
    assert sum(r["nonfinite"] > 0 for r in report["compared"]) > 10, out


def test_a_rank_whose_dense_copy_diverged_replays_as_it_ran(tmp_path):
    # Rank 1's final norm is 1.5x rank 0's in the loop itself: its pass runs
    # its own copy (rank 0's would differ from its record), and the report
    # names the copy that diverged.
    run = tmp_path / "run"
    run_ranks("""
        import torch, moerr.examples as ex
        class Diverged(ex.MixtralForCausalLM):
            def __init__(self, *args):
                super().__init__(*args)
                if os.environ["RANK"] == "1":
                    with torch.no_grad():
                        self.model.norm.weight.mul_(1.5)
        ex.MixtralForCausalLM = Diverged
        ex.hf_expert_parallel_main(RUN, init_method=INIT)
        """, run, world=2)
    rc, out = moerr_cli("replay", run, "--ranks", 1)
    assert rc == 0 and "agrees with the record within the tolerance" in out, out
    assert "parameters differing from the lowest rank's copy: 1, first model.norm.weight (rank 1)" in out, out


def test_a_bf16_loop_is_said_to_differ_by_its_precision(tmp_path):
    # moerr's model runs fp32: a loop in bf16 differs past the fp32
    # tolerance, and the report says that the loop's precision is the cause.
    run = tmp_path / "run"
    run_ranks("""
        import torch, torch.distributed as dist, moerr
        from moerr.examples import MixtralForCausalLM, MIXTRAL_TINY, causal_lm_loss
        dist.init_process_group("gloo", init_method=INIT, rank=0, world_size=1)
        model, tokens = MixtralForCausalLM().to(torch.bfloat16), torch.randint(0, 32, (2, 8))
        with moerr.record(RUN, model=model, hf_config=MIXTRAL_TINY) as rec:
            with rec.step():
                causal_lm_loss(model(tokens).float(), tokens).backward()
        dist.destroy_process_group()
        """, run, world=1)
    rc, out = moerr_cli("replay", run, "--ranks", 1, "--json")
    report = json.loads(out[out.index("{"):])
    assert rc == 1 and not report["ok"] and report["loop_precision"] == "bf16 parameters", out


def test_a_loop_without_instrument_is_routed_live_and_says_so(tmp_path):
    # Two ranks, no moerr.instrument: no routing recorded, the replay's
    # routers choose live (2 ranks x 2 layers decisions), and the step still agrees.
    run = tmp_path / "run"
    run_ranks("from moerr.examples import hf_expert_parallel_main\n"
              "hf_expert_parallel_main(RUN, init_method=INIT, instrument=False)\n", run, world=2)
    rc, out = moerr_cli("replay", run, "--ranks", 1)
    assert rc == 0, out
    assert "routing: 4 decisions routed live, none recorded for them (moerr.instrument(model) records them)" in out, out
    assert "agrees with the record within the tolerance" in out, out


def test_a_model_outside_the_families_is_refused_when_recording(tmp_path):
    out = run_ranks("""
        import torch, torch.distributed as dist, moerr
        from moerr.examples import TinyMoe, MIXTRAL_TINY
        dist.init_process_group("gloo", init_method=INIT, rank=0, world_size=1)
        from moerr.examples import MixtralForCausalLM
        for model, config in ((TinyMoe(), MIXTRAL_TINY), (MixtralForCausalLM(), dict(MIXTRAL_TINY, intermediate_size=24)),
                              (MixtralForCausalLM(), dict(MIXTRAL_TINY, torch_dtype=torch.float32))):
            try:
                moerr.record(RUN, model=model, hf_config=config).__enter__()
            except ValueError as e:
                print("refused:", e)
        dist.destroy_process_group()
        """, tmp_path / "run", world=1)
    assert "refused: model: " in out[0] and "are not mixtral names" in out[0], out
    assert "layers.0.mlp.experts.0.gate_proj.weight" in out[0], out
    # Mixtral's names, but experts 16 wide where the config says 24: named with both shapes.
    assert ("refused: model: 48 parameters have shapes the hf_config does not give them: "
            "model.layers.0.block_sparse_moe.experts.0.w1.weight [16, 16] (the config: [24, 16])") in out[0], out
    assert "refused: hf_config must be config.json's keys, JSON values only" in out[0], out
    assert not (tmp_path / "run").exists(), "a refused recording writes nothing"


def test_a_batch_outside_the_vocabulary_is_named(hf_run, tmp_path):
    # Rank 3's recorded batch holds token 1000 (the vocabulary is 32): the
    # replay and the proxy name the file and the id before any rank starts.
    import shutil
    run = tmp_path / "run"
    shutil.copytree(hf_run, run)
    path = run / "hf" / "rank3.safetensors"
    edit_capture(path, lambda t: t["batch/input_ids"].__setitem__((0, 3), 1000))
    want = f"{path}: batch/input_ids holds token id 1000, outside the hf_config's vocabulary [0, 32)"
    for args in (("replay", run, "--ranks", 2), ("proxy", run, "--keep", "1/2", "-o", tmp_path / "p")):
        rc, out = moerr_cli(*args)
        assert rc == 2 and want in out, out


def test_ranks_with_batches_of_other_lengths(tmp_path):
    # Rank 0's sequences are 8 long, rank 1's 6: the replay runs each as it
    # was; the proxy's calibration batch is one [B, S], so it asks for --tokens.
    import torch
    from moerr import _hf
    run = tmp_path / "run"
    run_ranks("from moerr.examples import hf_expert_parallel_main\n"
              "hf_expert_parallel_main(RUN, init_method=INIT, batch=(2, 8 if os.environ['RANK'] == '0' else 6))\n",
              run, world=2)
    rc, out = moerr_cli("replay", run, "--ranks", 1)
    assert rc == 0 and "agrees with the record within the tolerance" in out, out
    rc, out = moerr_cli("proxy", run, "--keep", "1/2", "-o", tmp_path / "p")
    assert rc == 2 and f"{run}: rank 0's batch is [2, 8], rank 1's [2, 6]" in out and "--tokens" in out, out
    tokens = tmp_path / "tokens.safetensors"
    _hf.write_safetensors(str(tokens), {"input_ids": torch.arange(32).view(4, 8)}, {})
    rc, out = moerr_cli("proxy", run, "--keep", "1/2", "--tokens", tokens, "-o", tmp_path / "p")
    assert rc == 0 and "calibration: 32 tokens" in out, out


def test_a_rank_whose_config_differs_is_refused(tmp_path):
    # Rank 1 passes another rope_theta to moerr.record: the replay builds one
    # model, so it refuses rather than use rank 0's config for rank 1's step.
    run = tmp_path / "run"
    run_ranks("from moerr.examples import hf_expert_parallel_main, MIXTRAL_TINY\n"
              "config = dict(MIXTRAL_TINY, rope_theta=500.0) if os.environ['RANK'] == '1' else MIXTRAL_TINY\n"
              "hf_expert_parallel_main(RUN, init_method=INIT, config=config)\n", run, world=2)
    rc, out = moerr_cli("replay", run, "--ranks", 1)
    assert rc == 2 and f"{run}, rank 1: its hf_config is not rank 0's" in out, out


def test_a_step_not_captured_says_why(tmp_path):
    # The model's forward ran twice in the captured step: moerr.record warns,
    # writes no capture, and replay --ranks gives that reason, not "pass model=".
    run = tmp_path / "run"
    out = run_ranks("""
        import torch, torch.distributed as dist, moerr
        from moerr.examples import MixtralForCausalLM, MIXTRAL_TINY, causal_lm_loss
        dist.init_process_group("gloo", init_method=INIT, rank=0, world_size=1)
        model, tokens = MixtralForCausalLM(), torch.randint(0, 32, (2, 8))
        with moerr.record(RUN, model=model, hf_config=MIXTRAL_TINY) as rec:
            with rec.step():
                (causal_lm_loss(model(tokens), tokens) + causal_lm_loss(model(tokens), tokens)).backward()
        dist.destroy_process_group()
        """, run, world=1)
    assert "not written: the model's forward ran 2 times in step 0" in out[0], out
    rc, out = moerr_cli("replay", run, "--ranks", 1)
    assert rc == 2 and (f"{run}, rank 0: moerr.record(model=) wrote no capture, so replay on other ranks cannot "
                        "rebuild the model: the model's forward ran 2 times in step 0") in out, out


def test_proxy_of_the_run_is_an_hf_checkpoint_moerr_runs(hf_run, tmp_path):
    # The ranks' parameters assembled, proxied to half the experts with the
    # recorded batches (4 ranks x 2 x 8 tokens) as calibration; `moerr forward` runs it.
    proxy = tmp_path / "proxy"
    rc, out = moerr_cli("proxy", hf_run, "--keep", "1/2", "-o", proxy)
    assert rc == 0, out
    assert "the Python loop's model (4 ranks' parameters) as an HF checkpoint" in out, out
    assert "8 experts per MoE layer -> 4" in out and "calibration: 64 tokens (8 sequences)" in out, out
    assert json.load(open(proxy / "config.json"))["num_local_experts"] == 4
    rc, out = moerr_cli("forward", "--checkpoint", proxy, "--prompt-ids", "1,2,3", "--json")
    assert rc == 0, out
    rc, out = moerr_cli("proxy", hf_run, "--keep", "1/2", "--ranks", 2, "-o", tmp_path / "p2")
    assert rc == 2 and "its proxy is an HF checkpoint" in out and "--ranks" in out, out
