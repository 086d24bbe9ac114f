#!/usr/bin/env bash
# Prints the path of moerr's Python environment, creating it first when it
# is missing: a virtual environment of Debian's python3 holding exactly
# requirements.txt. It lives outside the clone, keyed by the requirements'
# hash, so every clone on this machine shares one (the torch wheel is
# several GB): $MOERR_VENV_ROOT (default ~/.cache/moerr)/venv-HASH.
# A venv's scripts name its own path, so it is made where it lives; the
# file .complete, written when pip has finished, marks it usable, and one
# without it (an install cut short) is made again. A lock keeps two builds
# from making it at once.
set -euo pipefail
root_dir="$(cd "$(dirname "$0")/.." && pwd)"
req="$root_dir/requirements.txt"
base="${MOERR_VENV_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/moerr}"
venv="$base/venv-$(sha256sum "$req" | cut -c1-12)"
mkdir -p "$base"
exec 9>"$venv.lock"
flock 9
if [ ! -f "$venv/.complete" ]; then
  rm -rf "$venv"
  echo "moerr: creating the Python environment $venv from requirements.txt (the first time downloads the torch wheel, several GB)" >&2
  start=$(date +%s)
  /usr/bin/python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$req" >&2
  touch "$venv/.complete"
  echo "moerr: the environment was made in $(( $(date +%s) - start )) s" >&2
fi
echo "$venv"
