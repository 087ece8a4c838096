#!/usr/bin/env bash
# Installs the dependencies (Debian 12, as root), builds MarkBase and runs the main job on the bundled model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMARKBASE_TESTS=OFF
cmake --build build -j "$(nproc)"
# The bundled model (models/default: a tiny Gemma 4 trained on public-domain text by
# tools/train_default_model.py) is used when no -m is given.
./build/markbase run -p "And God said" -n 64 --temp 0
./build/markbase run --chat -p "Who are you?" -n 48 --temp 0
