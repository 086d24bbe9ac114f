"""`moerr forward` against Hugging Face `transformers` itself: for each MoE
family moerr claims, tiny random-config models built here (no download),
written by `save_pretrained` (safetensors), their transformers logits on
fixed token ids saved in the layout `moerr forward --compare` reads
(`input_ids` [B, T], `logits` [B, T, V]), and one `moerr forward --checkpoint
DIR --compare FILE --json` per model.

Tolerance: the max abs error over all logits must be at most
REL_TOL = 1e-4 times the largest |logit| of the transformers run, and the
top-1 and top-5 ids must agree at every position. Every variant is also
checked to matter: the same weights with the variant's feature switched off
(rope scaling, the window, norm_topk_prob, the correction bias, ...) move
transformers' logits by more than 100 times that tolerance, so a moerr that
ignored the feature would fail.

Also run as a script (`python3 tests/python/test_transformers_forward.py
[--keep DIR]`, with MOERR_BIN set) it prints the measured errors as a table
(docs/guide/checkpoints.md shows one), and with --keep leaves the
checkpoints and reference files in DIR.

Run by ctest (transformers_forward) with PYTHONPATH=BUILD/python,
MOERR_BIN=the moerr binary and OMP_NUM_THREADS=1."""
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.torch import save_file  # noqa: E402

MOERR = os.environ.get("MOERR_BIN", "moerr")
REL_TOL = 1e-4      # max abs error / max |logit| of the reference
SENSITIVITY = 100   # a switched-off feature moves the logits by > this x the tolerance
TOP_K = 5
SEED = 1234
# Two sequences of 12 tokens: longer than every window below (4 and 5).
IDS = [[5, 17, 42, 3, 60, 8, 33, 21, 9, 50, 14, 2],
       [61, 0, 29, 47, 11, 38, 6, 55, 19, 27, 44, 63]]

SHAPE = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, rms_norm_eps=1e-6, tie_word_embeddings=False)
QWEN = dict(SHAPE, intermediate_size=48, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2)
# head_dim explicit: transformers' yarn cannot derive Mixtral's (head_dim None).
MIXTRAL = dict(SHAPE, head_dim=8, intermediate_size=16, num_local_experts=4, num_experts_per_tok=2)
MLA = dict(SHAPE, num_key_value_heads=4, intermediate_size=48, moe_intermediate_size=16,
           n_routed_experts=8, num_experts_per_tok=3, kv_lora_rank=8, qk_rope_head_dim=4,
           qk_nope_head_dim=8, v_head_dim=8)


def rope(kind, **params):
    return {"rope_parameters": dict(rope_type=kind, rope_theta=10000.0, **params)}


