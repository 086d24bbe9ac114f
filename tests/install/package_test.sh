#!/bin/bash
# The Debian package `make package` builds: its control fields (dpkg-deb
# --info), its file list (dpkg-deb --contents), and its dependencies: every
# shared library a packaged binary needs belongs to a package it declares, and
# the package holds no copy of any of them.
#
# package_test.sh CPACK BUILD_DIR VERSION
set -euo pipefail
cpack=$1 build=$(cd "$2" && pwd -P) version=$3
work=$(mktemp -d "${TMPDIR:-/tmp}/moerr-package.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$cpack" --config "$build/CPackConfig.cmake" -B "$work" > "$work/cpack.log" || { cat "$work/cpack.log"; fail cpack; }
arch=$(dpkg --print-architecture)
deb=$work/moerr_${version}_$arch.deb
test -f "$deb" || fail "no $(basename "$deb"): $(ls "$work")"

info=$(dpkg-deb --info "$deb")
echo "$info"
field() { sed -n "s/^ $1: //p" <<<"$info"; }
test "$(field Package)" = moerr || fail "Package: $(field Package)"
test "$(field Version)" = "$version" || fail "Version: $(field Version)"
test "$(field Architecture)" = "$arch" || fail "Architecture: $(field Architecture)"
test -n "$(field Maintainer)" || fail "no Maintainer"
test -n "$(field Description)" || fail "no Description"
# Package names in Depends, without versions or alternatives' bars.
depends=$(field Depends | tr ',|' '\n\n' | sed 's/(.*)//; s/ //g' | sort -u)
for p in python3 python3-torch; do grep -qx "$p" <<<"$depends" || fail "Depends lacks $p"; done

# The files: the command, the Python package, the docs, the op references;
# no library but the binding's extension.
files=$(dpkg-deb --contents "$deb" | awk '{print $6}')
for f in ./usr/bin/moerr ./usr/lib/python3/dist-packages/moerr/__init__.py \
         ./usr/lib/python3/dist-packages/moerr/_version.py ./usr/share/doc/moerr/README.md \
         ./usr/share/doc/moerr/docs/FORMAT.md ./usr/share/moerr/references/references.list; do
  grep -qx "$f" <<<"$files" || fail "the package lacks $f"
done
grep -qx './usr/lib/python3/dist-packages/moerr/_moerr\..*\.so' <<<"$files" || fail "the package lacks the extension"
if stray=$(grep -v -e '/$' -e '^\./usr/bin/moerr$' -e '^\./usr/lib/python3/dist-packages/moerr/' \
                  -e '^\./usr/share/doc/moerr/' -e '^\./usr/share/moerr/references/' <<<"$files"); then
  fail "files outside moerr's own: $stray"
fi
if libs=$(grep -E '\.so(\.|$)' <<<"$files" | grep -v '/moerr/_moerr\.'); then fail "the package copies libraries: $libs"; fi

# Every library a packaged binary needs is a declared dependency's.
dpkg-deb -x "$deb" "$work/root"
for f in "$work/root/usr/bin/moerr" "$work"/root/usr/lib/python3/dist-packages/moerr/_moerr.*.so; do
  resolved=$(env -i ldd "$f")
  for soname in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    # "name => /path (address)", or "/path (address)" for the dynamic loader.
    path=$(awk -v n="$soname" '$1 == n && $2 == "=>" {print $3}
                                 $1 == "/lib64/" n || $1 == "/lib/" n {print $1}' <<<"$resolved")
    test -n "$path" || fail "$(basename "$f") needs $soname, which does not resolve"
    # The package ships it under /lib or /usr/lib (one directory on a merged
    # /usr), or behind an alternatives link.
    owner=""
    for candidate in "$path" "/usr$path" "$(realpath "$path")"; do
      owner=$(dpkg -S "$candidate" 2>/dev/null | head -1) && break
    done
    test -n "$owner" || fail "no package owns $path"
    owner=${owner%%:*}
    grep -qx "$owner" <<<"$depends" || fail "$(basename "$f") needs $soname from $owner, not in Depends"
    echo "$(basename "$f"): $soname <- $owner"
  done
done
echo "$(basename "$deb"): fields, files and dependencies check"
