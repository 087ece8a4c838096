#!/usr/bin/env bash
# Installs the dependencies (Debian 12, as root), builds MarkBase and runs the whole test suite:
# a Release build (what users run), the openai npm client against a live server, the Debian package built from
# that build (installed, run and removed: scripts/package-test.sh), an AddressSanitizer + UBSan
# build of the tests, and a short run of every fuzzer (docs/testing.md).
# GPU tests skip, with their reason printed, on machines without a CUDA device.
# Either pass fails when it runs no test: a build folder configured without the tests (scripts/run-default.sh
# configures `build` with MARKBASE_TESTS=OFF) is reconfigured with them, and a count of zero is an error.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
jobs=$(nproc)

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMARKBASE_TESTS=ON
cmake --build build -j "$jobs"
(cd build && ctest --output-on-failure --no-tests=error -j "$jobs" --timeout 900 | tee ctest.log)
release=$(sed -n 's/.*tests passed, \([0-9]*\) tests failed out of \([0-9]*\)$/\2 \1/p' build/ctest.log)
skipped=$(grep -c '(Skipped)$' build/ctest.log || true)
read -r release_total release_failed <<<"${release:-0 0}"
if [ "$release_total" -eq 0 ]; then
  echo "error: the Release pass ran no test" >&2
  exit 1
fi

# the official openai npm client against a live server (skipped, saying why, in a build without cpp-httplib)
bash scripts/openai-client-test.sh build | tee build/openai-client.log
openai_client=$(grep -q '^openai client tests: SKIPPED' build/openai-client.log && echo skipped || echo passed)
js_passed=$(sed -n 's/^# pass \([0-9]*\)$/\1/p' build/openai-client.log | tail -n 1)

# the Debian package from this build: cpack, dpkg -i, the installed binary's commands, dpkg -r (skipped,
# saying why, when not root or without dpkg)
bash scripts/package-test.sh build | tee build/package-test.log
package=$(grep -q '^package test: SKIPPED' build/package-test.log && echo skipped || echo passed)
package_passed=$([ "$package" = passed ] && echo 1 || echo 0)

asan_total=0 asan_skipped=0
if [ "${MARKBASE_SKIP_SANITIZERS:-0}" != 1 ]; then
  # the host code of the CUDA backend's tests is sanitized too; its device code comes from the Release build
  cuda=(-DMARKBASE_CUDA=OFF -DMARKBASE_CUDA_OBJECTS_FROM=)
  if [ -d build/CMakeFiles/markbase_cuda.dir ]; then cuda=(-DMARKBASE_CUDA_OBJECTS_FROM="$PWD/build"); fi
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMARKBASE_SANITIZE=ON "${cuda[@]}" \
    -DMARKBASE_TESTS=ON
  cmake --build build-asan -j "$jobs" --target markbase_tests
  rm -f build-asan/gtest.json
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ./build-asan/markbase_tests --gtest_brief=1 --gtest_output=json:build-asan/gtest.json \
    ${MARKBASE_ASAN_FILTER:+--gtest_filter="$MARKBASE_ASAN_FILTER"}
  # tests run, and of them skipped (GPU tests without a GPU)
  read -r asan_total asan_skipped < <(python3 -c '
import json, sys
cases = [t for s in json.load(open(sys.argv[1]))["testsuites"] for t in s["testsuite"]]
print(sum(t.get("status") == "RUN" for t in cases), sum(t.get("result") == "SKIPPED" for t in cases))
' build-asan/gtest.json)
  if [ "$asan_total" -eq 0 ]; then
    echo "error: the sanitizer pass ran no test" >&2
    exit 1
  fi
fi
# a short run of every fuzzer (scripts/fuzz.sh; a long one is a separate job)
fuzz_total=0
if [ "${MARKBASE_SKIP_FUZZ:-0}" != 1 ]; then
  bash scripts/fuzz.sh "${MARKBASE_FUZZ_SECONDS:-30}"
  fuzz_total=$(ls fuzz/corpus | wc -l)
fi
echo "Release: $release_total tests ($skipped skipped); openai client: $openai_client (${js_passed:-0} tests);" \
  "package: $package; sanitizers: $asan_total tests ($asan_skipped skipped); fuzzers: $fuzz_total"
passed=$((release_total - skipped - release_failed + ${js_passed:-0} + package_passed + asan_total - asan_skipped +
  fuzz_total))
echo "markbase: $passed passed, $release_failed failed, $((skipped + asan_skipped)) skipped"
