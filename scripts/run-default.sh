#!/usr/bin/env bash
# Installs the dependencies (Debian 12, as root), builds MarkBase and runs the main job on the bundled model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMARKBASE_TESTS=OFF
cmake --build build -j "$(nproc)"
# Until a trained default model is bundled, the main job is greedy generation on the tiny 26B-A4B-like
# checkpoint whose outputs tests/ checks against transformers.
./build/markbase inspect -m tests/data/models/26b-flat
./build/markbase run -m tests/data/models/26b-flat --ids 2,17,300,41,5 -n 16 --temp 0 --json
