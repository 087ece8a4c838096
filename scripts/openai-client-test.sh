#!/usr/bin/env bash
# The official openai npm client (tests/server/js) and a tools/bench_serve.py smoke run against a live server:
# starts it in the background on a free port with an API key, waits for /health, runs `npm ci && node --test`,
# then 8 benchmark requests (all must succeed), stops it with SIGTERM (which must end it with exit 0) and fails
# when any of that fails. Usage: scripts/openai-client-test.sh BUILD_DIR
# Skips, saying why, when BUILD_DIR was configured without cpp-httplib (no HTTP server in that build).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
if ! grep -q '^MARKBASE_HTTPLIB_FOUND:INTERNAL=1' "$build/CMakeCache.txt" 2>/dev/null; then
  echo "openai client tests: SKIPPED: $build has no HTTP server (cpp-httplib was not found at configure time)"
  exit 0
fi
# The server under test: `markbase serve` on the bundled model (the CPU backend's sequence slots).
server=("$build/markbase" serve --device cpu)
key="test-key-$RANDOM$RANDOM"
log=$(mktemp)
"${server[@]}" --host 127.0.0.1 --port 0 --api-key "$key" >"$log" 2>&1 &
pid=$!
stop_server() { kill -TERM "$pid" 2>/dev/null || true; }
trap stop_server EXIT
url=
for _ in $(seq 1200); do  # the model loads first: up to two minutes
  url=$(sed -n 's/.*listening on \(http:\/\/[^ ]*\).*/\1/p' "$log" | head -n 1)
  [ -n "$url" ] && break
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "error: the server under test exited before listening:" >&2
    cat "$log" >&2
    exit 1
  fi
  sleep 0.1
done
if [ -z "$url" ] || ! python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/health", timeout=10)' "$url"; then
  echo "error: the server under test did not answer /health:" >&2
  cat "$log" >&2
  exit 1
fi
echo "openai client tests against ${server[*]} at $url"
status=0
(cd tests/server/js && npm ci --no-audit --no-fund --loglevel=error &&
  MARKBASE_URL="$url" MARKBASE_API_KEY="$key" node --test openai.test.js) || status=$?
# A smoke run of the load generator (tools/bench_serve.py): every request must succeed, and with ignore_eos
# every reply has exactly --output-len tokens.
if [ "$status" -eq 0 ]; then
  python3 tools/bench_serve.py --base-url "$url" --api-key "$key" --input-len 16 --output-len 8 --num-prompts 8 \
    --max-concurrency 4 --request-rate 50 --ignore-eos --json-out "$build/bench-serve-smoke.json" &&
    python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
assert d["successful_requests"] == 8 and d["failed_requests"] == 0, d
assert d["total_output_tokens"] == 64, d
s = d["server_steps"]  # the scheduler-thread split from GET /metrics: 8 prompts of 16 ids, 7 decode rows each
assert s and s["steps"] > 0 and s["prompt_tokens"] == 128, s
assert round(s["decode_rows_per_step"] * s["steps"]) == 56 and s["decode_s"] > 0, s' "$build/bench-serve-smoke.json" || status=$?
fi
trap - EXIT
kill -TERM "$pid"
server_status=0
wait "$pid" || server_status=$?
if [ "$status" -ne 0 ] || [ "$server_status" -ne 0 ]; then
  echo "error: openai client tests exit $status, server exit $server_status on SIGTERM; its log:" >&2
  tail -n 50 "$log" >&2
  exit 1
fi
rm -f "$log"
