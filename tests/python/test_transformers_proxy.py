"""`moerr proxy` writes checkpoints that Hugging Face `transformers` loads.

For tiny random-config models of each MoE family moerr claims (built as
test_transformers_forward.py builds them, written by `save_pretrained`, no
download), `moerr proxy --checkpoint DIR --keep 1/2 -o OUT`; then
`transformers.AutoModelForCausalLM.from_pretrained(OUT,
output_loading_info=True)` must load it with no missing, unexpected or
mismatched keys, every tensor of OUT must be the original's (a kept expert
under its new index, the router's rows and DeepSeek-V3's correction bias
sliced in the kept order, everything else bitwise), transformers' logits of
the proxy must be finite and `moerr forward --checkpoint OUT --compare`
must agree with them within test_transformers_forward.py's tolerance
(1e-4 of the logits' scale, top-1 and top-5 ids at every position).

The same for the proxy of a Python loop recorded with
`moerr.record(RUN, model=, hf_config=)`: `moerr proxy RUN --keep 1/2 -o P`
writes P as an HF checkpoint (docs/PROXY.md).

Also run as a script (`python3 tests/python/test_transformers_proxy.py
[--keep DIR]`, with MOERR_BIN set) it prints the measurements.

Run by ctest (transformers_proxy) with PYTHONPATH=BUILD/python,
MOERR_BIN=the moerr binary and OMP_NUM_THREADS=1."""
import json
import os
import re
import subprocess
import sys
import tempfile

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_transformers_forward as fwd  # noqa: E402

MOERR = os.environ.get("MOERR_BIN", "moerr")
# One or two variants a family; DeepSeek-V3 with groups of four (1/2 keeps
# one expert a group: one group of all, top-k at most topk_group) and of two
# (1/2 keeps two a group: top-k at most topk_group x 2).
VARIANTS = ["qwen2_moe/shared-expert", "qwen2_moe/window+sparse-step+yarn",
            "qwen3_moe/base", "qwen3_moe/dense-first+sparse-step+llama3-rope", "mixtral/base",
            "mixtral/llama3-rope+tied-embeddings", "deepseek_v3/mla-q-lora+grouped",
            "deepseek_v3/mla-q-proj+yarn-mscale"]
EXPERT = re.compile(r"^(model\.layers\.(\d+)\.\w+\.experts\.)(\d+)(\..*)$")
ROUTER = re.compile(r"^model\.layers\.(\d+)\.\w+\.gate\.(weight|e_score_correction_bias)$")


def moerr(*args):
    p = subprocess.run([MOERR, *map(str, args)], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def proxy_matches_original(original_dir, proxy_dir):
    """Every proxy tensor named against clusters.json's plans: a list of what differs."""
    plans = {p["layer"]: p["kept"] for p in json.load(open(os.path.join(proxy_dir, "clusters.json")))["layers"]}
    before = load_file(os.path.join(original_dir, "model.safetensors"))
    after = load_file(os.path.join(proxy_dir, "model.safetensors"))
    wrong = []
    for name, t in after.items():
        m, r = EXPERT.match(name), ROUTER.match(name)
        if m and int(m[2]) in plans:
            source = before[f"{m[1]}{plans[int(m[2])][int(m[3])]}{m[4]}"]
        elif r and int(r[1]) in plans:
            source = before[name][plans[int(r[1])]]
        else:
            source = before[name]
        if source.shape != t.shape or not torch.equal(source, t):
            wrong.append(name)
    kept_experts = sum(1 for n in after if EXPERT.match(n))
    return wrong, kept_experts


def load_proxy(proxy_dir):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        proxy_dir, output_loading_info=True, dtype=torch.float32, attn_implementation="eager")
    return model.eval(), info


def compare_with_moerr(model, proxy_dir, ids, root):
    """transformers' logits of the proxy against `moerr forward`'s."""
    with torch.no_grad():
        ref = model(input_ids=ids, use_cache=False).logits.float()
    scale = ref.abs().max().item()
    path = os.path.join(root, os.path.basename(proxy_dir) + "-ref.safetensors")
    save_file({"input_ids": ids, "logits": ref.contiguous()}, path)
    rc, out, err = moerr("forward", "--checkpoint", proxy_dir, "--compare", path, "--json",
                         "--top-k", fwd.TOP_K, "--tolerance", repr(fwd.REL_TOL * scale))
    compare = json.loads(out)["compare"] if out.strip().startswith("{") else None
    return dict(finite=bool(torch.isfinite(ref).all()), scale=scale, tolerance=fwd.REL_TOL * scale, rc=rc,
                compare=compare, diagnostics=err if compare is not None else out + err)


def expert_count(config):
    return config.get("num_local_experts", config.get("num_experts", config.get("n_routed_experts")))


def proxy_variant(name, root):
    cls_name, kwargs, _ = fwd.VARIANTS[name]
    model = fwd.build(cls_name, kwargs)
    fwd.randomize(model, fwd.SEED)
    base = os.path.join(root, name.replace("/", "--"))
    model.save_pretrained(base)
    out = base + "-proxy"
    rc, stdout, stderr = moerr("proxy", "--checkpoint", base, "--keep", "1/2", "-o", out, "--json")
    record = dict(name=name, rc=rc, diagnostics=stdout + stderr, experts=expert_count(kwargs))
    if rc != 0:
        return record
    record["wrong"], record["expert_tensors"] = proxy_matches_original(base, out)
    record["config"] = json.load(open(os.path.join(out, "config.json")))
    record["original_config"] = json.load(open(os.path.join(base, "config.json")))
    proxy, record["info"] = load_proxy(out)
    record.update(compare_with_moerr(proxy, out, torch.tensor(fwd.IDS), root))
    return record


