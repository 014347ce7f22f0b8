# Trained components shared by several methods: the self-distillation corpus (the base model's
# own answers), Medusa heads (+ trees), the distilled draft model. Checkpoints live in the
# git-ignored cache; their statistics are copied under results/ for the notebooks.
from common.medusa import TREE_SIZES

COMP = f".cache/components/{P.name}"
C = P.raw["components"]


rule selfdistill_corpus:
    input: model_files()
    output: f"{COMP}/corpus.pt"
    conda: "../env.yml"
    log: f"{LOGS}/selfdistill_corpus.log"
    benchmark: f"{BENCH}/selfdistill_corpus.tsv"
    threads: rule_threads("selfdistill_corpus")
    resources: **rule_resources("selfdistill_corpus")
    params: env=ENV, py=PY, m=P.model, c=C["corpus"], t=P.threads
    shell:
        "{params.env} {params.py} -m common.selfdistill --model {params.m} --out {output}"
        " --prompts {params.c[prompts]} --answer-tokens {params.c[answer_tokens]} --threads {params.t} > {log} 2>&1"


rule train_medusa:
    input: f"{COMP}/corpus.pt"
    output:
        heads=f"{COMP}/medusa/heads.pt",
        trees=[f"{COMP}/medusa/tree_{n}.json" for n in TREE_SIZES],
        stats=f"{ROOT}/cross/raw/medusa_stats.json",
    conda: "../env.yml"
    log: f"{LOGS}/train_medusa.log"
    benchmark: f"{BENCH}/train_medusa.tsv"
    threads: rule_threads("train_medusa")
    resources: **rule_resources("train_medusa")
    params:
        env=ENV, py=PY, m=P.model, c=C["corpus"], h=C["medusa"], t=P.threads, out=parent_of_heads,
        share="--share-lm-head" if C["medusa"].get("share_lm_head") else "",
    shell:
        "{params.env} {params.py} -m common.medusa --model {params.m} --corpus {input} --out {params.out}"
        " --stats-out {output.stats} --heads {params.h[heads]} --holdout {params.h[holdout]} {params.share}"
        " --epochs {params.h[epochs]} --lr {params.h[lr]} --batch-size {params.h[batch_size]}"
        " --prompts {params.c[prompts]} --answer-tokens {params.c[answer_tokens]} --threads {params.t} > {log} 2>&1"


rule distill_draft:
    input: f"{COMP}/corpus.pt"
    output:
        model=f"{COMP}/draft/model/config.json",
        stats=f"{ROOT}/cross/raw/draft_stats.json",
    conda: "../env.yml"
    log: f"{LOGS}/distill_draft.log"
    benchmark: f"{BENCH}/distill_draft.tsv"
    threads: rule_threads("distill_draft")
    resources: **rule_resources("distill_draft")
    params: env=ENV, py=PY, m=P.model, c=C["corpus"], d=C["draft"], t=P.threads, out=parent_of_draft
    shell:
        "{params.env} {params.py} -m common.draft --model {params.m} --corpus {input} --out {params.out}"
        " --stats-out {output.stats} --layers {params.d[layers]} --epochs {params.d[epochs]}"
        " --lr {params.d[lr]} --batch-size {params.d[batch_size]}"
        " --prompts {params.c[prompts]} --answer-tokens {params.c[answer_tokens]} --threads {params.t} > {log} 2>&1"
