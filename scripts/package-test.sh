#!/usr/bin/env bash
# The Debian package end to end: `cpack` in BUILD_DIR (an existing build: nothing is compiled again),
# `dpkg -i`, then the installed /usr/bin/markbase, run from a temporary folder outside the source tree with
# nothing copied from it: --version, `run -p Hello -n 8` and `inspect`, each output checked; then `dpkg -r`.
# Where a private mount namespace can be made (unshare), the source tree's models/default is hidden from
# those runs, so the installed binary can only find the model the package put under /usr/share/markbase; a
# copy of the binary with no model beside it must then fail with the -m DIR / MARKBASE_MODEL advice.
# Usage: scripts/package-test.sh BUILD_DIR
# Skips, saying why, when not root or without dpkg (installing a package needs both).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
if [ "$(id -u)" -ne 0 ]; then
  echo "package test: SKIPPED: not root (dpkg -i needs root)"
  exit 0
fi
if ! command -v dpkg >/dev/null 2>&1 || ! command -v dpkg-deb >/dev/null 2>&1; then
  echo "package test: SKIPPED: no dpkg on this system (not Debian-like)"
  exit 0
fi
if dpkg -s markbase >/dev/null 2>&1; then
  echo "error: a markbase package is installed already; remove it first (dpkg -r markbase)" >&2
  exit 1
fi
fail() {
  echo "error: package test: $*" >&2
  exit 1
}
[ -f "${build}/CMakeCache.txt" ] || fail "$build is not a configured build folder"
build=$(cd "$build" && pwd)

version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")
deb="$build/markbase_${version}_$(dpkg --print-architecture).deb"
rm -f "$deb"
# cpack packs what the build folder holds (with Ninja it builds nothing): bring the binary up to date first, a
# no-op after scripts/test.sh's build
cmake --build "$build" --target markbase >/dev/null
(cd "$build" && cpack -G DEB >cpack.log 2>&1) || { cat "$build/cpack.log" >&2; fail "cpack failed"; }
[ -f "$deb" ] || fail "cpack made no $deb"
contents=$(dpkg-deb -c "$deb")
for f in ./usr/bin/markbase ./usr/share/markbase/models/default/config.json \
  ./usr/share/markbase/models/default/model.safetensors ./usr/share/markbase/models/default/tokenizer.json; do
  grep -q " $f\$" <<<"$contents" || fail "$deb lacks $f"
done
depends=$(dpkg-deb -f "$deb" Depends)
echo "package: $deb, Depends: ${depends:-(none)}"
if grep -q '^MARKBASE_HTTPLIB_FOUND:INTERNAL=1' "$build/CMakeCache.txt" && command -v dpkg-shlibdeps >/dev/null; then
  grep -q 'libcpp-httplib' <<<"$depends" || fail "Depends does not name cpp-httplib's library package"
fi

tmp=$(mktemp -d)
cleanup() {
  dpkg -r markbase >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT
dpkg -i "$deb"
cd "$tmp"
# the source tree the binary was built from, whose models/default it would fall back to
src_models="$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt")/models/default"
# Runs its arguments with the source tree's models hidden where a mount namespace can be made, else as is.
hidden=0
# shellcheck disable=SC2016 # "$1" and "$@" are the inner shell's
if unshare --mount sh -c 'mount -t tmpfs markbase-hidden "$1"' sh "$src_models" 2>/dev/null; then hidden=1; fi
# shellcheck disable=SC2016
isolated() {
  if [ "$hidden" = 1 ]; then
    unshare --mount sh -c 'mount -t tmpfs markbase-hidden "$1" && [ ! -e "$1/config.json" ] && shift && exec "$@"' \
      sh "$src_models" "$@"
  else
    "$@"
  fi
}
unset MARKBASE_MODEL MARKBASE_DEVICE

isolated /usr/bin/markbase --version >version.out || fail "markbase --version failed"
cat version.out
grep -q "^markbase $version\$" version.out || fail "--version does not say markbase $version"
grep -q '^default model: /usr/share/markbase/models/default$' version.out ||
  fail "the installed binary does not resolve the model under /usr/share/markbase"

isolated /usr/bin/markbase run -p "Hello" -n 8 >run.out 2>run.err || { cat run.err >&2; fail "markbase run failed"; }
echo "run: $(cat run.out)"
grep -q '^Hello.' run.out || fail "run's output does not continue the prompt: $(cat run.out)"
grep -q 'decode [0-9]* tok' run.err || fail "run printed no receipt: $(cat run.err)"

isolated /usr/bin/markbase inspect >inspect.out 2>&1 || { cat inspect.out >&2; fail "markbase inspect failed"; }
grep -q '^model        /usr/share/markbase/models/default$' inspect.out ||
  fail "inspect did not load the installed model: $(head -n 1 inspect.out)"
grep -q '^layer plan:' inspect.out || fail "inspect printed no layer plan"

if [ "$hidden" = 1 ]; then
  # a binary with no model beside it and none in the source tree: the advice, not a crash
  mkdir -p alone/bin && cp /usr/bin/markbase alone/bin/
  status=0
  isolated alone/bin/markbase inspect >alone.out 2>&1 || status=$?
  if [ "$status" -ne 1 ] || ! grep -q 'pass -m DIR .* or set MARKBASE_MODEL' alone.out; then
    fail "without any bundled model: exit $status, $(cat alone.out)"
  fi
  echo "package test: the source tree's models were hidden from the installed binary"
else
  echo "package test: no mount namespace here: the source tree's models stayed visible (the resolved path was checked)"
fi
cd - >/dev/null
dpkg -r markbase >/dev/null
! dpkg -s markbase >/dev/null 2>&1 || fail "dpkg -r left markbase installed"
[ ! -e /usr/bin/markbase ] || fail "dpkg -r left /usr/bin/markbase"
echo "package test: passed ($deb installed, run, removed)"
