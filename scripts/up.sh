#!/usr/bin/env bash
# Starts the local environment in the background and waits until it is ready.
set -euo pipefail
state=${1:-.holdfast}
mkdir -p "$state"
pidfile="$state/localenv.pid"

if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null && [ -f "$state/env" ]; then
  echo "holdfast local environment already running (pid $(cat "$pidfile")); source $state/env"
  exit 0
fi

rm -f "$state/env"
nohup target/debug/holdfast-localenv up --state-dir "$state" >"$state/localenv.log" 2>&1 &
pid=$!
echo "$pid" >"$pidfile"

# The environment writes $state/env last, once every server answers.
for _ in $(seq 1 600); do
  if [ -f "$state/env" ]; then
    grep -h 'ready in' "$state/localenv.log" || true
    echo "run: source $state/env && kubectl get ns"
    exit 0
  fi
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "holdfast local environment failed to start:" >&2
    tail -40 "$state/localenv.log" >&2
    rm -f "$pidfile"
    exit 1
  fi
  sleep 0.2
done
echo "holdfast local environment not ready after 120 s; see $state/localenv.log" >&2
exit 1
