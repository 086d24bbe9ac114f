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
writes nothing. The config.json of a preset's warm-up, given as --hf-config,
makes the preset's warm model bitwise and its table.

Also run as a script (`python3 tests/python/test_transformers_proxy_eval.py
[--keep DIR]`, with MOERR_BIN set) it prints proxy-eval's table and the
measurements.

Run by ctest (transformers_proxy_eval) with PYTHONPATH=BUILD/python,
MOERR_BIN=the moerr binary and OMP_NUM_THREADS=1."""
import hashlib
import json
import os
import subprocess
import sys
import tempfile
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


def evaluate(root):
    """The config written under `root`, proxy-eval run on it into ROOT/out."""
    config = write_config(os.path.join(root, "config"))
    out = os.path.join(root, "out")
    start = time.monotonic()
    rc, stdout, stderr = moerr("proxy-eval", "--hf-config", config, "--warmup-steps", WARMUP_STEPS, "--static-only",
                               "--keep", *KEEPS, "--methods", *METHODS, "-o", out, "--json",
                               os.path.join(out, "r.json"), timeout=300)
    assert rc == 0, stdout + stderr
    report = json.load(open(os.path.join(out, "r.json")))
    return dict(root=root, config=config, out=out, stdout=stdout, report=report, seconds=time.monotonic() - start)


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    return evaluate(str(tmp_path_factory.mktemp("hf-eval")))


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


def moerr_forward_against(model, directory, root):
    """transformers' logits of `directory` on IDS, and `moerr forward --compare`'s comparison with them."""
    ids = torch.tensor(IDS, dtype=torch.int64)
    ref = fwd.logits_of(model, ids)
    scale = ref.abs().max().item()
    path = os.path.join(root, os.path.basename(directory) + "-ref.safetensors")
    save_file({"input_ids": ids, "logits": ref.contiguous()}, path)
    rc, compare, diagnostics = fwd.run_moerr(directory, path, fwd.REL_TOL * scale)
    return dict(finite=bool(torch.isfinite(ref).all()), scale=scale, rc=rc, compare=compare, diagnostics=diagnostics)


def measure(evaluated):
    """Per kept proxy and the warm original: what transformers loaded, and moerr forward against it."""
    records = []
    for name, directory, experts in checkpoints(evaluated):
        model, info = tproxy.load_proxy(directory)
        record = dict(name=name, experts=experts, info=info, config=model.config,
                      file_experts=tproxy.expert_count(json.load(open(os.path.join(directory, "config.json")))),
                      router_rows=[layer.mlp.gate.weight.shape[0] for layer in model.model.layers])
        if name != "original":
            record["wrong"], record["expert_tensors"] = tproxy.proxy_matches_original(
                evaluated["report"]["warm_checkpoint"], directory)
        record.update(moerr_forward_against(model, directory, evaluated["root"]))
        records.append(record)
    return records


def test_transformers_loads_every_kept_proxy_and_the_original(evaluated):
    records = measure(evaluated)
    assert [r["name"] for r in records][-1] == "original" and len(records) == len(KEEPS) * len(METHODS) + 1
    positions = len(IDS) * len(IDS[0])
    for r in records:
        name, experts = r["name"], r["experts"]
        for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
            assert not r["info"][kind], (name, kind, r["info"][kind])
        assert r["config"].num_experts == experts and r["config"].num_experts_per_tok == TOP_K, (name, r["config"])
        assert r["file_experts"] == experts, name
        # The experts transformers built, not only the config's count.
        assert r["router_rows"] == [experts] * TINY["num_hidden_layers"], (name, r["router_rows"])
        if name != "original":
            assert r["wrong"] == [], (name, r["wrong"])
            assert r["expert_tensors"] == 3 * experts * TINY["num_hidden_layers"], (name, r["expert_tensors"])
        compare = r["compare"]
        assert compare is not None, f"{name}: moerr forward failed (exit {r['rc']}): {r['diagnostics']}"
        assert r["finite"] and compare["positions"] == positions, (name, compare)
        assert compare["max_abs_error"] <= fwd.REL_TOL * r["scale"], (name, compare, r["scale"])
        assert compare["top1_agree"] == positions and compare["topk_agreement"] == 1.0, (name, compare)
        assert r["rc"] == 0 and compare["within_tolerance"], (name, compare)


def test_a_presets_own_config_gives_the_presets_model_and_table(tmp_path):
    """--hf-config of the config.json a preset's warm-up was saved with builds
    the preset's model: the same seeded initialisation and warm-up, so the
    same warm weights, bitwise, and the same static table."""
    runs = {}
    for name, model in (("preset", ["--preset", "tiny"]), ("file", None)):
        out = str(tmp_path / name)
        if model is None:
            model = ["--hf-config", os.path.join(runs["preset"]["warm_checkpoint"], "config.json")]
        rc, stdout, stderr = moerr("proxy-eval", *model, "--warmup-steps", 50, "--static-only", "--keep", "1/2",
                                   "--methods", "cluster", "-o", out, "--json", os.path.join(out, "r.json"))
        assert rc == 0, stdout + stderr
        runs[name] = json.load(open(os.path.join(out, "r.json")))
    preset, file = runs["preset"], runs["file"]
    assert file["family"] == preset["family"] == "qwen3_moe"
    assert os.path.basename(file["warm_checkpoint"]).startswith("hf-")
    weights = [open(os.path.join(r["warm_checkpoint"], "model.safetensors"), "rb").read() for r in (preset, file)]
    assert weights[0] == weights[1]
    assert file["original_accuracy"] == preset["original_accuracy"]
    fields = ("kept", "hidden_cosine", "logit_kl", "routing_agreement", "accuracy", "params_ratio")
    assert [{k: r[k] for k in fields} for r in file["rows"]] == [{k: r[k] for k in fields} for r in preset["rows"]]


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


def report(evaluated, records):
    print(f"transformers {transformers.__version__}, torch {torch.__version__}; proxy-eval --hf-config "
          f"--warmup-steps {WARMUP_STEPS} --static-only: {evaluated['seconds']:.1f} s; tolerance {fwd.REL_TOL} x "
          f"max|logit|; {len(IDS)} x {len(IDS[0])} tokens, top-{fwd.TOP_K}")
    print(f"{'checkpoint':<20} {'experts':>7} {'top-k':>5} {'load':>5} {'tensors':>8} {'max|logit|':>10} "
          f"{'max abs err':>11} {'top-1':>6} {'top-5':>7}")
    positions = len(IDS) * len(IDS[0])
    for r in records:
        c = r["compare"]
        if c is None:
            print(f"{r['name']:<20} moerr forward FAILED: {r['diagnostics'].strip()[-300:]}")
            continue
        keys = ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")
        load = "KEYS" if any(r["info"][k] for k in keys) else "ok"
        tensors = "-" if "wrong" not in r else ("same" if not r["wrong"] else f"{len(r['wrong'])} off")
        print(f"{r['name']:<20} {r['experts']:>7} {r['config'].num_experts_per_tok:>5} {load:>5} {tensors:>8} "
              f"{r['scale']:>10.3f} {c['max_abs_error']:>11.2e} {c['top1_agree']:>3}/{positions:<2} "
              f"{100 * c['topk_agreement']:>6.1f}%")


if __name__ == "__main__":
    keep = sys.argv[sys.argv.index("--keep") + 1] if "--keep" in sys.argv else None
    root = os.path.abspath(keep or tempfile.mkdtemp())
    os.makedirs(root, exist_ok=True)
    evaluated = evaluate(root)
    print(evaluated["stdout"].strip())
    print()
    report(evaluated, measure(evaluated))
