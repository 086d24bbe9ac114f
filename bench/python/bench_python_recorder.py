"""The recorder's overhead from Python: one training step of a plain-PyTorch
MoE (moerr.examples.TinyMoe, d=64, 8 experts, batch 16 x 32 tokens, AdamW)
without the recorder, recorded in stats and replayable modes, and under
torch.autograd.detect_anomaly; rounds interleaved, medians, one thread.

    PYTHONPATH=BUILD/python bench_python_recorder.py WORK_DIR [--rounds 7]"""
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import moerr
from moerr.examples import TinyMoe


def main():
    work = sys.argv[1]
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 7
    os.makedirs(work, exist_ok=True)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = TinyMoe(vocab=64, d=64, experts=8, layers=2)
    moerr.instrument(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, 64, (16, 33), generator=torch.Generator().manual_seed(1))

    def step():
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 64), tokens[:, 1:].reshape(-1))
        loss.backward()
        with moerr.scope("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        return loss

    # Each returns the seconds of one step; a recording's open and close
    # (index, fsync) are per bundle, not per step, and are left out.
    def timed(fn):
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    def plain():
        return timed(step)

    def recorded(mode):
        def run():
            with moerr.record(os.path.join(work, mode + ".moerr"), mode=mode, overwrite=True) as rec:
                def body():
                    with rec.step():
                        rec.outcome(loss=step().item())
                return timed(body)
        return run

    def anomaly():
        def body():
            with torch.autograd.detect_anomaly():
                step()
        return timed(body)

    variants = [("no recorder", plain), ("moerr stats", recorded("stats")),
                ("moerr replayable", recorded("replayable")), ("torch.autograd.detect_anomaly", anomaly)]
    times = {name: [] for name, _ in variants}
    step()  # warm up allocations and AdamW state
    for _ in range(rounds):
        for name, run in variants:
            times[name].append(run())
    base = statistics.median(times["no recorder"])
    ops = len(moerr.Bundle(os.path.join(work, "stats.moerr")).ops(0))
    print("plain-PyTorch MoE step (%d recorded ops), median of %d interleaved rounds, one thread\n" % (ops, rounds))
    print("| variant | step ms | x no recorder |")
    print("|---|---|---|")
    for name, _ in variants:
        t = statistics.median(times[name])
        print("| %s | %.1f | %.2f |" % (name, 1e3 * t, t / base))


if __name__ == "__main__":
    import warnings
    warnings.simplefilter("ignore")  # detect_anomaly warns that it is slow on every use
    main()
