"""`msprobe compare` against `moerr import msprobe` + `moerr diff` on the same
two msprobe tensor dumps of the same step, in one script.

    bench_msprobe_compare.py BUILD_DIR WORK_DIR [--mib 256]

The dumps are real: msprobe's own PrecisionDebugger (task tensor, level L1)
dumps one training step (forward, MSE loss, backward) of a chain of fp32
linear layers on the CPU, 16 MiB per activation, --mib MiB of forward
outputs per side. B is the same step with every weight perturbed by a
relative 1e-4, so every activation and gradient differs on its bytes. Each
dump is written by its own process (the debugger is one per process).

msprobe compare runs on the two step directories (`-tp B/step0 -gp A/step0`,
its "auto" mode for PyTorch dumps) and compares every API's inputs and
outputs; moerr imports each dump into a bundle (identical tensors, such as
an op's input that is the previous op's output, stored once) and diffs the
bundles, every output on its bytes. Wall times, best of N; moerr diff on all
cores (2 here) and on one."""
import glob
import json
import os
import shutil
import subprocess
import sys
import time

TOKENS, HIDDEN = 4096, 1024  # 16 MiB fp32 activations, 4 MiB weights


def arg(name, default):
    return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


def dump_step(dump_path, layers, perturb):
    """Runs in a child process: one step of the chain under PrecisionDebugger."""
    import torch
    from msprobe.pytorch import PrecisionDebugger
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(HIDDEN, HIDDEN) for _ in range(layers)])
    with torch.no_grad():
        for layer in model:
            layer.weight.copy_(torch.randn(HIDDEN, HIDDEN, generator=gen) / HIDDEN ** 0.5)
            layer.bias.zero_()
            if perturb:  # B: the same weights within a relative 1e-4, drawn from its own seed
                layer.weight.mul_(1 + 1e-4 * torch.randn(HIDDEN, HIDDEN, generator=torch.Generator().manual_seed(1)))
    x = torch.randn(TOKENS, HIDDEN, generator=gen)
    config = {"task": "tensor", "dump_path": dump_path, "rank": [], "step": [], "level": "L1",
              "tensor": {"scope": [], "list": [], "data_mode": ["all"]}}
    with open(dump_path + ".json", "w") as f:
        json.dump(config, f)
    debugger = PrecisionDebugger(config_path=dump_path + ".json")
    debugger.start(model)
    loss = torch.nn.functional.mse_loss(model(x), torch.zeros(TOKENS, HIDDEN))
    loss.backward()
    debugger.stop()
    debugger.step()


def timed(cmd, **kwargs):
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    return time.perf_counter() - t0, res


def best_of(n, cmd, ok=(0,)):
    best, res = 1e30, None
    for _ in range(n):
        seconds, res = timed(cmd)
        if res.returncode not in ok:
            sys.exit(f"{' '.join(cmd)} exited {res.returncode}:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
        best = min(best, seconds)
    return best, res


def dir_bytes(root):
    return sum(os.path.getsize(p) for p in glob.glob(os.path.join(root, "**", "*.pt"), recursive=True))


def main():
    if sys.argv[1] == "--dump":
        return dump_step(sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1")
    build, work = sys.argv[1], sys.argv[2]
    layers = max(1, arg("--mib", 256) // 16)
    moerr = os.path.join(build, "tools", "moerr")
    msprobe = os.path.join(os.path.dirname(sys.executable), "msprobe")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for side, perturb in (("a", "0"), ("b", "1")):
        subprocess.run([sys.executable, __file__, "--dump", os.path.join(work, side), str(layers), perturb],
                       check=True, capture_output=True, env=env)
    step = {side: os.path.join(work, side, "step0") for side in "ab"}

    # msprobe compare writes a timestamped CSV per run into its output directory.
    ms_s, _ = best_of(2, [msprobe, "compare", "-tp", step["b"], "-gp", step["a"], "-o", os.path.join(work, "cmp")])
    rows = len(open(sorted(glob.glob(os.path.join(work, "cmp", "*.csv")))[-1]).readlines()) - 1
    import_s = 0.0
    for side in "ab":
        seconds, _ = best_of(1, [moerr, "import", "msprobe", os.path.join(work, side), "-o",
                                 os.path.join(work, f"run-{side}")])
        import_s += seconds
    bundles = [os.path.join(work, f"run-{side}", "rank0.moerr") for side in "ab"]
    diff_s, res = best_of(3, [moerr, "diff", "--json", *bundles], ok=(0, 1))
    diff1_s, _ = best_of(3, [moerr, "diff", "--json", "--threads", "1", *bundles], ok=(0, 1))
    report = json.loads(res.stdout)

    size = dir_bytes(step["a"]) + dir_bytes(step["b"])
    print(f"msprobe {_version()} PrecisionDebugger tensor dumps (level L1) of one training step of {layers} fp32 "
          f"linear layers, {TOKENS}x{HIDDEN} activations, on the CPU: {size / 1e9:.2f} GB of .pt files in both; "
          f"B's weights perturbed by 1e-4. Wall seconds, best of 2 (msprobe) and 3 (moerr diff); "
          f"{os.cpu_count()} cores\n")
    print("| tool | seconds | msprobe compare / this |\n|---|---|---|")
    print(f"| `msprobe compare -tp B/step0 -gp A/step0` ({rows} rows: every API input and output) | {ms_s:.2f} | "
          "1.0x |")
    for what, seconds in ((f"`moerr import msprobe` of both + `moerr diff --json` ({os.cpu_count()} threads)",
                           import_s + diff_s),
                          (f"`moerr diff --json` of the imported bundles ({os.cpu_count()} threads)", diff_s),
                          ("`moerr diff --json --threads 1` of the imported bundles", diff1_s)):
        print(f"| {what} | {seconds:.2f} | {ms_s / seconds:.1f}x |")
    print(f"\n`moerr import msprobe` of both: {import_s:.2f} s. The diff matched {report['matched']} ops, compared "
          f"{report['tensors_compared']} outputs on their bytes ({report['bytes_compared'] / 1e9:.2f} GB), "
          f"{report['diverged_ops']} diverged.")
    shutil.rmtree(work, ignore_errors=True)


def _version():
    from importlib.metadata import version
    return "(mindstudio-probe " + version("mindstudio-probe") + ")"


if __name__ == "__main__":
    main()
