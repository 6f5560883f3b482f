#!/usr/bin/env bash
# The plots BENCHMARKS.md shows, drawn by scripts/plot-benchmarks.py from the CSV files the benches
# write into docs/benchmarks/data/:
#
#   scripts/plots.sh           draw docs/benchmarks/*.svg (`make plots`, after a bench)
#   scripts/plots.sh --check   fail unless the committed plots are what the committed data draws
#                              (in `make test`)
#
# matplotlib comes from PyPI, with its dependencies pinned in scripts/plots-requirements.txt, into a
# virtualenv under the holdfast cache named after that file's hash (the machine's python3 has no
# matplotlib; pinned versions keep the SVGs reproducible byte for byte).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE_DIR=${HOLDFAST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/holdfast}
REQUIREMENTS="$ROOT/scripts/plots-requirements.txt"
VENV="$CACHE_DIR/plots-venv-$(sha256sum "$REQUIREMENTS" | cut -c1-12)"

if ! "$VENV/bin/python" -c "import matplotlib" 2>/dev/null; then
  echo "plots: installing matplotlib into $VENV" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps -r "$REQUIREMENTS"
fi
exec "$VENV/bin/python" "$ROOT/scripts/plot-benchmarks.py" "$@"
