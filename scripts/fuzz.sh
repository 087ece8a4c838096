#!/usr/bin/env bash
# Builds the libFuzzer harnesses (fuzz/, clang, AddressSanitizer + UBSan) in build-fuzz/ and runs each one for
# SECONDS from its seed corpus, all at once (one process per harness):
#   bash scripts/fuzz.sh [SECONDS] [HARNESS...]      (default 60 s, every harness)
# The seeds (fuzz/corpus/NAME) are copied: new inputs gather in build-fuzz/corpus/NAME, the repository's corpus is
# left alone. A crash, a sanitizer report, a leak, a timeout (10 s for one input) or running out of memory
# fails the run; the input that did it is kept in build-fuzz/findings/NAME/. Prints per harness: executions,
# coverage (libFuzzer's cov/ft) and corpus size. MARKBASE_FUZZ_SKIP_BUILD=1 runs what is built already.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
all=(config_json generation_config safetensors safetensors_index tokenizer_json chat cli_args)
names=("${@:-${all[@]}}")
if [ "${MARKBASE_FUZZ_SKIP_BUILD:-0}" != 1 ]; then
  cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DMARKBASE_FUZZ=ON -DMARKBASE_CUDA=OFF -DMARKBASE_TESTS=OFF >/dev/null
  cmake --build build-fuzz -j "$(nproc)" --target "${names[@]/#/fuzz_}"
fi

pids=()
for n in "${names[@]}"; do
  mkdir -p "build-fuzz/corpus/$n" "build-fuzz/findings/$n"
  cp -n "fuzz/corpus/$n"/* "build-fuzz/corpus/$n"/ 2>/dev/null || true
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "./build-fuzz/fuzz_$n" "build-fuzz/corpus/$n" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -max_len=65536 -print_final_stats=1 -artifact_prefix="build-fuzz/findings/$n/" >"build-fuzz/$n.log" 2>&1 &
  pids+=($!)
done
failed=0
printf '%-18s %12s %8s %8s %8s  %s\n' harness executions cov ft corpus result
for i in "${!names[@]}"; do
  n=${names[$i]}
  if wait "${pids[$i]}"; then result=ok; else result="FAILED (build-fuzz/$n.log)"; failed=1; fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "build-fuzz/$n.log" | tail -1)
  done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "build-fuzz/$n.log" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$done_line")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$done_line")
  corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$done_line")
  printf '%-18s %12s %8s %8s %8s  %s\n' "$n" "${execs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$result"
done
if [ "$failed" != 0 ]; then
  for n in "${names[@]}"; do grep -E -m3 "ERROR|SUMMARY|Test unit written" "build-fuzz/$n.log" || true; done
  exit 1
fi
