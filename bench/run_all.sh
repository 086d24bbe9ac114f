#!/usr/bin/env bash
# make bench: every benchmark, each printing its own markdown table, on
# stdout and into bench/RESULTS.md (RESULTS=... to write elsewhere), which
# is replaced only when every benchmark ran. Each section names the command
# that reproduces it ($WORK: a temporary directory); the header names the
# date, the commit, the machine, the torch and its BLAS. Progress goes to
# stderr, not into the file.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
RESULTS=${RESULTS:-bench/RESULTS.md}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/moerr-bench-XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# One benchmark: its title, the command (as run from the source root), its output.
section() {
  local title=$1
  shift
  echo
  echo "## $title"
  local shown="$*"
  echo
  echo "\`${shown//$WORK/\$WORK}\`"
  echo
  "$@"
}

header() {
  echo "# Benchmark results"
  echo
  echo "Written by \`make bench\` (bench/run_all.sh); re-run it to refresh. Ratios are measured within one run."
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
  echo "- machine: $(uname -sm), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
  "$PYTHON" - <<'PY'
import re, torch
blas = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
print("- torch: %s (CPU threads %d), BLAS: %s" % (torch.__version__, torch.get_num_threads(), blas.group(1) if blas else "unknown"))
PY
}

{
header
section "Chunk codec (Google Benchmark, one 4 MiB chunk of N(0, 0.02) bf16)" \
  "$BUILD/bench/chunk_codec_bench" --benchmark_min_time=0.5
section "Bundle I/O against torch.save, .npy and fwrite" \
  "$PYTHON" bench/formats/bench_formats.py "$BUILD/bench/bundle_io_bench" "$WORK/formats"
section "Reference model: GRPO step time and peak memory" \
  "$BUILD/bench/step_bench"
section "Recorder overhead and bundle size per capture mode" \
  "$BUILD/bench/recorder_bench" --preset small
section "Recorder cost per op on the wide preset (stats)" \
  "$BUILD/bench/recorder_bench" --preset wide --only stats
section "Recorder overhead at hidden size 1024, four wide experts (h1024; prints its median op time)" \
  "$BUILD/bench/recorder_bench" --preset h1024 --only stats,replayable --steps 1 --rounds 1
section "Op tracer bookkeeping per op (Google Benchmark; mode -1 untraced, 0 stats, 1 replayable)" \
  "$BUILD/bench/tracer_bench" --benchmark_min_time=1
section "Fingerprint kernel (Google Benchmark, 16 MiB per dtype)" \
  "$BUILD/bench/fingerprint_bench" --benchmark_min_time=0.5
section "Replay and bisect against one step" \
  "$BUILD/bench/replay_bench" --preset small
section "Several ranks: recorder CPU per rank and step, bundle size per rank, replay of one rank" \
  "$PYTHON" bench/distributed/bench_distributed.py "$BUILD" "$WORK/distributed"
section "Fewer ranks: device time per step of an 8-rank step and of its proxies on 4, 2 and 1 ranks, for each fault that fails at once (median of 3 rounds)" \
  "$BUILD/tools/moerr" proxy-eval --ranks 8 --preset wide-ep --warmup-steps 10 --rounds 3 -o "$WORK/fewer"
section "moerr bisect against torch.autograd.detect_anomaly on the same failing steps" \
  "$PYTHON" bench/replayer/compare_detect_anomaly.py "$BUILD" "$WORK/anomaly"
section "Recorder overhead from Python, against torch.autograd.detect_anomaly" \
  env PYTHONPATH="$BUILD/python" "$PYTHON" bench/python/bench_python_recorder.py "$WORK/python"
section "moerr reduce op by op (each candidate replayed) against one replay of the whole step: the demo's failing step and a plain-PyTorch step of ~5,000 ops" \
  env PYTHONPATH="$BUILD/python" "$PYTHON" bench/replayer/bench_op_reduce.py "$BUILD" "$WORK/op_reduce"
section "Diff throughput against numpy" \
  "$PYTHON" bench/diff/bench_diff.py "$BUILD" "$WORK/diff"
section "moerr diff judging introduced error (each op beside its fp64 run) against the observed diff, on fp32 and bf16 full recordings of one plain-PyTorch MoE step" \
  "$PYTHON" bench/diff/bench_precision_diff.py "$BUILD" "$WORK/precision_diff"
section "moerr diff of two imported msprobe tensor dumps against numpy (MOERR_IMPORT_BENCH_MIB per side, default 256)" \
  "$PYTHON" bench/importers/bench_import_diff.py "$BUILD" "$WORK/import" --mib "${MOERR_IMPORT_BENCH_MIB:-256}"
section "msprobe compare against moerr import msprobe + moerr diff on the same two msprobe tensor dumps of one step (MOERR_IMPORT_BENCH_MIB of forward outputs per side, default 256)" \
  "$PYTHON" bench/importers/bench_msprobe_compare.py "$BUILD" "$WORK/msprobe" --mib "${MOERR_IMPORT_BENCH_MIB:-256}"
section "moerr import fr + inspect of 64 ranks x 2,000 Flight Recorder entries against torch's analyzer" \
  "$PYTHON" bench/importers/bench_flight_recorder.py "$BUILD" "$WORK/flight_recorder"
section "moerr proxy --checkpoint on a generated 8 GB Qwen3-MoE-layout bf16 checkpoint (MOERR_PROXY_BENCH_GB, default 8; deleted after)" \
  "$PYTHON" bench/proxy/bench_checkpoint_proxy.py "$BUILD" "$WORK/proxy" --gb "${MOERR_PROXY_BENCH_GB:-8}"
# Issue 44's table on the fine preset: static fidelity of every method at 3
# sample seeds (minutes each), then the whole table (hours).
FINE_METHODS=(cluster cluster-frequency reap frequency random hc-medoid)
for s in 0 1 2; do
  section "moerr proxy-eval, static fidelity on fine (qwen2_moe), sample seed $s: every method at 1/2, 1/4, 1/8, with and without --heal 50" \
    "$BUILD/tools/moerr" proxy-eval -o "$WORK/fine" --preset fine --family qwen2_moe --static-only --sample-seed "$s" \
    --keep 1/2 1/4 1/8 --methods "${FINE_METHODS[@]}" --heal 50
done
section "moerr proxy-eval on fine (qwen2_moe): every method at 1/2, 1/4, 1/8, with and without --heal 50, dynamics over 3 trainer seeds, faults x 3 seeds (hours)" \
  "$BUILD/tools/moerr" proxy-eval -o "$WORK/fine" --preset fine --family qwen2_moe --keep 1/2 1/4 1/8 \
  --methods "${FINE_METHODS[@]}" --heal 50 --trainer-seeds 3 --seeds 3
# The transformers table needs transformers in $PYTHON (its config is written
# by transformers itself); without it the section says it was skipped.
# Methods and --heal as in the fine table above.
HF_TITLE="moerr proxy-eval on a transformers architecture: a Qwen3-MoE config.json with fine's sizes (64 experts, top-8), written by \`python bench/proxy/write_hf_moe_config.py \$WORK/hf-config\`; every method at 1/2, 1/4, 1/8, with and without --heal 50; every proxy kept as an HF checkpoint in \$WORK/hf-table/proxies (hours)"
if "$PYTHON" -c 'import transformers' 2>/dev/null; then
  "$PYTHON" bench/proxy/write_hf_moe_config.py "$WORK/hf-config" >&2
  section "$HF_TITLE" \
    "$BUILD/tools/moerr" proxy-eval --hf-config "$WORK/hf-config/config.json" --keep 1/2 1/4 1/8 \
    --methods "${FINE_METHODS[@]}" --heal 50 --trainer-seeds 3 --seeds 3 \
    -o "$WORK/hf-table"
else
  printf '\n## %s\n\nskipped: %s cannot import transformers (pip install transformers, or PYTHON=a python that has it)\n' \
    "$HF_TITLE" "$PYTHON"
  echo "bench: transformers not importable by $PYTHON; the transformers proxy-eval table is skipped" >&2
fi
} | tee "$RESULTS.partial"
mv "$RESULTS.partial" "$RESULTS"
