#!/usr/bin/env python3
"""moerr proxy --checkpoint at scale: writes a Qwen3-MoE-layout bf16 checkpoint
(random weights, 128 experts per layer, top-8, HF-style shards and index) of
about --gb GB, proxies it at 1/4 with moerr, and reports peak RSS (the
calibration's and the whole run's, from the command's --json and the kernel's
ru_maxrss), wall time against `cp` of the kept bytes, and read throughput.
Deletes the checkpoint and the proxy after.

usage: bench_checkpoint_proxy.py BUILD_DIR WORK_DIR [--gb 8] [--calib-tokens 128]
"""
import argparse
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
import time

import numpy as np

HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 1024, 16, 4, 64
EXPERTS, TOP_K, MOE_INTER, INTER, VOCAB = 128, 8, 512, 2048, 151936
SHARD_BYTES = 2 * 10**9


def layer_tensors(l):
    p = f"model.layers.{l}."
    out = [(p + "input_layernorm.weight", [HIDDEN]),
           (p + "self_attn.q_proj.weight", [HEADS * HEAD_DIM, HIDDEN]),
           (p + "self_attn.k_proj.weight", [KV_HEADS * HEAD_DIM, HIDDEN]),
           (p + "self_attn.v_proj.weight", [KV_HEADS * HEAD_DIM, HIDDEN]),
           (p + "self_attn.o_proj.weight", [HIDDEN, HEADS * HEAD_DIM]),
           (p + "self_attn.q_norm.weight", [HEAD_DIM]),
           (p + "self_attn.k_norm.weight", [HEAD_DIM]),
           (p + "post_attention_layernorm.weight", [HIDDEN]),
           (p + "mlp.gate.weight", [EXPERTS, HIDDEN])]
    for e in range(EXPERTS):
        q = f"{p}mlp.experts.{e}."
        out += [(q + "gate_proj.weight", [MOE_INTER, HIDDEN]), (q + "up_proj.weight", [MOE_INTER, HIDDEN]),
                (q + "down_proj.weight", [HIDDEN, MOE_INTER])]
    return out


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def plan(gb):
    per_layer = sum(numel(s) for _, s in layer_tensors(0)) * 2
    fixed = 2 * VOCAB * HIDDEN * 2
    layers = max(2, -(-(int(gb * 1e9) - fixed) // per_layer))
    tensors = [("model.embed_tokens.weight", [VOCAB, HIDDEN])]
    for l in range(layers):
        tensors += layer_tensors(l)
    tensors += [("model.norm.weight", [HIDDEN]), ("lm_head.weight", [VOCAB, HIDDEN])]
    return layers, tensors


def write_checkpoint(out, gb):
    """bf16 N(0, 0.02) weights (norms 1) from a 64 Mi-value pool at a random offset per tensor."""
    layers, tensors = plan(gb)
    rng = np.random.default_rng(0)
    pool = (rng.standard_normal(1 << 26, dtype=np.float32) * 0.02).view(np.uint32)
    pool = (pool >> 16).astype(np.uint16)  # bf16 by truncation
    pool = np.concatenate([pool, pool])
    ones = np.full(max(HIDDEN, HEAD_DIM), 0x3F80, dtype=np.uint16)  # bf16 1.0
    shards, cur, size = [], [], 0
    for name, shape in tensors:
        n = numel(shape) * 2
        if cur and size + n > SHARD_BYTES:
            shards.append(cur)
            cur, size = [], 0
        cur.append((name, shape))
        size += n
    shards.append(cur)
    os.makedirs(out, exist_ok=True)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        header, off = {"__metadata__": {"format": "pt"}}, 0
        for name, shape in shard:
            n = numel(shape) * 2
            header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + n]}
            off += n
            weight_map[name] = fname
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        with open(os.path.join(out, fname), "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text)
            for name, shape in shard:
                count = numel(shape)
                if name.endswith("norm.weight"):
                    f.write(ones[:count].tobytes())
                    continue
                while count > 0:
                    chunk = min(count, 1 << 26)
                    start = int(rng.integers(0, 1 << 26))
                    f.write(pool[start:start + chunk].tobytes())
                    count -= chunk
        total += off
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    config = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "torch_dtype": "bfloat16",
              "vocab_size": VOCAB, "hidden_size": HIDDEN, "num_hidden_layers": layers,
              "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
              "intermediate_size": INTER, "moe_intermediate_size": MOE_INTER, "num_experts": EXPERTS,
              "num_experts_per_tok": TOP_K, "norm_topk_prob": True, "rope_theta": 1000000.0,
              "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "max_position_embeddings": 40960,
              "decoder_sparse_step": 1, "mlp_only_layers": [], "attention_bias": False,
              "hidden_act": "silu", "bos_token_id": 151643, "eos_token_id": 151645}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return layers, total, len(shards)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("work")
    ap.add_argument("--gb", type=float, default=8.0)
    ap.add_argument("--calib-tokens", type=int, default=128)
    args = ap.parse_args()
    moerr = os.path.join(args.build, "tools", "moerr")
    orig, proxy, copy = (os.path.join(args.work, d) for d in ("original", "proxy", "copy"))
    try:
        t = time.time()
        layers, total, shards = write_checkpoint(orig, args.gb)
        subprocess.run(["sync"], check=True)
        print(f"wrote {orig}: {layers} layers x {EXPERTS} experts, {total / 1e9:.2f} GB of bf16 in {shards} shards "
              f"({time.time() - t:.1f} s)", file=sys.stderr)
        cmd = [moerr, "proxy", "--checkpoint", orig, "--keep", "1/4", "-o", proxy,
               "--calib-tokens", str(args.calib_tokens), "--json"]
        t = time.time()
        run = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
        wall = time.time() - t
        maxrss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
        r = json.loads(run.stdout)
        kept_files = [os.path.join(proxy, s) for s in r["shards"]]
        os.makedirs(copy)
        t = time.time()
        subprocess.run(["cp"] + kept_files + [copy], check=True)
        cp = time.time() - t
        subprocess.run(["sync"], check=True)
        cp_sync = time.time() - t
        print("| checkpoint | kept | calibration (s) | calibration peak RSS | write (s) | proxy wall (s) | peak RSS "
              "(VmHWM / ru_maxrss) | read | read throughput | cp of the kept bytes (s; + sync) | write vs cp+sync |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        print(f"| {total / 1e9:.2f} GB, {layers} layers x {EXPERTS} experts, {shards} shards "
              f"| {r['kept']}/{r['experts']}, {r['bytes_written'] / 1e9:.2f} GB in {len(r['shards'])} shards "
              f"| {r['calibration']['seconds']:.1f} ({r['calibration']['tokens']} tokens) "
              f"| {r['calibration']['peak_rss_bytes'] / 1e9:.2f} GB "
              f"| {r['write_seconds']:.1f} | {wall:.1f} "
              f"| {r['peak_rss_bytes'] / 1e9:.2f} / {maxrss / 1e9:.2f} GB "
              f"| {r['bytes_read'] / 1e9:.2f} GB | {r['bytes_read'] / 1e9 / wall:.2f} GB/s "
              f"| {cp:.1f}; {cp_sync:.1f} | {r['write_seconds'] / cp_sync:.2f}x |")
    finally:
        shutil.rmtree(args.work, ignore_errors=True)


if __name__ == "__main__":
    main()
