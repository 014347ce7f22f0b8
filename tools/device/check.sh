# First call (carry .dev/p1 .dev/whl): park the GGUF's first part while the machine stays warm
# (30 s after a call), and check that the project imports with the image's torch/transformers.
set -x
mkdir -p /tmp/keep && cp .dev/p1 /tmp/keep/p1
. tools/device/env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv
python3 -c "import transformers, torch; print(transformers.__version__, torch.__version__, torch.cuda.is_available())"
python3 -c "from transformers import GgufConfig; import gguf, jsonschema; import ppd_pipelined.heads, ppd_pipelined.matchrate, common.assets.models; print('imports ok')"
python3 -c "from common.hardware import describe; print(describe('cuda'))"
