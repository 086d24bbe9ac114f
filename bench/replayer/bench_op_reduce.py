"""`moerr reduce` op by op against one replay of the whole step: the demo's
failing step (the tiny preset's expert-overflow, replayable, reduced with
--ops) and a plain-PyTorch step of ~5,000 ops (moerr.examples.TinyMoe, one
expert's down projection scaled by 1e37, fp32), each candidate replayed.
Wall time of each command (process start and LibTorch's load included, the
same for both), median of 3; the reduce's own `seconds` from its --json.

    PYTHONPATH=BUILD/python bench_op_reduce.py BUILD WORK_DIR"""
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

import moerr
from moerr.examples import TinyMoe

ROUNDS = 3


def timed(args):
    """Median wall seconds of `args` over ROUNDS runs, and the last stdout."""
    seconds, out = [], ""
    for _ in range(ROUNDS):
        start = time.perf_counter()
        p = subprocess.run(args, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        seconds.append(time.perf_counter() - start)
        if p.returncode != 0:
            sys.exit(f"{' '.join(args)}: exit {p.returncode}\n{p.stderr}")
        out = p.stdout
    return statistics.median(seconds), out


def record_plain_step(path, layers):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = TinyMoe(vocab=64, d=32, experts=8, layers=layers)
    with torch.no_grad():
        model.layers[0].mlp.experts[1].down_proj.weight.mul_(1e37)
    moerr.instrument(model)
    tokens = torch.randint(0, 64, (8, 17), generator=torch.Generator().manual_seed(1))
    with moerr.record(path, mode="replayable", overwrite=True) as rec:
        with rec.step():
            logits = model(tokens[:, :-1])
            F.cross_entropy(logits.reshape(-1, 64), tokens[:, 1:].reshape(-1)).backward()


def main():
    build, work = sys.argv[1], sys.argv[2]
    moerr_bin = os.path.join(build, "tools", "moerr")
    os.makedirs(work, exist_ok=True)
    demo = os.path.join(work, "demo")
    subprocess.run([moerr_bin, "train", "--preset", "tiny", "--fault", "expert-overflow", "--steps", "1",
                    "--record", "replayable", "-o", demo, "--force"], check=True, capture_output=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    plain = os.path.join(work, "plain.moerr")
    record_plain_step(plain, layers=12)
    print("| step | ops | kept | candidates | reduce, wall (s) | of it, the reduction itself (s) "
          "| one replay of the whole step, wall (s) | reduce / replay |")
    print("|---|---|---|---|---|---|---|---|")
    for label, bundle in (("demo: tiny expert-overflow (--ops)", os.path.join(demo, "run.moerr")),
                          ("plain PyTorch: TinyMoe, 12 layers, fp32", plain)):
        out = os.path.join(work, os.path.basename(bundle) + ".small.moerr")
        reduce_s, text = timed([moerr_bin, "reduce", bundle, "-o", out, "--ops", "--force", "--json"])
        r = json.loads(text)
        replay_s, _ = timed([moerr_bin, "replay", bundle])
        print(f"| {label} | {r['ops_before']:,} | {r['ops_after']} | {r['candidates']} | {reduce_s:.2f} "
              f"| {r['seconds']:.2f} | {replay_s:.2f} | {reduce_s / replay_s:.2f}x |")


if __name__ == "__main__":
    main()
