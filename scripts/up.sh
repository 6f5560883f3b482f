#!/usr/bin/env bash
# Starts the local environment in the background and waits until it is ready.
#   scripts/up.sh [STATE] [--without-holdfast] [--without-kapp-controller]
# --without-holdfast (make cluster): no holdfast host processes; scripts/install.sh installs
# holdfast onto the real node instead. --without-kapp-controller (make cluster): no kapp-controller
# host processes; scripts/kapp-controller.sh runs it as a pod on the real node instead.
set -euo pipefail
state=${1:-.holdfast}
shift || true
# The flags, as one word: make up's and make cluster's environments differ.
mode=$(IFS=' '; echo "${*:-with-holdfast}" | sed 's/--//g; s/ /,/g')
mkdir -p "$state"
pidfile="$state/localenv.pid"

if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null && [ -f "$state/env" ]; then
  running=$(cat "$state/mode" 2>/dev/null || echo with-holdfast)
  if [ "$running" != "$mode" ]; then
    echo "the local environment is running $running (make up and make cluster differ there): make down first" >&2
    exit 1
  fi
  echo "holdfast local environment already running (pid $(cat "$pidfile")); source $state/env"
  exit 0
fi

rm -f "$state/env"
echo "$mode" >"$state/mode"
nohup target/debug/holdfast-localenv up --state-dir "$state" "$@" >"$state/localenv.log" 2>&1 &
pid=$!
echo "$pid" >"$pidfile"

# The environment writes $state/env last, once every server answers.
for _ in $(seq 1 600); do
  if [ -f "$state/env" ]; then
    # The ready line, and one line for each program make up runs once built (make deps builds it).
    grep -h -e 'ready in' -e 'not built' "$state/localenv.log" || true
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
