#!/usr/bin/env bash
# with-cslm.sh MODEL_DIR PORT COMMAND...  --  run COMMAND with `cslm serve MODEL_DIR --port PORT`
# up for its duration: start the server, wait until it accepts connections,
# run the command, stop the server (SIGTERM) whatever the command's outcome.
# CSLM (the cslm executable) and CSLM_SERVE_ARGS come from the environment.
set -euo pipefail
model=$1 port=$2
shift 2
cslm=${CSLM:-cslm}
log=${model%/}.serve.log

# shellcheck disable=SC2086
"$cslm" serve "$model" --port "$port" ${CSLM_SERVE_ARGS:-} >"$log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null || true' EXIT INT TERM

for _ in $(seq 1 ${CSLM_WAIT:-600}); do
  if ! kill -0 "$server" 2>/dev/null; then
    echo "with-cslm.sh: cslm serve exited early; see $log" >&2
    tail -n 5 "$log" >&2
    exit 1
  fi
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    break
  fi
  sleep 0.5
done
"$@"