NO_ROPE_SCALING = rope("default")
LINEAR = rope("linear", factor=4.0)
DYNAMIC = rope("dynamic", factor=3.0)
YARN = rope("yarn", factor=4.0, original_max_position_embeddings=8, beta_fast=32.0, beta_slow=1.0)
YARN_POSITIONS = dict(max_position_embeddings=32)  # factor x original_max_position_embeddings
LLAMA3 = rope("llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=16)


def zero_correction_bias(state):
    return {k: (torch.zeros_like(v) if k.endswith("e_score_correction_bias") else v) for k, v in state.items()}


# name: (config class, config kwargs, ablations). An ablation is (feature,
# config overrides, state-dict edit or None) that turns the feature off
# while the parameters keep their names and shapes.
VARIANTS = {
    "qwen2_moe/shared-expert": ("Qwen2MoeConfig", dict(QWEN, shared_expert_intermediate_size=24), [
        ("norm_topk_prob false (vs true)", dict(norm_topk_prob=True), None)]),
    "qwen2_moe/norm-topk+linear-rope": (
        "Qwen2MoeConfig", dict(QWEN, shared_expert_intermediate_size=24, norm_topk_prob=True, **LINEAR), [
            ("rope linear", NO_ROPE_SCALING, None), ("norm_topk_prob", dict(norm_topk_prob=False), None)]),
    "qwen2_moe/window+sparse-step+yarn": (
        "Qwen2MoeConfig", dict(QWEN, num_hidden_layers=3, shared_expert_intermediate_size=24,
                               use_sliding_window=True, sliding_window=4, max_window_layers=3,
                               decoder_sparse_step=2, **YARN, **YARN_POSITIONS), [
            ("sliding window (layers 0, 2)", dict(use_sliding_window=False), None),
            ("rope yarn", NO_ROPE_SCALING, None)]),
    "qwen2_moe/dense-first+no-qkv-bias+layer-types+dynamic-rope": (
        "Qwen2MoeConfig", dict(QWEN, num_hidden_layers=3, shared_expert_intermediate_size=24, qkv_bias=False,
                               mlp_only_layers=[0], max_position_embeddings=6, use_sliding_window=True,
                               sliding_window=5, layer_types=["full_attention", "sliding_attention", "full_attention"],
                               **DYNAMIC), [
            ("rope dynamic", NO_ROPE_SCALING, None),
            ("sliding window (layer 1, by layer_types)", dict(use_sliding_window=False, layer_types=None), None)]),
    "qwen3_moe/base": ("Qwen3MoeConfig", dict(QWEN, head_dim=8), [
        ("norm_topk_prob false (vs true)", dict(norm_topk_prob=True), None)]),
    "qwen3_moe/norm-topk+window+linear-rope": (
        "Qwen3MoeConfig", dict(QWEN, head_dim=8, norm_topk_prob=True, use_sliding_window=True,
                               sliding_window=5, **LINEAR), [
            ("sliding window", dict(use_sliding_window=False), None), ("rope linear", NO_ROPE_SCALING, None)]),
    "qwen3_moe/dense-first+sparse-step+llama3-rope": (
        "Qwen3MoeConfig", dict(QWEN, head_dim=8, num_hidden_layers=4, mlp_only_layers=[0],
                               decoder_sparse_step=2, **LLAMA3), [
            ("rope llama3", NO_ROPE_SCALING, None)]),
    "mixtral/base": ("MixtralConfig", MIXTRAL, []),
    "mixtral/window+yarn": ("MixtralConfig", dict(MIXTRAL, sliding_window=4, **YARN, **YARN_POSITIONS), [
        ("sliding window", dict(sliding_window=None), None), ("rope yarn", NO_ROPE_SCALING, None)]),
    "mixtral/llama3-rope+tied-embeddings": ("MixtralConfig", dict(MIXTRAL, tie_word_embeddings=True, **LLAMA3), [
        ("rope llama3", NO_ROPE_SCALING, None)]),
    "deepseek_v3/mla-q-lora+grouped": (
        "DeepseekV3Config", dict(MLA, q_lora_rank=16, n_shared_experts=1, first_k_dense_replace=1,
                                 n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True,
                                 rope_interleave=True, **NO_ROPE_SCALING), [
            ("e_score_correction_bias", {}, zero_correction_bias),
            ("routed_scaling_factor 2.5", dict(routed_scaling_factor=1.0), None),
            ("n_group 4 / topk_group 2", dict(n_group=1, topk_group=1), None),
            ("norm_topk_prob", dict(norm_topk_prob=False), None)]),
    "deepseek_v3/mla-q-proj+yarn-mscale": (
        "DeepseekV3Config", dict(MLA, num_hidden_layers=3, q_lora_rank=None, n_shared_experts=2,
                                 first_k_dense_replace=2, n_group=2, topk_group=1, routed_scaling_factor=1.5,
                                 norm_topk_prob=False, rope_interleave=False,
                                 **rope("yarn", factor=4.0, original_max_position_embeddings=8, beta_fast=32.0,
                                        beta_slow=1.0, mscale=0.707, mscale_all_dim=1.0), **YARN_POSITIONS), [
            ("rope yarn with mscale 0.707, mscale_all_dim 1", NO_ROPE_SCALING, None),
            ("norm_topk_prob false (vs true)", dict(norm_topk_prob=True), None)]),
    "deepseek_v3/mla+yarn-mscale-all-dim-alone": (
        "DeepseekV3Config", dict(MLA, q_lora_rank=12, n_shared_experts=1, first_k_dense_replace=0,
                                 n_group=1, topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=True,
                                 max_position_embeddings=32,
                                 **rope("yarn", factor=8.0, original_max_position_embeddings=4,
                                        mscale_all_dim=0.5)), [
            ("rope yarn with mscale_all_dim 0.5 alone", NO_ROPE_SCALING, None)]),
    "deepseek_v3/mla+linear-rope-mscale-all-dim": (
        "DeepseekV3Config", dict(MLA, q_lora_rank=16, n_shared_experts=1, first_k_dense_replace=1,
                                 n_group=2, topk_group=2, routed_scaling_factor=2.0,
                                 **rope("linear", factor=4.0, mscale_all_dim=1.0)), [
            ("rope linear with mscale_all_dim", NO_ROPE_SCALING, None)]),
}
# The base variant of each family is also written in transformers 5's own
# layout (save_original_format=False: fused experts.gate_up_proj [E, 2I, H]
# and experts.down_proj [E, H, I], Mixtral's block under mlp.).
FUSED = ["qwen2_moe/shared-expert", "qwen3_moe/base", "mixtral/base", "deepseek_v3/mla-q-lora+grouped"]


def randomize(model, seed):
    """Weights far from transformers' tiny init, so attention is peaked, the
    routing has clear winners and every norm, bias and correction bias counts:
    matrices N(0, 1/fan_in) (the last dim), norms 1 + N(0, 0.2), biases
    N(0, 0.3), the correction bias N(0, 0.3)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if not t.is_floating_point() or "rotary_emb" in name:
                continue
            noise = torch.randn(t.shape, generator=gen, dtype=torch.float32)
            if t.dim() >= 2:
                t.copy_(noise / t.shape[-1] ** 0.5 * (1.0 if "embed_tokens" not in name else t.shape[-1] ** 0.5))
            elif name.endswith("norm.weight"):
                t.copy_(1 + 0.2 * noise)
            elif name.endswith("e_score_correction_bias") or name.endswith(".bias"):
                t.copy_(0.3 * noise)


def build(cls_name, kwargs):
    config = getattr(transformers, cls_name)(**kwargs)
    config._attn_implementation = "eager"
    torch.manual_seed(SEED)
    return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def logits_of(model, ids):
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits.float()


def prepare(name, root):
    """Writes the checkpoint(s) and the reference of one variant; returns its record."""
    cls_name, kwargs, ablations = VARIANTS[name]
    model = build(cls_name, kwargs)
    randomize(model, SEED)
    ids = torch.tensor(IDS, dtype=torch.int64)
    ref = logits_of(model, ids)
    scale = ref.abs().max().item()
    tolerance = REL_TOL * scale
    base = os.path.join(root, name.replace("/", "--"))
    model.save_pretrained(base + "-ckpt")
    save_file({"input_ids": ids, "logits": ref.contiguous()}, base + "-ref.safetensors")
    dirs = {"per-expert": base + "-ckpt"}
    if name in FUSED:
        model.save_pretrained(base + "-fused", save_original_format=False)
        dirs["fused"] = base + "-fused"
    moved = {}
    for feature, overrides, edit in ablations:
        off = build(cls_name, dict(kwargs, **overrides))
        state = model.state_dict()
        off.load_state_dict(edit(state) if edit else state)
        moved[feature] = (logits_of(off, ids) - ref).abs().max().item()
    return dict(name=name, dirs=dirs, ref=base + "-ref.safetensors", scale=scale, tolerance=tolerance,
                moved=moved)


def run_moerr(checkpoint, ref, tolerance):
    p = subprocess.run([MOERR, "forward", "--checkpoint", checkpoint, "--compare", ref, "--json",
                        "--top-k", str(TOP_K), "--tolerance", repr(tolerance)],
                       capture_output=True, text=True, timeout=120)
    try:
        return p.returncode, json.loads(p.stdout)["compare"], p.stderr
    except (ValueError, KeyError):
        return p.returncode, None, p.stdout + p.stderr


def run_all(root):
    """Every variant prepared in this process, then the moerr calls two at a time."""
    records = [prepare(name, root) for name in VARIANTS]
    jobs = [(r, layout, d) for r in records for layout, d in r["dirs"].items()]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        outs = list(pool.map(lambda j: run_moerr(j[2], j[0]["ref"], j[0]["tolerance"]), jobs))
    results = {}
    for (record, layout, _), out in zip(jobs, outs):
        results[(record["name"], layout)] = (record, out)
    return results


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_all(str(tmp_path_factory.mktemp("hf")))


CASES = [(name, "per-expert") for name in VARIANTS] + [(name, "fused") for name in FUSED]


@pytest.mark.parametrize("name,layout", CASES, ids=[f"{n}[{l}]" for n, l in CASES])
def test_moerr_forward_matches_transformers(results, name, layout):
    record, (rc, compare, diagnostics) = results[(name, layout)]
    assert compare is not None, f"moerr forward failed (exit {rc}): {diagnostics}"
    positions = len(IDS) * len(IDS[0])
    assert compare["positions"] == positions
    assert compare["max_abs_error"] <= record["tolerance"], (compare, record["scale"])
    assert compare["top1_agree"] == positions, compare
    assert compare["topk_agreement"] == 1.0, compare
    assert rc == 0 and compare["within_tolerance"], (rc, compare)


@pytest.mark.parametrize("name", [n for n, v in VARIANTS.items() if v[2]])
def test_each_variant_moves_the_logits_past_the_tolerance(results, name):
    record, _ = results[(name, "per-expert")]
    for feature, moved in record["moved"].items():
        assert moved > SENSITIVITY * record["tolerance"], (feature, moved, record["tolerance"])


# Families transformers has and moerr does not run, each refused by its
# model_type: OLMoE normalises q and k over every head at once (and may clip
# q, k, v); GPT-OSS has attention sinks, biased experts with a clamped SwiGLU
# and a biased router.
UNSUPPORTED = {
    "olmoe": ("OlmoeConfig", dict(SHAPE, intermediate_size=16, num_experts=4, num_experts_per_tok=2)),
    "gpt_oss": ("GptOssConfig", dict(SHAPE, head_dim=8, intermediate_size=16, num_local_experts=4,
                                     num_experts_per_tok=2, sliding_window=4)),
}


@pytest.mark.parametrize("model_type", sorted(UNSUPPORTED))
def test_a_family_moerr_lacks_is_refused_by_name(tmp_path, model_type):
    cls_name, kwargs = UNSUPPORTED[model_type]
    build(cls_name, kwargs).save_pretrained(tmp_path / "ckpt")
    p = subprocess.run([MOERR, "forward", "--checkpoint", str(tmp_path / "ckpt"), "--prompt-ids", "1,2,3"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and f'unknown model_type "{model_type}"' in p.stderr, p.stderr


def main(argv):
    """[--keep DIR]: write the checkpoints and references into DIR and keep them."""
    torch.set_num_threads(1)
    if len(argv) == 2 and argv[0] == "--keep":
        os.makedirs(argv[1], exist_ok=True)
        results = run_all(argv[1])
    else:
        with tempfile.TemporaryDirectory() as root:
            results = run_all(root)
    print(f"transformers {transformers.__version__}, torch {torch.__version__.split('+')[0]}; "
          f"tolerance {REL_TOL:g} x max|logit|; {len(IDS)} x {len(IDS[0])} tokens, top-{TOP_K}")
    print(f"{'variant':58} {'layout':10} {'max|logit|':>10} {'max abs err':>11} {'rel':>8} {'top-1':>7} {'top-5':>6}")
    failed = 0
    for (name, layout), (record, (rc, c, diag)) in results.items():
        if c is None:
            failed += 1
            print(f"{name:58} {layout:10} FAILED (exit {rc}): {diag.strip()[:300]}")
            continue
        ok = rc == 0 and c["top1_agree"] == c["positions"] and c["topk_agreement"] == 1.0
        failed += not ok
        print(f"{name:58} {layout:10} {record['scale']:10.3f} {c['max_abs_error']:11.2e} "
              f"{c['max_abs_error'] / record['scale']:8.1e} {c['top1_agree']:3}/{c['positions']:<3} "
              f"{100 * c['topk_agreement']:5.1f}%{'' if ok else '  PAST'}")
    print("switched off, the same weights move transformers' logits by (max abs):")
    for (name, layout), (record, _) in results.items():
        if layout == "per-expert":
            for feature, moved in record["moved"].items():
                print(f"  {name:58} {feature:46} {moved:9.3f} ({moved / record['tolerance']:.0f}x tolerance)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
