#!/bin/bash
# moerr installed into a temporary prefix and used from there, with the build
# tree on no path (env -i, a scratch working directory): `moerr --version`, a
# record, inspect, replay and bisect of the tiny preset, and `import moerr`
# with only the prefix's site directory on PYTHONPATH, which records a step the
# installed command then reads. Also: no installed file names the build tree,
# no installed binary has an RPATH or RUNPATH, and every shared library they
# load resolves to a file of an installed Debian package.
#
# install_test.sh CMAKE BUILD_DIR VERSION PYTHON SITE
#   SITE: the Python package's directory under a prefix other than /usr
#   (lib/python3.X/dist-packages), or "" when the binding is not built.
set -euo pipefail
cmake=$1 build=$(cd "$2" && pwd -P) version=$3 python=$4 site=$5
work=$(mktemp -d "${TMPDIR:-/tmp}/moerr-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
fail() { echo "FAIL: $*" >&2; exit 1; }
# Runs a command as a user of the installed moerr would: a clean environment,
# a working directory outside the build tree, the prefix first on PATH.
run() { (cd "$work/cwd" && env -i HOME="$work" LANG=C.UTF-8 PATH="$prefix/bin:/usr/bin:/bin" "$@"); }

"$cmake" --install "$build" --prefix "$prefix" > "$work/install.log"
mkdir "$work/cwd"
test -x "$prefix/bin/moerr" || fail "no bin/moerr under the prefix"
test -f "$prefix/share/doc/moerr/README.md" || fail "no share/doc/moerr/README.md"
test -f "$prefix/share/doc/moerr/docs/FORMAT.md" || fail "no share/doc/moerr/docs/FORMAT.md"
test -f "$prefix/share/moerr/references/references.list" || fail "no share/moerr/references/references.list"

# Nothing refers back to the build tree (the docs are prose copied from the
# source tree: their pasted outputs may name any path).
if refs=$(grep -rlF --exclude-dir=doc "$build" "$prefix"); then
  fail "installed files name the build tree $build: $refs"
fi
elves=$(find "$prefix" -type f -exec sh -c 'head -c4 "$1" | grep -q ELF' _ {} \; -print)
test -n "$elves" || fail "no ELF file installed"
loaded=""
for f in $elves; do
  if readelf -d "$f" | grep -E '\((RPATH|RUNPATH)\)'; then fail "$f has an RPATH or RUNPATH"; fi
  libs=$(env -i ldd "$f")
  if grep -q 'not found' <<<"$libs"; then fail "$f: unresolved libraries: $libs"; fi
  # "name => /path (address)", or "/path (address)" for the dynamic loader.
  loaded+=$(awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' <<<"$libs")$'\n'
done
loaded=$(sort -u <<<"$loaded" | sed '/^$/d')
for lib in $loaded; do
  case $(realpath "$lib") in "$prefix"/*|"$build"/*) fail "an installed binary loads $lib";; esac
done
# ldd names a library by the directory ld.so.cache lists it in, /lib/... or
# /usr/lib/... (one directory on a merged /usr), or by an alternatives link;
# its package by the path it ships. One dpkg query for all.
names() { echo "$1"; echo "/usr$1"; echo "${1#/usr}"; realpath "$1"; }
owned=$(for lib in $loaded; do names "$lib"; done | sort -u | xargs dpkg -S 2>/dev/null | sed 's/^.*: //') || true
for lib in $loaded; do
  grep -qxF -f <(names "$lib") <<<"$owned" || fail "an installed binary loads $lib, which no Debian package installed"
done
echo "$(wc -w <<<"$loaded") libraries loaded, each a Debian package's"

# The version and the bundle format versions.
test "$(run sh -c 'command -v moerr')" = "$prefix/bin/moerr" || fail "moerr on PATH is not the installed one"
out=$(run moerr --version)
echo "$out"
grep -qx "moerr $version" <<<"$out" || fail "--version does not name moerr $version"
grep -qE '^bundle format: writes [0-9]+\.[0-9]+, reads [0-9]+\.x$' <<<"$out" || fail "--version names no bundle format"

# Record, inspect, replay and bisect a faulty step of the tiny preset.
run moerr train --preset tiny --fault expert-overflow --steps 1 --warmup-steps 20 --record replayable -o run \
  > "$work/train.log" || { cat "$work/train.log"; fail "moerr train"; }
out=$(run moerr inspect run/run.moerr)
head -1 <<<"$out"
grep -q "^run/run.moerr: moerr bundle v.*, written by moerr $version$" <<<"$out" || fail "inspect names no writer: $out"
run moerr inspect --json run/run.moerr | "$python" -c 'import json, sys; assert json.load(sys.stdin)["writer"] == sys.argv[1]' "$version" ||
  fail "inspect --json names no writer"
run moerr replay run/run.moerr --step 0 --check
# Exit code 1: the check ran and found an overflow.
rc=0; out=$(run moerr bisect run/run.moerr --step 0) || rc=$?
echo "$out"
test "$rc" = 1 || fail "bisect exited with $rc"
grep -q "first overflowing op" <<<"$out" || fail "bisect found no overflow"

# The Python package, with only the prefix's site directory on PYTHONPATH.
if [ -n "$site" ]; then
  run env PYTHONPATH="$prefix/$site" "$python" -s - "$prefix" "$version" <<'PY' || fail "import moerr"
import sys
import torch
import moerr
prefix, version = sys.argv[1:]
assert moerr.__file__.startswith(prefix + "/"), moerr.__file__
assert moerr.__version__ == version, moerr.__version__
assert moerr.Bundle("run/run.moerr").steps == [0]
model = torch.nn.Linear(4, 2)
with moerr.record("py.moerr", mode="stats") as rec:
    with rec.step():
        model(torch.ones(3, 4)).sum().backward()
print("import moerr:", moerr.__version__, "from", moerr.__file__)
PY
  run moerr inspect py.moerr | grep -q "written by moerr $version$" || fail "the Python recording names no writer"
fi
echo "installed moerr $version works from $prefix"
