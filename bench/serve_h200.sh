#!/usr/bin/env bash
# `markbase serve` on one GPU with random weights at real widths under the serving issue's workload
# (tools/bench_serve.py: random token-id prompts of 512, 512 generated with ignore_eos; PROMPTS at concurrency
# 100, request rate inf, once per temperature in TEMPS: 0 is greedy, a sampled one draws through the
# generation defaults' top_k 64 and top_p 0.95; then 16 greedy prompts at concurrency 1), one receipt.
#
# Usage: MARKBASE=PATH TOK=DIR OUT=DIR VARIANT=e2b [PROMPTS=1000] [TEMPS="0 0.8"] [SERVE_ARGS="--kv-cache-dtype
#        fp8"] bash bench/serve_h200.sh     (TOK: the Gemma 4 tokenizer folder, the model's -m)
# Writes $OUT/serve-h200-$VARIANT.json (every figure, the server's command line) and the logs.
set -u
: "${MARKBASE:?markbase binary}" "${TOK:?tokenizer dir}" "${OUT:?output dir}"
VARIANT=${VARIANT:-e2b}
PROMPTS=${PROMPTS:-1000}
TEMPS=${TEMPS:-0 0.8}
SERVE_ARGS=${SERVE_ARGS:-}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH=$ROOT/tools/bench_serve.py
PORT=8090
mkdir -p "$OUT"
T0=$(date +%s)
say() { echo "[$(($(date +%s) - T0))s] $*" | tee -a "$OUT/serve-log.txt"; }
. "$ROOT/bench/serve_common.sh"

# shellcheck disable=SC2206  # SERVE_ARGS is a list of flags
CMD=("$MARKBASE" serve -m "$TOK" --device cuda --synthetic "$VARIANT" -np 100 -c 1100 -b 512 $SERVE_ARGS
     --host 127.0.0.1 --port $PORT)
start_server markbase "${CMD[@]}" || exit 1
common=(--input-len 512 --output-len 512 --ignore-eos --seed 1 --id-high 8000)
for t in $TEMPS; do
    load "c100-t$t" 560 "${common[@]}" --num-prompts "$PROMPTS" --max-concurrency 100 --temperature "$t"
done
load c1 200 "${common[@]}" --num-prompts 16 --max-concurrency 1
stop_server

python3 - "$OUT" "$VARIANT" "${CMD[*]}" $TEMPS <<'PY'
import datetime, json, os, subprocess, sys
out, variant, cmd, temps = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
def load(name):
    try:
        return json.load(open(os.path.join(out, name + ".json")))
    except Exception as e:  # a run that failed: its .txt beside says why
        return {"error": str(e)}
try:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
except OSError as e:  # no GPU here (a rehearsal)
    smi = f"unknown ({e})"
try:
    peak = max(int(l) for l in open(os.path.join(out, "markbase-mem.txt")) if l.strip().isdigit())
except Exception:
    peak = None
runs = {f"c100-t{t}": load(f"c100-t{t}") for t in temps}
runs["c1"] = load("c1")
r = {"kind": "serve-bench", "what": cmd + " driven by tools/bench_serve.py (streaming /v1/completions, random "
     "token-id prompts, ignore_eos; temperature per run, top_k 64 and top_p 0.95 from the generation defaults)",
     "device": smi, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
     "commit": os.environ.get("MARKBASE_COMMIT", "unknown"), "peak_gpu_memory_mib": peak, "runs": runs}
json.dump(r, open(os.path.join(out, f"serve-h200-{variant}.json"), "w"), indent=1)
for k, v in runs.items():
    print(k, {x: v.get(x) for x in ("output_throughput", "successful_requests", "failed_requests")})
PY
say done
