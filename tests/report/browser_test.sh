#!/bin/sh
# The HTML report of a recorded faulty step, opened in headless Chromium
# (Debian's chromium package; `make deps` installs it). Fails when Chromium
# is missing, when the page logs anything to the console (it has no script,
# so a console line is the browser complaining), or when a plot, the
# verdict or a dot's hover text is missing from the DOM Chromium built.
#   browser_test.sh MOERR WORKDIR
set -eu
moerr=$1
dir=$2
chromium=${CHROMIUM:-chromium}

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

command -v "$chromium" >/dev/null 2>&1 || fail "no $chromium on PATH: make deps installs Debian's chromium package"
rm -rf "$dir"
mkdir -p "$dir"
"$moerr" train --preset tiny --fault expert-overflow --steps 1 --warmup-steps 0 --record stats -o "$dir/run" \
  >"$dir/train.log" 2>&1 || fail "moerr train (see $dir/train.log)"
"$moerr" report "$dir/run/run.moerr" --would-fit fp16 -o "$dir/report.html" || fail "moerr report"
page=$(cd "$dir" && pwd)/report.html
timeout 120 "$chromium" --headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run \
  --user-data-dir="$dir/profile" \
  --enable-logging=stderr --v=0 --virtual-time-budget=2000 --dump-dom "file://$page" \
  >"$dir/dom.html" 2>"$dir/chromium.log" || fail "$chromium exited with $? (see $dir/chromium.log)"

grep -q '</html>' "$dir/dom.html" || fail "$chromium dumped no page (see $dir/chromium.log)"
if grep ':CONSOLE' "$dir/chromium.log" >&2; then
  fail "the page logged to the console (above)"
fi
# Each plot the step has, and the verdict, as Chromium parsed them.
for what in '<svg[^>]* class="plot headroom"' '<svg[^>]* class="plot expert-load"' '<section class="verdict failed">' \
  '<dt>Cause</dt>' '<dt>First non-finite op</dt>' '<dt>Run next</dt>' 'first overflow: op '; do
  grep -q "$what" "$dir/dom.html" || fail "no $what in the rendered page"
done
# Every dot of the file is in the DOM (nothing lost to a parse error), and
# each has its hover text: op index, op, module, phase, headroom.
written=$(grep -o '<circle' "$page" | wc -l)
parsed=$(grep -o '<circle' "$dir/dom.html" | wc -l)
titled=$(grep -Eo '<circle [^>]*><title>op [0-9]+ [^<]+ in [^<]+ \((forward|backward|optimizer|other)[^<]*\): [^<]+(headroom -?[0-9.]+ bits|not finite)' \
  "$dir/dom.html" | wc -l)
[ "$written" -gt 0 ] || fail "the headroom plot has no dots"
[ "$parsed" -eq "$written" ] || fail "$written dots written, $parsed in the rendered page"
[ "$titled" -eq "$parsed" ] || fail "$titled of $parsed dots carry their details on hover"
echo "ok: $parsed dots with hover details, 2 plots and the verdict rendered; no console message"
