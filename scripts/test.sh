#!/usr/bin/env bash
# Installs the dependencies (Debian 12, as root), builds MarkBase and runs the whole test suite:
# a Release build (what users run) and an AddressSanitizer + UBSan build of the tests.
# GPU tests skip, with their reason printed, on machines without a CUDA device.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
jobs=$(nproc)

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$jobs"
(cd build && ctest --output-on-failure -j "$jobs" --timeout 900)

if [ "${MARKBASE_SKIP_SANITIZERS:-0}" != 1 ]; then
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMARKBASE_SANITIZE=ON -DMARKBASE_CUDA=OFF
  cmake --build build-asan -j "$jobs" --target markbase_tests
  # the sanitizer pass skips the slowest numeric tests, which the Release pass has already run
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ./build-asan/markbase_tests --gtest_brief=1 --gtest_filter="${MARKBASE_ASAN_FILTER:--*Bench*}"
fi
echo "all tests passed"
