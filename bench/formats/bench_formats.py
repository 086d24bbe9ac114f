#!/usr/bin/env python3
"""Bundle I/O against torch.save, one .npy per tensor and raw fwrite, on the
same 1 GiB of realistic tensors, in one run. Prints a markdown table.

  bench_formats.py BUNDLE_IO_BENCH WORKDIR [--mib N]
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import time

import numpy as np
import torch


def workload(total_mib):
    """Weights (bf16, fp32) ~ N(0, 0.02), Adam moments, int32 routing ids."""
    g = torch.Generator().manual_seed(0)
    scale = total_mib / 1024
    tensors = {}
    for i in range(int(112 * scale)):
        tensors[f"bf16_weight.{i}"] = (torch.randn(1024, 2048, generator=g) * 0.02).to(torch.bfloat16)
    for i in range(int(32 * scale)):
        tensors[f"fp32_weight.{i}"] = torch.randn(1024, 2048, generator=g) * 0.02
    for i in range(int(16 * scale)):
        grad = torch.randn(1024, 2048, generator=g) * 1e-3
        tensors[f"exp_avg.{i}"] = grad * 0.1
        tensors[f"exp_avg_sq.{i}"] = grad * grad * 1e-3
    for i in range(int(32 * scale)):
        tensors[f"topk_ids.{i}"] = torch.randint(0, 128, (65536, 8), generator=g, dtype=torch.int32)
    return tensors


def raw_bytes(t):
    return t.contiguous().view(torch.uint8).numpy().tobytes() if t.dtype != torch.bfloat16 else \
        t.contiguous().view(torch.int16).numpy().tobytes()


ST_DTYPES = {torch.bfloat16: "BF16", torch.float32: "F32", torch.int32: "I32"}


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, t in tensors.items():
        b = raw_bytes(t)
        header[name] = {"dtype": ST_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def best_of(n, fn):
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bench_bin")
    ap.add_argument("workdir")
    ap.add_argument("--mib", type=int, default=1024)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    tensors = workload(args.mib)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    read_name = "bf16_weight.3"  # 4 MiB
    src = os.path.join(args.workdir, "input.safetensors")
    write_safetensors(src, tensors)

    pt = os.path.join(args.workdir, "all.pt")
    t_save = best_of(3, lambda: torch.save(tensors, pt))
    pt_size = os.path.getsize(pt)

    npy_dir = os.path.join(args.workdir, "npy")

    def save_npy():
        shutil.rmtree(npy_dir, ignore_errors=True)
        os.makedirs(npy_dir)
        for name, t in tensors.items():
            a = t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy()
            np.save(os.path.join(npy_dir, name + ".npy"), a)

    t_npy = best_of(3, save_npy)
    npy_size = sum(os.path.getsize(os.path.join(npy_dir, f)) for f in os.listdir(npy_dir))

    runs = [json.loads(subprocess.check_output([args.bench_bin, src, args.workdir, read_name])) for _ in range(3)]
    cpp = {k: min(r[k] for r in runs) if k.endswith("_s") else runs[0][k] for k in runs[0]}

    t_load = best_of(3, lambda: torch.load(pt)[read_name])
    t_npy_load = best_of(5, lambda: np.load(os.path.join(npy_dir, read_name + ".npy")))

    mb = total / 1e6
    print(f"\nWorkload: {len(tensors)} tensors, {total / 2**20:.0f} MiB "
          f"(bf16 and fp32 weights N(0, 0.02), fp32 Adam moments, int32 routing ids); page cache warm.\n")
    print("| format | write MB/s | x torch.save | size / raw | checksummed | crash-safe | one-tensor read |")
    print("|---|---|---|---|---|---|---|")
    print(f"| raw fwrite | {mb / cpp['fwrite_s']:.0f} | {t_save / cpp['fwrite_s']:.2f} | 1.000 | no | no | - |")
    print(f"| torch.save (.pt) | {mb / t_save:.0f} | 1.00 | {pt_size / total:.3f} | no | no | "
          f"torch.load: {t_load * 1e3:.0f} ms |")
    print(f"| .npy per tensor | {mb / t_npy:.0f} | {t_save / t_npy:.2f} | {npy_size / total:.3f} | no | no | "
          f"np.load: {t_npy_load * 1e3:.1f} ms |")
    print(f"| moerr bundle | {mb / cpp['bundle_write_s']:.0f} | {t_save / cpp['bundle_write_s']:.2f} | "
          f"{cpp['bundle_bytes'] / total:.3f} | yes | yes (.partial + rename) | {cpp['read_one_s'] * 1e3:.1f} ms |")
    print(f"| moerr bundle + fsync | {mb / cpp['bundle_write_sync_s']:.0f} | "
          f"{t_save / cpp['bundle_write_sync_s']:.2f} | same | yes | yes, durable | same |")
    print()
    print(f"- Reading `{read_name}` (4 MiB bf16) from the {cpp['bundle_bytes'] / 2**30:.2f} GiB bundle "
          f"(open + index + validation + decode): {cpp['read_one_s'] * 1e3:.2f} ms, "
          f"{t_load / cpp['read_one_s']:.0f}x faster than torch.load of the .pt; "
          f"{cpp['read_one_s'] / cpp['decode_one_s']:.2f}x the time to decode that tensor alone "
          f"({cpp['decode_one_s'] * 1e3:.2f} ms).")
    print(f"- bf16 tensors alone: {cpp['bf16_stored_bytes'] / cpp['bf16_raw_bytes']:.3f}x raw "
          f"({cpp['bf16_raw_bytes'] / 2**20:.0f} MiB); torch.save and .npy store 1.000x.")
    shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
