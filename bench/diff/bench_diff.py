"""Diff throughput: moerr's kernel against a per-tensor numpy comparison of
the same metrics on the same data, in one script, one core each; then
`moerr diff` end to end on two full recordings of a tiny step.

    bench_diff.py BUILD_DIR WORK_DIR [--mib 512]

GB/s counts the bytes of both sides read (A and B)."""
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np  # noqa: E402


def numpy_compare(a, b):
    """The metrics moerr computes, per tensor, with numpy."""
    finite = np.isfinite(a) & np.isfinite(b)
    d = np.abs(a - b)
    ax = np.abs(a)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(d == 0, 0, d / ax)
    dd = d.astype(np.float64)
    return {
        "max_abs": float(d.max()),
        "max_rel": float(rel.max()),
        "mean_abs": float(dd.mean()),
        "rmse": float(np.sqrt((dd * dd).mean())),
        "rel_l2": float(np.sqrt((dd * dd).sum() / (a.astype(np.float64) ** 2).sum())),
        "cosine": float(np.dot(a, b) / np.sqrt(np.dot(a, a) * np.dot(b, b))),
        "within_0p1": float((d <= 1e-3 * ax).mean()),
        "within_0p5": float((d <= 5e-3 * ax).mean()),
        "nan_mismatch": int((np.isnan(a) != np.isnan(b)).sum()),
        "finite": int(finite.sum()),
    }


def main():
    build, work = sys.argv[1], sys.argv[2]
    mib = int(sys.argv[sys.argv.index("--mib") + 1]) if "--mib" in sys.argv else 512
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(0)
    n = mib * (1 << 20) // 4
    a = rng.standard_normal(n, dtype=np.float32)
    b = (a * (1 + 1e-3 * rng.standard_normal(n, dtype=np.float32))).astype(np.float32)
    pa, pb = os.path.join(work, "a.f32"), os.path.join(work, "b.f32")
    a.tofile(pa)
    b.tofile(pb)

    per = (4 << 20) // 4
    best = 1e30
    for _ in range(3):
        t0 = time.perf_counter()
        for s in range(0, n, per):
            numpy_compare(a[s:s + per], b[s:s + per])
        best = min(best, time.perf_counter() - t0)
    numpy_gbps = 2 * n * 4 / best / 1e9
    out = subprocess.run([os.path.join(build, "bench", "diff_bench"), pa, pb], check=True, capture_output=True, text=True)
    moerr = json.loads(out.stdout)
    moerr_gbps = moerr["bytes"] / moerr["seconds"] / 1e9
    print(f"{mib} MiB per side in 4 MiB fp32 tensors, one core (OMP_NUM_THREADS=1), best of 3; GB/s counts both sides\n")
    print("| compare | GB/s | vs numpy |\n|---|---|---|")
    print(f"| numpy, per tensor (baseline) | {numpy_gbps:.2f} | 1.00x |")
    print(f"| moerr CompareTensors | {moerr_gbps:.2f} | {moerr_gbps / numpy_gbps:.1f}x |")
    os.remove(pa)
    os.remove(pb)

    # End to end: two full recordings (fp32, bf16) of a tiny step, read,
    # decompressed, aligned and compared by `moerr diff`.
    moerr_exe = os.path.join(build, "tools", "moerr")
    bundles = []
    for precision in ("fp32", "bf16"):
        bundle = os.path.join(work, f"{precision}.moerr")
        subprocess.run([moerr_exe, "train", "--preset", "tiny", "--steps", "1", "--warmup-steps", "0",
                        "--precision", precision, "--record", "full", "--trigger", "always", "--force",
                        "-o", os.path.join(work, f"run-{precision}"), "--bundle", bundle],
                       check=True, capture_output=True)
        bundles.append(bundle)
    t0 = time.perf_counter()
    out = subprocess.run([moerr_exe, "diff", "--json", *bundles], capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    report = json.loads(out.stdout)
    print(f"\n`moerr diff --json` of two full tiny recordings (fp32 vs bf16): {report['matched']} ops matched, "
          f"{report['tensors_compared']} outputs compared on {report['bytes_compared'] / 1e6:.1f} MB of bytes, "
          f"{report['diverged_ops']} diverged, in {seconds:.2f} s (process start and bundle decode included)")


if __name__ == "__main__":
    main()
