#!/bin/bash
# The wheel as a user installs it: `python -m build --wheel` of the source
# tree against the project environment's torch, installed into a fresh
# virtual environment next to that pinned torch (its site-packages on the
# new environment's path through a .pth file, so no second torch is
# downloaded), and used from there with the build tree on no path:
# `moerr --version`, a record, replay and bisect of the tiny preset, and
# `import moerr` in a small training loop whose bundle the installed command
# reads.
#
# wheel_test.sh SOURCE_DIR WORK_DIR VERSION PYTHON TREE_DIR CC CXX [CCACHE_DIR]
#   PYTHON is the project environment's interpreter. TREE_DIR keeps the
#   wheel's CMake tree between runs (an incremental rebuild). CC and CXX are
#   the compilers it builds with; with CCACHE_DIR it compiles through that
#   ccache (CMakeLists.txt, MOERR_CCACHE_DIR).
set -euo pipefail
if [ $# -lt 7 ]; then
  echo "usage: wheel_test.sh SOURCE_DIR WORK_DIR VERSION PYTHON TREE_DIR CC CXX [CCACHE_DIR]" >&2
  exit 2
fi
src=$(cd "$1" && pwd -P) work=$2 version=$3 python=$4 tree=$5 cc=$6 cxx=$7 ccache_dir=${8:-}
mkdir -p "$work"
work=$(cd "$work" && pwd -P)
# A tree elsewhere leaves the one an earlier layout kept here unused.
if [ "$(cd "$tree" 2>/dev/null && pwd -P)" != "$work/tree" ]; then rm -rf "$work/tree"; fi
defines=(-C cmake.define.CMAKE_C_COMPILER="$cc" -C cmake.define.CMAKE_CXX_COMPILER="$cxx")
if [ -n "$ccache_dir" ]; then
  defines+=(-C cmake.define.MOERR_CCACHE_DIR="$ccache_dir")
fi
fail() { echo "FAIL: $*" >&2; exit 1; }
rm -rf "$work/dist" "$work/venv" "$work/cwd"
mkdir "$work/cwd"

# --no-isolation: the build links the torch of the environment it runs in
# (cmake/MoerrTorch.cmake); an isolated one would have none.
start=$(date +%s)
"$python" -m build --wheel --no-isolation --outdir "$work/dist" -C build-dir="$tree" "${defines[@]}" "$src" \
  > "$work/build.log" 2>&1 || { tail -40 "$work/build.log"; fail "python -m build --wheel"; }
wheel=$(ls "$work"/dist/moerr-"$version"-*.whl) || fail "no moerr-$version wheel in $work/dist"
echo "built $(basename "$wheel") in $(( $(date +%s) - start )) s"

/usr/bin/python3 -m venv "$work/venv"
torch_site=$("$python" -I -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
new_site=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$torch_site" > "$new_site/pinned-torch.pth"
"$work/venv/bin/pip" install --quiet --disable-pip-version-check --no-deps "$wheel" || fail "pip install the wheel"

# A user's shell: a clean environment, the new environment's bin on PATH.
run() { (cd "$work/cwd" && env -i HOME="$work" LANG=C.UTF-8 PATH="$work/venv/bin:/usr/bin:/bin" "$@"); }
test "$(run sh -c 'command -v moerr')" = "$work/venv/bin/moerr" || fail "moerr on PATH is not the environment's"
out=$(run moerr --version)
echo "$out"
grep -qx "moerr $version" <<<"$out" || fail "--version does not name moerr $version"
# A path into the source tree, other than the new environment's own files
# (WORK_DIR lies in the build tree, which may lie in the source tree).
src_re=$(printf '%s' "$src" | sed 's/[].[*^$\/]/\\&/g')
leaked=$(grep -rhoa "$src_re/[^[:space:]\"']*" "$work/venv/bin/moerr" "$new_site/moerr" | grep -v "^$work" | sort -u | head -3 || true)
if [ -n "$leaked" ]; then
  fail "the installed package names the source tree: $leaked"
fi

run moerr train --preset tiny --fault expert-overflow --steps 1 --warmup-steps 20 --record replayable -o run \
  > "$work/train.log" || { cat "$work/train.log"; fail "moerr train"; }
run moerr replay run/run.moerr --step 0 --check || fail "moerr replay --check"
rc=0; out=$(run moerr bisect run/run.moerr --step 0) || rc=$?
echo "$out" | head -3
test "$rc" = 1 || fail "bisect exited with $rc, not 1 (an overflow found)"
grep -q "first overflowing op" <<<"$out" || fail "bisect found no overflow"

run python - "$work/venv" "$version" <<'PY' || fail "import moerr in a training loop"
import sys
import torch
import moerr
venv, version = sys.argv[1:]
assert moerr.__file__.startswith(venv + "/"), moerr.__file__
assert moerr.__version__ == version, moerr.__version__
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
moerr.instrument(model)
with moerr.record("loop.moerr", mode="replayable") as rec:
    for step in range(2):
        with rec.step():
            loss = model(torch.randn(4, 8)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            rec.outcome(loss=loss.item())
assert moerr.Bundle("loop.moerr").steps == [0, 1]
print("import moerr:", moerr.__version__, "torch", torch.__version__)
PY
run moerr replay loop.moerr --step 1 --check || fail "the installed command replays the Python loop's step"
echo "the wheel moerr $version works from $work/venv"
