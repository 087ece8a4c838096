#!/usr/bin/env bash
# `markbase serve` side by side with llama-server on one GPU, on the same weights and the serving issue's workload
# (tools/bench_serve.py: random token-id prompts of 512, 512 generated with ignore_eos, greedy; 1,000 prompts at
# concurrency 100, request rate inf; then 16 prompts at concurrency 1), one server at a time.
#
# llama.cpp is never part of this tree: the caller carries a llama-server built from its source (e.g. the release
# that the npm package node-llama-cpp bundles as a git bundle, built with -DGGML_CUDA=ON) and that source's
# convert_hf_to_gguf.py with its conversion/ and gguf-py/ folders, in LLAMA_DIR. The weights are
# ../shared/tools/make_random_ckpt.py's (seed 1234, torch on the GPU machine), converted to a bf16 GGUF, so both
# engines read the same bf16 values. Both keep a 16-bit KV cache (llama-server f16, markbase bf16).
#
# llama-server for LLAMA_DIR, from that source (here, or on the GPU machine where 16 cores take minutes):
#   cmake -S SRC -B SRC/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real \
#     -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF && cmake --build SRC/build --target llama-server
#
# Usage: LLAMA_DIR=DIR MAKER=make_random_ckpt.py TOK=DIR MARKBASE=PATH OUT=DIR [VARIANT=e2b] [PROMPTS=1000]
#        [WORK=/tmp/peer] bash bench/peers/llama_server_h200.sh
# (CKPT=DIR and GGUF=FILE take an existing checkpoint and its GGUF; DEVICE=cpu, IN_LEN, OUT_LEN and LLAMA_BIN
# rehearse the harness on a machine without a GPU.)
# Writes $OUT/serve-vs-llama-server-$VARIANT.json (every figure, both servers' command lines) and the logs.
set -u
: "${LLAMA_DIR:?llama-server and convert_hf_to_gguf.py}" "${MAKER:?make_random_ckpt.py}" "${TOK:?tokenizer dir}"
: "${MARKBASE:?markbase binary}" "${OUT:?output dir}"
VARIANT=${VARIANT:-e2b}
PROMPTS=${PROMPTS:-1000}
WORK=${WORK:-/tmp/peer}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BENCH=$ROOT/tools/bench_serve.py
PORT=8090
DEVICE=${DEVICE:-cuda}
IN_LEN=${IN_LEN:-512}
OUT_LEN=${OUT_LEN:-512}
LLAMA_BIN=${LLAMA_BIN:-$LLAMA_DIR/llama-server}
mkdir -p "$WORK" "$OUT"
T0=$(date +%s)
say() { echo "[$(($(date +%s) - T0))s] $*" | tee -a "$OUT/peer-log.txt"; }

CKPT=${CKPT:-$WORK/$VARIANT}
GGUF=${GGUF:-$WORK/$VARIANT-bf16.gguf}
if [ ! -f "$CKPT/config.json" ]; then
    python3 "$MAKER" "$VARIANT" "$CKPT" --tokenizer-dir "$TOK" > "$OUT/ckpt.txt" 2>&1 || { tail -20 "$OUT/ckpt.txt"; exit 1; }
    say "checkpoint written"
fi
if [ ! -f "$GGUF" ]; then
    python3 "$LLAMA_DIR/convert_hf_to_gguf.py" "$CKPT" --outtype bf16 --outfile "$GGUF" > "$OUT/convert.txt" 2>&1 ||
        { tail -30 "$OUT/convert.txt"; exit 1; }
    say "converted to GGUF"
fi

# shared: start_server, load, stop_server
. "$ROOT/bench/serve_common.sh"
serve_and_bench() {
    local name=$1
    shift
    start_server "$name" "$@" || return 1
    local common=(--input-len "$IN_LEN" --output-len "$OUT_LEN" --ignore-eos --seed 1 --id-high 8000)
    load "$name-c100" 330 "${common[@]}" --num-prompts "$PROMPTS" --max-concurrency 100
    load "$name-c1" 120 "${common[@]}" --num-prompts 16 --max-concurrency 1
    stop_server
}

LLAMA_CMD=("$LLAMA_BIN" -m "$GGUF" -ngl 999 -np 100 -c $((100 * (IN_LEN + OUT_LEN + 76))) -fa on
           --host 127.0.0.1 --port $PORT --no-webui)
serve_and_bench llama "${LLAMA_CMD[@]}"
MB_CMD=("$MARKBASE" serve -m "$CKPT" --device "$DEVICE" -np 100 -c $((IN_LEN + OUT_LEN + 76)) -b 512
        --host 127.0.0.1 --port $PORT)
serve_and_bench markbase "${MB_CMD[@]}"

python3 - "$OUT" "$VARIANT" "$PROMPTS" "${LLAMA_CMD[*]}" "${MB_CMD[*]}" "$IN_LEN" "$OUT_LEN" <<'EOF'
import datetime, json, os, subprocess, sys
out, variant, prompts, llama_cmd, mb_cmd = sys.argv[1:6]
in_len, out_len = int(sys.argv[6]), int(sys.argv[7])
def load(name):
    try:
        return json.load(open(os.path.join(out, name)))
    except Exception as e:  # a run that failed: its .txt beside says why
        return {"error": str(e)}
def peak(name):
    try:
        return max(int(l) for l in open(os.path.join(out, name)) if l.strip().isdigit())
    except Exception:
        return None
def gpu():
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True).stdout.strip()
    except Exception:
        return None
r = {"benchmark": "serve-vs-llama-server", "variant": variant, "device": gpu(),
     "commit": os.environ.get("MARKBASE_COMMIT", "unknown"),
     "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
     "workload": {"input_len": in_len, "output_len": out_len, "ignore_eos": True, "temperature": 0,
                  "concurrency_100_prompts": int(prompts), "concurrency_1_prompts": 16, "request_rate": "inf"},
     "weights": "make_random_ckpt.py seed 1234, bf16; llama-server reads its bf16 GGUF (convert_hf_to_gguf.py)"}
for name, cmd in (("llama", llama_cmd), ("markbase", mb_cmd)):
    r[name] = {"command": cmd, "concurrency_100": load(f"{name}-c100.json"),
               "concurrency_1": load(f"{name}-c1.json"), "peak_gpu_memory_mib": peak(f"{name}-mem.txt")}
json.dump(r, open(os.path.join(out, f"serve-vs-llama-server-{variant}.json"), "w"), indent=1)
def brief(d):
    keys = ("output_throughput", "successful_requests", "failed_requests", "tpot_ms", "ttft_ms")
    return {k: d.get(k) for k in keys} if "output_throughput" in d else d
for name in ("llama", "markbase"):
    print(name, "c100", brief(r[name]["concurrency_100"]), "c1", brief(r[name]["concurrency_1"]),
          "peak MiB", r[name]["peak_gpu_memory_mib"])
EOF
say "done"
