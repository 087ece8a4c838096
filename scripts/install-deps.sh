#!/usr/bin/env bash
# Installs MarkBase's build and test dependencies on Debian 12 from Debian's own packages, by name.
#   build-essential, cmake, ninja-build  the C++20 toolchain and build system (CMake >= 3.25 is Debian 12's)
#   nlohmann-json3-dev                   header-only JSON for config.json, safetensors headers, tokenizer.json
#   libgtest-dev                         GoogleTest, the test framework
#   xz-utils                             unpacks the compressed tokenizer fixtures under tests/data
#   python3                              the test scripts' small helpers (no third-party modules)
#   clang, libclang-rt-14-dev            the fuzzers (fuzz/, scripts/fuzz.sh): clang's libFuzzer and sanitizer runtimes
#   libcpp-httplib-dev, pkg-config       cpp-httplib (llama-server's HTTP library), markbase serve's HTTP server, and
#                                        what finds it for CMake
#   dpkg-dev                             dpkg-shlibdeps, with which `cpack` declares the .deb's library Depends
#                                        (scripts/package-test.sh; build-essential pulls it in too)
#   nodejs, npm                          the openai npm client's tests of markbase serve (tests/server/js); npm is
#                                        left out where the installed nodejs already bundles it (NodeSource's does)
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
pkgs=(build-essential cmake ninja-build nlohmann-json3-dev libgtest-dev xz-utils python3 clang libclang-rt-14-dev
  libcpp-httplib-dev pkg-config dpkg-dev nodejs)
command -v npm >/dev/null 2>&1 || pkgs+=(npm)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
