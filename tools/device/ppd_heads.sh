# Second call: PPD's intermediate heads (rule ppdp_train_heads' command with --device cuda and a
# GPU wall budget, $1 s, counted over resumed runs too) and the three match-rate runs that read
# them, side by side. Records go to $OUT; the heads (5 x 113 MB) cannot come back (16 MiB a file).
# A second call with a larger budget while the machine is warm resumes from the checkpoint.
# CODE_VERSION (the commit the tree is at) is set by the caller: the tree travels without .git.
set -x -o pipefail
. tools/device/model.sh
read CFG EXCL LAYERS MODEL CLS < <(python3 tools/device/ppd_args.py heads "$1") || exit 1
python3 -m ppd_pipelined.heads --model $MODEL --layers $LAYERS --out .cache/ppd_pipelined/embedded \
  --log $OUT/heads_train.jsonl --meta-out $OUT/heads_meta.json --curve-out $OUT/heads_curve.jsonl \
  --exclude-datasets $EXCL --config "$CFG" --dtype float32 --device cuda --threads 4 --profile embedded || exit 1
mr() {  # task, number of prompts, max new tokens, max prompt tokens (the embedded profile's ppd_pipelined)
  python3 -m ppd_pipelined.matchrate --model $MODEL --task $1 --prompts results/ppd_pipelined/raw/prompts_$1.jsonl \
    --layers $LAYERS --classifiers $CLS --heads .cache/ppd_pipelined/embedded/heads.pt --method greedy --n $2 \
    --max-new-tokens $3 --max-prompt-tokens $4 --truncate last --dtype float32 --device cuda --threads 4 \
    --profile embedded --out $OUT/matchrate_$1.jsonl > $OUT/mr_$1.log 2>&1
}
while read t n m p; do mr $t $n $m $p & done < <(python3 tools/device/ppd_args.py tasks)
wait
ls -la $OUT
