"""`moerr proxy-eval --hf-config` on a transformers architecture, its proxies
loaded back by transformers.

A tiny transformers Qwen3-MoE config (64 experts, top-8, 2 layers, tiny
widths, the addition task's 16-token vocabulary) is written by
`Qwen3MoeConfig.save_pretrained` (no download) and evaluated with
`moerr proxy-eval --hf-config CONFIG --warmup-steps 400 --static-only
--keep 1/2 1/4 --methods cluster random`. Then each static proxy it kept
(OUT/proxies/<kept>of64-<method>) and the warm original
(OUT/warmup/hf-<digest>-400) must load in
`transformers.AutoModelForCausalLM.from_pretrained(DIR,
output_loading_info=True)` with no missing, unexpected or mismatched keys,
hold 32 or 16 of the 64 experts (the original all 64), every proxy tensor
must be the warm original's (a kept expert under its new index, the router's
rows sliced in the kept order, the rest bitwise: test_transformers_proxy.py's
check), and `moerr forward --checkpoint DIR --compare` must agree with
transformers' logits within test_transformers_forward.py's tolerance (1e-4
of the logits' scale, top-1 and top-5 ids at every position). A bad
--hf-config (unreadable, not JSON, a family moerr does not run, a vocabulary
under the task's, given with --preset) exits 2 with a message naming it and
writes nothing.

Run by ctest (transformers_proxy_eval) with PYTHONPATH=BUILD/python,
MOERR_BIN=the moerr binary and OMP_NUM_THREADS=1."""
import hashlib
import json
import os
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.torch import save_file  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_transformers_forward as fwd  # noqa: E402
import test_transformers_proxy as tproxy  # noqa: E402

MOERR = os.environ.get("MOERR_BIN", "moerr")
TASK_VOCAB = 16  # moe::AdditionTask::kVocab
EXPERTS, TOP_K = 64, 8
WARMUP_STEPS = 400  # about 10 s here; the warm original then answers most sums (0.97 of 256)
TINY = dict(vocab_size=TASK_VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, intermediate_size=64, moe_intermediate_size=8,
            num_experts=EXPERTS, num_experts_per_tok=TOP_K, norm_topk_prob=True, tie_word_embeddings=False)