def recorded_run(root):
    """A Python loop's Qwen2-MoE step recorded with model= and hf_config=, proxied."""
    import moerr as moerr_py
    import torch.distributed as dist
    from test_transformers_record import tiny_qwen2_moe, train
    root = os.path.abspath(root)  # the rendezvous is a file:// URL
    model = tiny_qwen2_moe("eager")
    hf_config = json.loads(model.config.to_json_string())
    run = os.path.join(root, "run")
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(root, 'rdzv')}", rank=0, world_size=1)
    try:
        train(run, model, steps=1, model=model, hf_config=hf_config)
    finally:
        dist.destroy_process_group()
    assert moerr_py is not None
    out = os.path.join(root, "run-proxy")
    rc, stdout, stderr = moerr("proxy", run, "--keep", "1/2", "-o", out)
    record = dict(name="python-loop/qwen2_moe", rc=rc, diagnostics=stdout + stderr, experts=4)
    if rc != 0:
        return record
    record["config"] = json.load(open(os.path.join(out, "config.json")))
    proxy, record["info"] = load_proxy(out)
    record.update(compare_with_moerr(proxy, out, torch.tensor(fwd.IDS), root))
    return record


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("proxy"))
    return {name: proxy_variant(name, root) for name in VARIANTS}


@pytest.fixture(scope="module")
def python_loop(tmp_path_factory):
    return recorded_run(str(tmp_path_factory.mktemp("loop")))


def check_loads_and_agrees(record):
    assert record["rc"] == 0, record["diagnostics"]
    info = record["info"]
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        assert not info[kind], (kind, info[kind])
    assert expert_count(record["config"]) == record["experts"] // 2, record["config"]
    assert record["finite"], record
    compare = record["compare"]
    assert compare is not None, f"moerr forward failed (exit {record['rc']}): {record['diagnostics']}"
    positions = len(fwd.IDS) * len(fwd.IDS[0])
    assert compare["max_abs_error"] <= record["tolerance"], (compare, record["scale"])
    assert compare["top1_agree"] == positions and compare["topk_agreement"] == 1.0, compare
    assert record["rc"] == 0 and compare["within_tolerance"], compare


@pytest.mark.parametrize("name", VARIANTS)
def test_transformers_loads_the_proxy_and_moerr_agrees(records, name):
    record = records[name]
    check_loads_and_agrees(record)
    assert record["wrong"] == [], record["wrong"]
    config = record["config"]
    assert set(config) == set(record["original_config"]), set(config) ^ set(record["original_config"])
    top_k = config["num_experts_per_tok"]
    assert top_k <= expert_count(config), config
    if config["model_type"] == "deepseek_v3":
        groups = config["n_group"]
        assert config["n_routed_experts"] % groups == 0 and config["n_routed_experts"] // groups >= 2 or groups == 1
        assert top_k <= config["topk_group"] * config["n_routed_experts"] // groups, config


def test_transformers_loads_the_proxy_of_a_recorded_python_loop(python_loop):
    check_loads_and_agrees(python_loop)


def report(records):
    print(f"transformers {transformers.__version__}, torch {torch.__version__}; proxy --keep 1/2; "
          f"tolerance {fwd.REL_TOL} x max|logit|; {len(fwd.IDS)} x {len(fwd.IDS[0])} tokens, top-{fwd.TOP_K}")
    print(f"{'checkpoint':<58} {'experts':>8} {'top-k':>6} {'load':>5} {'max|logit|':>10} {'max abs err':>11} "
          f"{'rel':>8} {'top-1':>6} {'top-5':>7}")
    for r in records:
        if r["rc"] != 0 or r.get("compare") is None:
            print(f"{r['name']:<58} FAILED: {r['diagnostics'].strip()[-300:]}")
            continue
        c, cfg = r["compare"], r["config"]
        loads = "ok" if not any(r["info"][k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")) else "KEYS"
        positions = len(fwd.IDS) * len(fwd.IDS[0])
        print(f"{r['name']:<58} {r['experts']:>3} -> {expert_count(cfg):<2} {cfg['num_experts_per_tok']:>6} "
              f"{loads:>5} {r['scale']:>10.3f} {c['max_abs_error']:>11.2e} {c['max_abs_error'] / r['scale']:>8.1e} "
              f"{c['top1_agree']:>3}/{positions:<2} {100 * c['topk_agreement']:>6.1f}%")


if __name__ == "__main__":
    keep = sys.argv[sys.argv.index("--keep") + 1] if "--keep" in sys.argv else None
    root = keep or tempfile.mkdtemp()
    os.makedirs(root, exist_ok=True)
    rows = [proxy_variant(name, root) for name in VARIANTS]
    loop_root = os.path.join(root, "loop")
    os.makedirs(loop_root, exist_ok=True)
    rows.append(recorded_run(loop_root))
    report(rows)
