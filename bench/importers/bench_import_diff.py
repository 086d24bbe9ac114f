"""`moerr diff` of two imported msprobe tensor dumps against numpy doing the
same per-tensor comparison (cosine, max abs error) on the dumps' own .pt
files, in one script.

    bench_import_diff.py BUILD_DIR WORK_DIR [--mib 256] [--tensor-mib 16]

Writes two dumps in msprobe's tensor-task layout (step0/rank0/dump.json and
dump_tensor_data/*.pt written by torch.save), --mib MiB of op outputs each
(fp32 tensors of --tensor-mib MiB; each op's input is the previous op's
output, as in a real dump, so the files hold about twice that), B = A with a
1e-3 relative perturbation everywhere so every output is compared on its
bytes. Then: `moerr import msprobe` of each (timed apart), `moerr diff
--json` of the two bundles, and numpy loading each output .pt with
torch.load and computing cosine and max |a - b|. GB/s counts the output
bytes of both sides. numpy on one core (OMP_NUM_THREADS=1); moerr diff on
one core (--threads 1) and on all. The floor of a moerr diff is its process
start (`moerr --version`: the loader maps LibTorch and its CUDA libraries,
which every moerr command pays, and numpy's in-process loop does not); the
throughput past it is the diff's own (decode, unshuffle, compare)."""
import json
import os
import shutil
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


def arg(name, default):
    return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


def stats(t):
    return {"type": "torch.Tensor", "dtype": str(t.dtype), "shape": list(t.shape), "Max": t.max().item(),
            "Min": t.min().item(), "Mean": t.mean().item(), "Norm": t.norm().item(), "requires_grad": False}


def write_dump(root, tensors):
    """msprobe's tensor task layout for a chain of linear calls."""
    rank = os.path.join(root, "step0", "rank0")
    data_dir = os.path.join(rank, "dump_tensor_data")
    os.makedirs(data_dir)
    data, previous = {}, None
    for i, t in enumerate(tensors):
        name = f"Functional.linear.{i}.forward"
        entry = {"input_args": [], "input_kwargs": {}, "output": []}
        if previous is not None:
            entry["input_args"].append(dict(stats(previous), data_name=f"{name}.input.0.pt"))
            torch.save(previous, os.path.join(data_dir, f"{name}.input.0.pt"))
        entry["output"].append(dict(stats(t), data_name=f"{name}.output.0.pt"))
        torch.save(t, os.path.join(data_dir, f"{name}.output.0.pt"))
        data[name] = entry
        previous = t
    with open(os.path.join(rank, "dump.json"), "w") as f:
        json.dump({"task": "tensor", "level": "L1", "framework": "pytorch", "dump_data_dir": data_dir, "data": data},
                  f, indent=1)
    return sum(os.path.getsize(os.path.join(data_dir, p)) for p in os.listdir(data_dir))


def numpy_compare(dir_a, dir_b, count):
    """Per output tensor: load both .pt files, cosine and max |a - b|."""
    out = []
    for i in range(count):
        name = f"Functional.linear.{i}.forward.output.0.pt"
        a = torch.load(os.path.join(dir_a, name)).numpy()
        b = torch.load(os.path.join(dir_b, name)).numpy()
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        cos = float(np.dot(a64, b64) / np.sqrt(np.dot(a64, a64) * np.dot(b64, b64)))
        out.append((cos, float(np.abs(a - b).max())))
    return out


def best_of(cmd, rounds=3):
    """The best wall time of `cmd` (exit 0, or 1: a diff that found divergences) and its last result."""
    best, res = 1e30, None
    for _ in range(rounds):
        t0 = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True)
        best = min(best, time.perf_counter() - t0)
        if res.returncode not in (0, 1):
            sys.exit(f"{' '.join(cmd)} exited {res.returncode}: {res.stderr[-2000:]}")
    return best, res


def main():
    build, work = sys.argv[1], sys.argv[2]
    mib, tensor_mib = arg("--mib", 256), arg("--tensor-mib", 16)
    moerr = os.path.join(build, "tools", "moerr")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    count = max(1, mib // tensor_mib)
    n = tensor_mib * (1 << 20) // 4
    gen = torch.Generator().manual_seed(0)
    a = [torch.randn(n, generator=gen) for _ in range(count)]
    b = [t * (1 + 1e-3 * torch.randn(n, generator=gen)) for t in a]
    size_a = write_dump(os.path.join(work, "a"), a)
    size_b = write_dump(os.path.join(work, "b"), b)
    del a, b
    out_bytes = 2 * count * n * 4

    t0 = time.perf_counter()
    for side in ("a", "b"):
        subprocess.run([moerr, "import", "msprobe", os.path.join(work, side), "-o", os.path.join(work, f"run-{side}")],
                       check=True, capture_output=True)
    import_s = time.perf_counter() - t0

    bundles = [os.path.join(work, f"run-{side}", "rank0.moerr") for side in "ab"]
    best_moerr, res = best_of([moerr, "diff", "--json", *bundles])
    best_moerr1, _ = best_of([moerr, "diff", "--json", "--threads", "1", *bundles])
    report = json.loads(res.stdout)
    start_s, _ = best_of([moerr, "--version"])
    best_numpy = 1e30
    for _ in range(3):
        t0 = time.perf_counter()
        numpy_compare(os.path.join(work, "a", "step0", "rank0", "dump_tensor_data"),
                      os.path.join(work, "b", "step0", "rank0", "dump_tensor_data"), count)
        best_numpy = min(best_numpy, time.perf_counter() - t0)

    print(f"two msprobe tensor dumps, {count} fp32 outputs of {tensor_mib} MiB each ({mib} MiB of outputs per side; "
          f"{size_a / 2**20:.0f} and {size_b / 2**20:.0f} MiB of .pt files with the inputs), best of 3; "
          f"GB/s counts the output bytes of both sides\n")
    print("| compare | seconds | GB/s | vs numpy |\n|---|---|---|---|")
    print(f"| numpy: torch.load of each .pt, cosine and max abs (baseline, one core) | {best_numpy:.2f} | "
          f"{out_bytes / best_numpy / 1e9:.2f} | 1.00x |")
    for what, seconds in (("`moerr diff --json --threads 1` of the two imported bundles (one core)", best_moerr1),
                          (f"`moerr diff --json` of the two imported bundles ({os.cpu_count()} cores)", best_moerr),
                          ("floor: `moerr --version` (process start, LibTorch loaded)", start_s)):
        print(f"| {what} | {seconds:.2f} | {out_bytes / seconds / 1e9:.2f} | {best_numpy / seconds:.2f}x |")
    print(f"\nPast the process start, `moerr diff` compares {out_bytes / (best_moerr1 - start_s) / 1e9:.2f} GB/s "
          f"on one core and {out_bytes / (best_moerr - start_s) / 1e9:.2f} GB/s on {os.cpu_count()}.")
    print(f"\n`moerr import msprobe` of both dumps: {import_s:.1f} s. The diff matched {report['matched']} ops, "
          f"compared {report['tensors_compared']} outputs on their bytes ({report['bytes_compared'] / 1e9:.2f} GB), "
          f"{report['diverged_ops']} diverged (the 1e-3 perturbation is past fp32's threshold).")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