KEEPS = {"1/2": EXPERTS // 2, "1/4": EXPERTS // 4}
METHODS = ["cluster", "random"]
# fwd.IDS folded into the task's vocabulary: 2 x 12 fixed ids.
IDS = [[i % TASK_VOCAB for i in row] for row in fwd.IDS]


def moerr(*args, timeout=120):
    p = subprocess.run([MOERR, *map(str, args)], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def write_config(directory, **overrides):
    config = transformers.Qwen3MoeConfig(**dict(TINY, **overrides))
    config.save_pretrained(directory)
    return os.path.join(directory, "config.json")


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf-eval")
    config = write_config(str(root / "config"))
    out = str(root / "out")
    start = time.monotonic()
    rc, stdout, stderr = moerr("proxy-eval", "--hf-config", config, "--warmup-steps", WARMUP_STEPS, "--static-only",
                               "--keep", *KEEPS, "--methods", *METHODS, "-o", out, "--json",
                               os.path.join(out, "r.json"), timeout=300)
    assert rc == 0, stdout + stderr
    report = json.load(open(os.path.join(out, "r.json")))
    return dict(root=str(root), config=config, out=out, stdout=stdout, report=report,
                seconds=time.monotonic() - start)


def test_the_report_names_the_config_and_the_kept_checkpoints(evaluated):
    report, out = evaluated["report"], evaluated["out"]
    assert report["preset"] == evaluated["config"] and report["family"] == "qwen3_moe", report
    assert report["experts"] == EXPERTS
    digest = hashlib.sha256(open(evaluated["config"], "rb").read()).hexdigest()[:12]
    assert report["warm_checkpoint"] == os.path.join(out, "warmup", f"hf-{digest}-{WARMUP_STEPS}")
    rows = {(r["kept"], r["method"]): r for r in report["rows"]}
    assert set(rows) == {(k, m) for k in KEEPS.values() for m in METHODS}, sorted(rows)
    for (kept, method), row in rows.items():
        assert row["checkpoint"] == os.path.join(out, "proxies", f"{kept}of{EXPERTS}-{method}"), row
        assert os.path.isfile(os.path.join(row["checkpoint"], "model.safetensors")), row["checkpoint"]
    # The warm-up on the addition task took: the original answers most sums.
    assert 0.5 < report["original_accuracy"] <= 1, report["original_accuracy"]
    for row in rows.values():  # a pruned model differs from the original, measurably and finitely
        assert 0 < row["logit_kl"] < float("inf") and 0 <= row["accuracy"] <= 1, row
        assert row["params_ratio"] > 1, row
    kept_lines = [line for line in evaluated["stdout"].splitlines() if "kept as HF checkpoints" in line]
    assert len(kept_lines) == 1 and os.path.join(out, "proxies") in kept_lines[0], evaluated["stdout"]
    assert report["warm_checkpoint"] in kept_lines[0]


def checkpoints(evaluated):
    """(name, directory, experts) of every kept proxy and of the warm original."""
    rows = evaluated["report"]["rows"]
    return [(f"{r['kept']}of{EXPERTS}-{r['method']}", r["checkpoint"], r["kept"]) for r in rows] + [
        ("original", evaluated["report"]["warm_checkpoint"], EXPERTS)]


def agree_with_moerr(model, directory, root):
    """transformers' logits of `directory` against `moerr forward --compare`'s."""
    ids = torch.tensor(IDS, dtype=torch.int64)
    ref = fwd.logits_of(model, ids)
    scale = ref.abs().max().item()
    path = os.path.join(root, os.path.basename(directory) + "-ref.safetensors")
    save_file({"input_ids": ids, "logits": ref.contiguous()}, path)
    rc, compare, diagnostics = fwd.run_moerr(directory, path, fwd.REL_TOL * scale)
    assert compare is not None, f"moerr forward failed (exit {rc}): {diagnostics}"
    assert bool(torch.isfinite(ref).all())
    positions = len(IDS) * len(IDS[0])
    assert compare["positions"] == positions
    assert compare["max_abs_error"] <= fwd.REL_TOL * scale, (compare, scale)
    assert compare["top1_agree"] == positions and compare["topk_agreement"] == 1.0, compare
    assert rc == 0 and compare["within_tolerance"], compare


def test_transformers_loads_every_kept_proxy_and_the_original(evaluated):
    names = []
    for name, directory, experts in checkpoints(evaluated):
        model, info = tproxy.load_proxy(directory)
        for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
            assert not info[kind], (name, kind, info[kind])
        assert model.config.num_experts == experts and model.config.num_experts_per_tok == TOP_K, (name, model.config)
        assert tproxy.expert_count(json.load(open(os.path.join(directory, "config.json")))) == experts, name
        for layer in model.model.layers:  # the experts transformers built, not only the config's count
            assert layer.mlp.gate.weight.shape[0] == experts, (name, layer.mlp.gate.weight.shape)
        if name != "original":
            wrong, expert_tensors = tproxy.proxy_matches_original(evaluated["report"]["warm_checkpoint"], directory)
            assert wrong == [], (name, wrong)
            assert expert_tensors == 3 * experts * TINY["num_hidden_layers"], (name, expert_tensors)
        agree_with_moerr(model, directory, evaluated["root"])
        names.append(name)
    assert len(names) == len(KEEPS) * len(METHODS) + 1


@pytest.mark.parametrize("case,expected", [
    ("missing", "cannot read it"),
    ("not-json", "is not JSON"),
    ("llama", "moerr cannot build this model"),
    ("small-vocab", f"vocab_size 12 is smaller than the addition task needs ({TASK_VOCAB} token ids)"),
    ("with-preset", "--hf-config and --preset are exclusive"),
    ("with-family", "--hf-config and --family are exclusive"),
])
def test_a_bad_hf_config_is_refused_with_its_reason(tmp_path, case, expected):
    good = write_config(str(tmp_path / "good"))
    config, extra = good, []
    if case == "missing":
        config = str(tmp_path / "absent.json")
    elif case == "not-json":
        config = str(tmp_path / "broken.json")
        open(config, "w").write('{"model_type": "qwen3_moe", ')
    elif case == "llama":
        config = str(tmp_path / "llama.json")
        json.dump(dict(json.load(open(good)), model_type="llama"), open(config, "w"))
    elif case == "small-vocab":
        config = write_config(str(tmp_path / "small"), vocab_size=12)
    elif case == "with-preset":
        extra = ["--preset", "tiny"]
    elif case == "with-family":
        extra = ["--family", "qwen3_moe"]
    out = str(tmp_path / "out")
    rc, stdout, stderr = moerr("proxy-eval", "--hf-config", config, *extra, "--static-only", "--warmup-steps", 1,
                               "-o", out)
    assert rc == 2, (rc, stdout, stderr)
    assert expected in stderr, stderr
    if case not in ("with-preset", "with-family"):
        assert config in stderr, stderr
    assert not os.path.exists(out), os.listdir(out)
