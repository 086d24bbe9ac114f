"""The introduced-error diff against the plain one, on the same pair: one
plain-PyTorch MoE step (activation checkpointing, AdamW, clipping) recorded
in full mode in fp32 and under bf16 autocast, diffed three ways:

  - `--fingerprints`: the observed diff on fingerprints, no bytes read;
  - `--estimate`: the observed diff on bytes, introduced error estimated;
  - the default: both sides replayed isolated beside each op's fp64 run.

Times are wall seconds of the command (median of 3, LibTorch start-up
included), and as a ratio of the step's own time (median of 5 unrecorded
steps in this process).

    bench_precision_diff.py BUILD_DIR WORK_DIR"""
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch.utils.checkpoint  # noqa: E402

VOCAB, D, EXPERTS, LAYERS, BATCH, SEQ = 64, 64, 8, 4, 8, 64


def make(moerr_module):
    from moerr.examples import TinyMoe
    torch.manual_seed(0)
    model = TinyMoe(vocab=VOCAB, d=D, experts=EXPERTS, layers=LAYERS)
    moerr_module.instrument(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)


def step(moerr_module, model, opt, tokens, bf16):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = torch.utils.checkpoint.checkpoint(model, tokens[:, :-1], use_reentrant=False)
    loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    with moerr_module.scope("optimizer"):
        opt.step()
    opt.zero_grad()


def timed(cmd, rounds=3):
    times = []
    out = None
    for _ in range(rounds):
        start = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        assert p.returncode in (0, 1), p.stdout + p.stderr
        out = p.stdout
    return statistics.median(times), json.loads(out)


def main():
    build, work = sys.argv[1], sys.argv[2]
    sys.path.insert(0, os.path.join(build, "python"))
    import moerr
    os.makedirs(work, exist_ok=True)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(1))
    model, opt = make(moerr)
    step_times = []
    for _ in range(6):
        start = time.perf_counter()
        step(moerr, model, opt, tokens, bf16=False)
        step_times.append(time.perf_counter() - start)
    step_s = statistics.median(step_times[1:])  # the first warms the allocator
    paths = {}
    for name, bf16 in (("fp32", False), ("bf16", True)):
        model, opt = make(moerr)
        paths[name] = os.path.join(work, f"{name}.moerr")
        with moerr.record(paths[name], mode="full", overwrite=True) as rec, rec.step():
            step(moerr, model, opt, tokens, bf16)
    moerr_bin = os.path.join(build, "tools", "moerr")
    base = [moerr_bin, "diff", paths["fp32"], paths["bf16"], "--json"]
    rows = []
    for label, extra in (("observed, fingerprints (`--fingerprints`)", ["--fingerprints"]),
                         ("observed on bytes, introduced estimated (`--estimate`)", ["--estimate"]),
                         ("introduced error measured (default)", [])):
        seconds, report = timed(base + extra)
        intro = report["introduced"]
        rows.append((label, seconds, report, intro))
    size = sum(os.path.getsize(p) for p in paths.values())
    print(f"One step: {BATCH}x{SEQ} tokens, {LAYERS} layers, {EXPERTS} experts of d={D}; "
          f"step {step_s * 1e3:.0f} ms unrecorded; the two full bundles {size / 1e6:.1f} MB; "
          f"{rows[0][2]['matched']} ops matched.")
    print()
    print("| diff | seconds | x step time | x `--estimate` | ops measured (A, B) | verdict |")
    print("|---|---|---|---|---|---|")
    estimate_s = rows[1][1]
    for label, seconds, report, intro in rows:
        verdict = "within rounding" if intro["within_rounding"] else "difference"
        print(f"| {label} | {seconds:.2f} | {seconds / step_s:.1f} | {seconds / estimate_s:.2f} | "
              f"{intro['measured_a']}, {intro['measured_b']} | {verdict} |")


if __name__ == "__main__":
    main()
