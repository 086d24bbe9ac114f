"""Multi-rank recorder overhead, bundle size and one-rank replay.

    bench_distributed.py BUILD_DIR WORK_DIR [--preset small] [--steps 3]
                         [--rounds 3] [--ranks 2,4] [--warmup-steps 200]
                         [--init CHECKPOINT]

Ranks oversubscribe the machine's cores, so wall time says little; this
measures CPU time. `moerr train --ranks N --ep 2` starts from one warm
checkpoint (made once, `--steps 0`), and each mode (no recorder, stats,
replayable) runs with --steps 0 and with --steps S (--init: start from this
checkpoint instead of a warm-up of its own). The CPU time of the
launcher and its ranks (every thread: LibTorch's, the recorder's worker and
writer) is the getrusage(RUSAGE_CHILDREN) delta around each run, so what
both runs do once (start, rendezvous, loading, the final checkpoint, the
accuracy pass) cancels in T(S) - T(0):

    per-rank CPU per step = (T(S) - T(0)) / S / N

Modes are interleaved within a round, in a rotated order, and the median
over rounds is printed. Bundle bytes per rank and step are the same
difference of the rank bundles' sizes. Replay of one rank
(`moerr replay RUN --rank 1`, one intra-op thread as the rank had) is timed
the same way: steps 0..S-1 against step 0 alone, the difference per step,
against the rank's own CPU per step unrecorded."""
import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

TARGETS = {"none": None, "stats": 1.15, "replayable": 1.5}
MODES = ["none", "stats", "replayable"]


def children_cpu():
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


def run_cpu(cmd, env=None):
    """CPU seconds of the command and its descendants, and wall seconds."""
    c0, t0 = children_cpu(), time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    wall, cpu = time.perf_counter() - t0, children_cpu() - c0
    if p.returncode != 0:
        sys.exit("command failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stdout[-4000:]))
    return cpu, wall


def rank_sizes(run_dir, n):
    return [os.path.getsize(os.path.join(run_dir, "rank%d.moerr" % k)) for k in range(n)]


def train(args, work, n, mode, steps, tag):
    out = os.path.join(work, tag)
    cmd = [args.moerr, "train", "--ranks", str(n), "--ep", "2", "--preset", args.preset,
           "--init", args.checkpoint, "--warmup-steps", "0",
           "--steps", str(steps), "-o", out, "--force"]
    if mode != "none":
        cmd += ["--record", mode]
    cpu, _ = run_cpu(cmd)
    sizes = rank_sizes(os.path.join(out, "run"), n) if mode != "none" else None
    return cpu, sizes, out


def measure(args, work, n):
    """Per mode: the per-rank CPU ms per step of every round, bundle bytes per rank and step."""
    cpu = {m: [] for m in MODES}
    size = {}
    for r in range(args.rounds):
        order = MODES[r % len(MODES):] + MODES[:r % len(MODES)]
        for m in order:
            t0, s0, _ = train(args, work, n, m, 0, "n%d_%s_0" % (n, m))
            ts, ss, _ = train(args, work, n, m, args.steps, "n%d_%s_s" % (n, m))
            cpu[m].append((ts - t0) / args.steps / n * 1e3)
            if ss is not None:
                size[m] = [(b - a) / args.steps for a, b in zip(s0, ss)]
    return cpu, size


def replay(args, work, n):
    """CPU ms per replayed step of rank 1 of the replayable run at N ranks (median over rounds)."""
    run_dir = os.path.join(work, "n%d_replayable_s" % n, "run")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    per_step, walls = [], []
    for _ in range(args.rounds):
        c1, w1 = run_cpu([args.moerr, "replay", run_dir, "--rank", "1", "--step", "0"], env)
        steps = [str(s) for s in range(args.steps)]
        cs, ws = run_cpu([args.moerr, "replay", run_dir, "--rank", "1", "--step"] + steps, env)
        per_step.append((cs - c1) / (args.steps - 1) * 1e3)
        walls.append((ws - w1) / (args.steps - 1) * 1e3)
    return statistics.median(per_step), statistics.median(walls)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("work")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--warmup-steps", type=int, default=200)
    ap.add_argument("--init", help="warm checkpoint to start from (default: a warm-up of --warmup-steps)")
    args = ap.parse_args()
    if args.steps < 2:
        sys.exit("--steps must be at least 2 (replay compares steps 0..S-1 with step 0 alone)")
    work = args.work
    os.makedirs(work, exist_ok=True)
    # A copy: every run uses the same binary even if the build tree is rebuilt meanwhile.
    args.moerr = os.path.join(work, "moerr")
    shutil.copy2(os.path.join(args.build, "tools", "moerr"), args.moerr)
    started = time.perf_counter()
    args.checkpoint = args.init
    if args.checkpoint is None:
        run_cpu([args.moerr, "train", "--preset", args.preset, "--steps", "0", "--warmup-steps",
                 str(args.warmup_steps), "-o", os.path.join(work, "warm"), "--force"])
        args.checkpoint = os.path.join(work, "warm", "checkpoint")

    ranks = [int(x) for x in args.ranks.split(",")]
    results = {n: measure(args, work, n) for n in ranks}
    print("`moerr train --ranks N --ep 2 --preset %s`, %d steps against 0 from one warm checkpoint, "
          "median of %d interleaved rounds; CPU time of every rank and thread, per rank and step:\n"
          % (args.preset, args.steps, args.rounds))
    print("| N | mode | per-rank CPU ms/step | x no recorder | target | met | rounds (ms) | bundle KiB/step per rank |")
    print("|---|---|---|---|---|---|---|---|")
    for n in ranks:
        cpu, size = results[n]
        base = statistics.median(cpu["none"])
        for m in MODES:
            med = statistics.median(cpu[m])
            target = TARGETS[m]
            kib = ("%.0f (ranks %s)" % (statistics.mean(size[m]) / 1024,
                                        ", ".join("%.0f" % (b / 1024) for b in size[m]))) if m in size else "-"
            print("| %d | %s | %.1f | %.2f | %s | %s | %s | %s |" % (
                n, "no recorder" if m == "none" else m, med, med / base,
                "<= %.2fx" % target if target else "-",
                ("yes" if med / base <= target else "no") if target else "-",
                ", ".join("%.0f" % x for x in cpu[m]), kib))

    n = ranks[0]
    rep_cpu, rep_wall = replay(args, work, n)
    step_cpu = statistics.median(results[n][0]["none"])
    rec_cpu = statistics.median(results[n][0]["replayable"])
    print("\nReplay of rank 1 of the %d-rank replayable run (`moerr replay RUN --rank 1`, one intra-op thread): "
          "%.1f ms CPU per step (%.1f ms wall), %.2fx the rank's unrecorded step CPU (%.1f ms), "
          "%.2fx its recorded one (%.1f ms)." % (n, rep_cpu, rep_wall, rep_cpu / step_cpu, step_cpu,
                                                  rep_cpu / rec_cpu, rec_cpu))
    print("(bench took %.0f s)" % (time.perf_counter() - started))


if __name__ == "__main__":
    main()
