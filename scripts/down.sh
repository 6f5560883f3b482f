#!/usr/bin/env bash
# Stops what `make up` started: SIGTERM to the environment process, which stops its servers.
set -euo pipefail
state=${1:-.holdfast}
pidfile="$state/localenv.pid"
if [ ! -f "$pidfile" ]; then
  echo "holdfast local environment not running"
  exit 0
fi
pid=$(cat "$pidfile")
if kill -0 "$pid" 2>/dev/null; then
  kill -TERM "$pid"
  for _ in $(seq 1 150); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "environment (pid $pid) did not stop in 30 s; killing it" >&2
    kill -KILL "$pid" || true
  fi
fi
rm -f "$pidfile" "$state/env" "$state/mode"
echo "holdfast local environment stopped"
