#!/bin/bash
# The C++ side installed by `cmake --install` into a temporary prefix and
# used from there, with the build tree on no path (env -i, a scratch working
# directory): `moerr --version`, a record, inspect, replay and bisect of the
# tiny preset. Also: no installed file names the build tree, the command's
# only RPATH is the directory of the torch it was built against, and every
# shared library it loads resolves to a file of that torch wheel (its
# LibTorch and the CUDA libraries it brings) or of an installed Debian
# package. The Python package installs with pip (wheel_test.sh).
#
# install_test.sh CMAKE BUILD_DIR VERSION PYTHON TORCH_LIB_DIR
set -euo pipefail
cmake=$1 build=$(cd "$2" && pwd -P) version=$3 python=$4 torch_lib=$(cd "$5" && pwd -P)
# The wheel's packages: torch/ and the nvidia/ and cuda libraries beside it.
site_packages=$(dirname "$torch_lib")
site_packages=$(dirname "$site_packages")
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
  rpath=$(readelf -d "$f" | sed -n 's/.*(\(RPATH\|RUNPATH\)).*\[\(.*\)\]/\2/p')
  test -z "$rpath" || test "$(cd "$rpath" && pwd -P)" = "$torch_lib" || fail "$f has the RPATH $rpath, not $torch_lib"
  libs=$(env -i ldd "$f")
  if grep -q 'not found' <<<"$libs"; then fail "$f: unresolved libraries: $libs"; fi
  # "name => /path (address)", or "/path (address)" for the dynamic loader.
  loaded+=$(awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' <<<"$libs")$'\n'
done
loaded=$(sort -u <<<"$loaded" | sed '/^$/d')
from_wheel=""
for lib in $loaded; do
  case $(realpath "$lib") in "$prefix"/*|"$build"/*) fail "an installed binary loads $lib";; esac
  case $(realpath "$lib") in "$site_packages"/*) from_wheel+="$lib"$'\n';; esac
done
n_wheel=$(sed '/^$/d' <<<"$from_wheel" | wc -l)
test "$n_wheel" -gt 0 || fail "the command loads no library of the torch wheel in $site_packages"
loaded=$(grep -vxF -f <(sed '/^$/d' <<<"$from_wheel") <<<"$loaded" || true)
# ldd names a library by the directory ld.so.cache lists it in, /lib/... or
# /usr/lib/... (one directory on a merged /usr), or by an alternatives link;
# its package by the path it ships. One dpkg query for all.
names() { echo "$1"; echo "/usr$1"; echo "${1#/usr}"; realpath "$1"; }
owned=$(for lib in $loaded; do names "$lib"; done | sort -u | xargs dpkg -S 2>/dev/null | sed 's/^.*: //') || true
for lib in $loaded; do
  grep -qxF -f <(names "$lib") <<<"$owned" || fail "an installed binary loads $lib, which no Debian package installed"
done
echo "$(wc -w <<<"$loaded") libraries loaded from Debian's packages, $n_wheel from the torch wheel"

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

echo "installed moerr $version works from $prefix"
