#!/usr/bin/env bash
# make bench: every benchmark, each printing its own markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/moerr-bench-XXXXXX")
trap 'rm -rf "$WORK"' EXIT

echo "## Chunk codec (Google Benchmark, one 4 MiB chunk of N(0, 0.02) bf16)"
"$BUILD/bench/chunk_codec_bench" --benchmark_min_time=0.5

echo
echo "## Bundle I/O against torch.save, .npy and fwrite"
"$PYTHON" bench/formats/bench_formats.py "$BUILD/bench/bundle_io_bench" "$WORK/formats"

echo
echo "## Reference model: GRPO step time and peak memory"
"$BUILD/bench/step_bench"

echo
echo "## Recorder overhead and bundle size per capture mode"
"$BUILD/bench/recorder_bench" --preset small

echo
echo "## Recorder cost per op on the wide preset (stats)"
"$BUILD/bench/recorder_bench" --preset wide --only stats

echo
echo "## Recorder overhead at hidden size 1024, four wide experts (h1024; prints its median op time)"
"$BUILD/bench/recorder_bench" --preset h1024 --only stats,replayable --steps 1 --rounds 1

echo
echo "## Op tracer bookkeeping per op (Google Benchmark; mode -1 untraced, 0 stats, 1 replayable)"
"$BUILD/bench/tracer_bench" --benchmark_min_time=1

echo
echo "## Fingerprint kernel (Google Benchmark, 16 MiB per dtype)"
"$BUILD/bench/fingerprint_bench" --benchmark_min_time=0.5

echo
echo "## Replay and bisect against one step"
"$BUILD/bench/replay_bench" --preset small

echo
echo "## Several ranks: recorder CPU per rank and step, bundle size per rank, replay of one rank"
"$PYTHON" bench/distributed/bench_distributed.py "$BUILD" "$WORK/distributed"

echo
echo "## Fewer ranks: device time per step of an 8-rank step and of its proxies on 4, 2 and 1 ranks"
"$PYTHON" bench/distributed/bench_fewer_ranks.py "$BUILD" "$WORK/fewer" --faults expert-overflow,grad-overflow,logprob-precision,bad-kernel,router-collapse,skip-update --rounds 3

echo
echo "## moerr bisect against torch.autograd.detect_anomaly on the same failing steps"
"$PYTHON" bench/replayer/compare_detect_anomaly.py "$BUILD" "$WORK/anomaly"

echo
echo "## Recorder overhead from Python, against torch.autograd.detect_anomaly"
PYTHONPATH="$BUILD/python" "$PYTHON" bench/python/bench_python_recorder.py "$WORK/python"

echo
echo "## Diff throughput against numpy"
"$PYTHON" bench/diff/bench_diff.py "$BUILD" "$WORK/diff"

echo
echo "## moerr diff of two imported msprobe tensor dumps against numpy (MOERR_IMPORT_BENCH_MIB per side, default 256)"
"$PYTHON" bench/importers/bench_import_diff.py "$BUILD" "$WORK/import" --mib "${MOERR_IMPORT_BENCH_MIB:-256}"

echo
echo "## moerr proxy --checkpoint on a generated 8 GB Qwen3-MoE-layout bf16 checkpoint (MOERR_PROXY_BENCH_GB, default 8; deleted after)"
"$PYTHON" bench/proxy/bench_checkpoint_proxy.py "$BUILD" "$WORK/proxy" --gb "${MOERR_PROXY_BENCH_GB:-8}"
