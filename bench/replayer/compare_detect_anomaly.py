"""moerr bisect against torch.autograd.detect_anomaly on the same failing
steps of the tiny model: which op each tool names, and how long each takes.

    compare_detect_anomaly.py BUILD_DIR WORK_DIR

For each fault: `moerr train --record replayable` records a failing step,
`moerr bisect --json` names the first overflowing op from the recording's
fingerprints (timed as a process, reading included), export_step writes the
step's weights and batch, and detect_anomaly.py re-runs the step in PyTorch
(a Python port of the model) plainly and under anomaly mode."""
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# fault -> supervised warm-up steps it needs to fail (bad-kernel needs logits large enough for exp() to overflow).
FAULTS = {"expert-overflow": 100, "grad-overflow": 100, "bad-kernel": 600}


def run(cmd, ok=(0,)):
    """stdout of `cmd`; an exit code outside `ok` is an error."""
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode not in ok:
        raise SystemExit("%s exited %d: %s" % (" ".join(cmd), p.returncode, p.stderr))
    return p.stdout


def main():
    build, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    moerr = os.path.join(build, "tools", "moerr")
    export = os.path.join(build, "bench", "export_step")
    start = time.perf_counter()
    run([moerr, "--help"])
    startup_s = time.perf_counter() - start
    rows = []
    for fault, warmup in FAULTS.items():
        out = os.path.join(work, fault)
        run([moerr, "train", "--preset", "tiny", "--warmup-steps", str(warmup), "--steps", "4", "--fault", fault,
             "--record", "replayable", "--trigger", "anomaly:1", "-o", out, "--force"])
        bundle = os.path.join(out, "run.moerr")
        start = time.perf_counter()
        found = [r for r in json.loads(run([moerr, "bisect", bundle, "--json"], ok=(0, 1))) if r["found"]]
        bisect_s = time.perf_counter() - start
        if not found:
            rows.append((fault, "no failing step recorded", "", "", "", ""))
            continue
        first = found[0]
        step_dir = os.path.join(out, "step")
        run([export, bundle, str(first["step"]), step_dir])
        py = json.loads(run([sys.executable, os.path.join(HERE, "detect_anomaly.py"), step_dir]))
        moerr_names = "`%s` in `%s` (%s)" % (first["op"], first["module"] or "no module", first["phase"])
        torch_names = ("`%s`, blamed on `%s`" % (py["named"], py["forward_line"])) if py["named"] else "nothing"
        rows.append((fault, moerr_names, "%.2f s (start-up %.2f s)" % (bisect_s, startup_s), torch_names, "%.3f s" % py["seconds_anomaly"],
                     "%.3f s" % py["seconds_plain"]))
    print("| fault | moerr bisect names | moerr bisect (process) | detect_anomaly names | step under detect_anomaly "
          "| step without |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
