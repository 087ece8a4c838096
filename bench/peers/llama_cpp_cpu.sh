#!/usr/bin/env bash
# The CPU backend side by side with llama.cpp's CPU build, in one call on one machine, on the same weights
# (the CPU issue's measurement): decode and prefill of 64 (and 512) at 16 threads and at 2 (taskset).
#
# llama.cpp is never part of this tree: the caller carries its source as a tarball (e.g. the llama.cpp
# release that the npm package node-llama-cpp bundles as a git bundle) and names it in LLAMA_SRC. The
# weights are ../shared/tools/make_random_ckpt.py's (seed 1234, torch on the GPU machine), converted to a
# bf16 GGUF by that source's convert_hf_to_gguf.py, so both engines read the same bf16 values.
#
# Usage: LLAMA_SRC=.shared/llama.cpp.tar.xz MAKER=.shared/tools/make_random_ckpt.py TOK=DIR \
#        MARKBASE=PATH OUT=DIR [VARIANT=e2b] [WORK=/tmp/peer] bash bench/peers/llama_cpp_cpu.sh
# Writes $OUT/cpu-vs-llama-cpp.json (every figure, both engines' command lines) and the raw outputs.
set -u
: "${LLAMA_SRC:?tarball of the llama.cpp source}" "${MAKER:?make_random_ckpt.py}" "${TOK:?tokenizer dir}"
: "${MARKBASE:?markbase binary}" "${OUT:?output dir}"
VARIANT=${VARIANT:-e2b}
WORK=${WORK:-/tmp/peer}
NPROC=$(nproc)
mkdir -p "$WORK" "$OUT"
T0=$(date +%s)
say() { echo "[$(($(date +%s) - T0))s] $*" | tee -a "$OUT/peer-log.txt"; }

if [ ! -x "$WORK/llama/build/bin/llama-bench" ]; then
    rm -rf "$WORK/llama" && mkdir -p "$WORK/llama"
    tar xJf "$LLAMA_SRC" -C "$WORK/llama" --strip-components=1 || exit 1
    # llama.cpp's own best CPU settings: native instructions (AVX-512-BF16, AMX where the CPU has them)
    cmake -S "$WORK/llama" -B "$WORK/llama/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF > "$OUT/llama-cmake.txt" 2>&1 || { tail -30 "$OUT/llama-cmake.txt"; exit 1; }
    cmake --build "$WORK/llama/build" --target llama-bench -j "$NPROC" > "$OUT/llama-build.txt" 2>&1 ||
        { tail -30 "$OUT/llama-build.txt"; exit 1; }
    say "llama.cpp built"
fi
CKPT=$WORK/$VARIANT
GGUF=$WORK/$VARIANT-bf16.gguf
if [ ! -f "$CKPT/config.json" ]; then
    python3 "$MAKER" "$VARIANT" "$CKPT" --tokenizer-dir "$TOK" > "$OUT/ckpt.txt" 2>&1 || { cat "$OUT/ckpt.txt"; exit 1; }
    say "checkpoint written"
fi
if [ ! -f "$GGUF" ]; then
    python3 "$WORK/llama/convert_hf_to_gguf.py" "$CKPT" --outtype bf16 --outfile "$GGUF" > "$OUT/convert.txt" 2>&1 ||
        { tail -30 "$OUT/convert.txt"; exit 1; }
    say "converted to GGUF"
fi

LB=$WORK/llama/build/bin/llama-bench
# llama-bench: one JSON array a run (pp = prefill of n_prompt, tg = n_gen decoded), mean and stddev of -r
"$LB" -m "$GGUF" -t 16 -p 64,512 -n 32 -r 3 -o json > "$OUT/llama-t16.json" 2> "$OUT/llama-t16.err"
say "llama.cpp 16 threads rc=$?"
taskset -c 0,1 "$LB" -m "$GGUF" -t 2 -p 64 -n 16 -r 2 -o json > "$OUT/llama-t2.json" 2> "$OUT/llama-t2.err"
say "llama.cpp 2 threads rc=$?"
"$MARKBASE" bench -m "$CKPT" --device cpu -p 64 -n 32 -r 3 -t 16 --json-out "$OUT/mb-t16.json" \
    > "$OUT/mb-t16.txt" 2>&1
say "markbase 16 threads rc=$?"
"$MARKBASE" bench -m "$CKPT" --device cpu -p 512 -n 2 -r 3 -t 16 --json-out "$OUT/mb-t16-p512.json" \
    > "$OUT/mb-t16-p512.txt" 2>&1
say "markbase 16 threads, 512 rc=$?"
taskset -c 0,1 "$MARKBASE" bench -m "$CKPT" --device cpu -p 64 -n 16 -r 2 -t 2 --json-out "$OUT/mb-t2.json" \
    > "$OUT/mb-t2.txt" 2>&1
say "markbase 2 threads rc=$?"

python3 - "$OUT" "$VARIANT" <<'EOF'
import json, os, sys, subprocess, datetime
out, variant = sys.argv[1], sys.argv[2]
def load(name):
    try:
        return json.load(open(os.path.join(out, name)))
    except Exception as e:  # a run that failed: its stderr file says why
        return {"error": str(e)}
def llama(name):
    rows = load(name)
    if isinstance(rows, dict):
        return rows
    r = {}
    for row in rows:
        key = f"pp{row['n_prompt']}" if row["n_gen"] == 0 else f"tg{row['n_gen']}"
        r[key] = {"tok_s": row["avg_ts"], "stddev_tok_s": row["stddev_ts"],
                  "ms_per_tok": 1000.0 / row["avg_ts"], "reps": len(row.get("samples_ts", []))}
        r["build"] = row.get("build_commit"), row.get("cpu_info"), row.get("backends")
    return r
cpu = ""
for line in open("/proc/cpuinfo"):
    if line.startswith("model name"):
        cpu = line.split(":", 1)[1].strip(); break
receipt = {
    "kind": "cpu-vs-llama-cpp",
    "device": f"{cpu}, {os.cpu_count()} logical CPUs (the H200 host)",
    "date": datetime.datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ"),
    "commit": os.environ.get("MARKBASE_COMMIT", "unknown"),
    "model": f"{variant}, make_random_ckpt.py seed 1234, bf16; llama.cpp reads its bf16 GGUF conversion",
    "llama_cpp": {"t16": llama("llama-t16.json"), "t2": llama("llama-t2.json"),
                  "commands": {"t16": "llama-bench -t 16 -p 64,512 -n 32 -r 3",
                               "t2": "taskset -c 0,1 llama-bench -t 2 -p 64 -n 16 -r 2"}},
    "markbase": {"t16": load("mb-t16.json"), "t16_p512": load("mb-t16-p512.json"), "t2": load("mb-t2.json"),
                 "commands": {"t16": "bench --device cpu -p 64 -n 32 -r 3 -t 16",
                              "t16_p512": "bench --device cpu -p 512 -n 2 -r 3 -t 16",
                              "t2": "taskset -c 0,1 bench --device cpu -p 64 -n 16 -r 2 -t 2"}},
}
json.dump(receipt, open(os.path.join(out, "cpu-vs-llama-cpp.json"), "w"), indent=1)
print(json.dumps({k: receipt["llama_cpp"][k] for k in ("t16", "t2")}, indent=1)[:3000])
EOF
grep -h -E "prefill|decode" "$OUT"/mb-t*.txt | head -12
