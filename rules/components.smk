# Trained components shared by several methods. The teacher cache (one teacher-forced pass of
# the base model over ShareGPT text: hidden states, greedy tokens, top-k log-probabilities) is
# what they train on; the self-distillation corpus (the base model's own greedy answers) is
# what they are measured on, held out. Training stops when the held-out curve flattens (or at
# the wall budget). Checkpoints live in the git-ignored cache; statistics and learning curves
# are copied under results/ for the notebooks.
from common.components.medusa_heads import TREE_SIZES
from common.components.eagle_head import TREE_SIZES as EAGLE_TREE_SIZES
from common.workflow.artifacts import CORPORA, corpus_folder, eagle3_recipes
from common.workflow.commands import corpus_command, corpus_flags, eagle3_flags

COMP = f".cache/components/{P.name}"
C = P.raw["components"]
# the settings of a pass over ShareGPT's reference replies (rule teacher_text), where a profile has one
TEACHER_TEXT = {"source": "sharegpt", **C["teacher_text"]} if "teacher_text" in C else None
# the corpus's training shards as text, not passed (rule teacher_answers), where a profile sets it
TEACHER_ANSWERS = ({"source": "corpus", "corpus_tokens": None, "pass_dtype": "none", **C["teacher_answers"]}
                   if "teacher_answers" in C else None)


rule selfdistill_corpus:
    input: model_files()
    output: f"{COMP}/corpus.pt"
    conda: "../env.yml"
    log: f"{LOGS}/selfdistill_corpus.log"
    benchmark: f"{BENCH}/selfdistill_corpus.tsv"
    threads: rule_threads("selfdistill_corpus")
    resources: **rule_resources("selfdistill_corpus")
    params: env=ENV, py=PY, m=P.model, c=C["corpus"], t=P.threads, dev=P.device
    shell:
        answer_set_command("{output}", "{params.c[prompts]}")


rule teacher_cache:
    input: model_files(), **teacher_inputs(C["teacher"])
    output:
        cache=f"{COMP}/teacher.pt",
        stats=f"{ROOT}/cross/raw/teacher_stats.json",
    conda: "../env.yml"
    log: f"{LOGS}/teacher_cache.log"
    benchmark: f"{BENCH}/teacher_cache.tsv"
    threads: rule_threads("teacher_cache")
    resources: **rule_resources("teacher_cache")
    params: env=ENV, py=PY, m=P.model, t=P.threads, dev=P.device, flags=teacher_flags(C["corpus"], C["teacher"])
    shell:
        teacher_command()


# The same pass over ShareGPT's reference replies (BiLD's unaligned small model learns the
# references, as the paper fine-tunes on them): the teacher settings with source sharegpt.
if TEACHER_TEXT:
    rule teacher_text:
        input: model_files(), **teacher_inputs(TEACHER_TEXT)
        output: cache=f"{COMP}/teacher_text.pt", stats=f"{COMP}/teacher_text_stats.json"
        conda: "../env.yml"
        log: f"{LOGS}/teacher_text.log"
        benchmark: f"{BENCH}/teacher_text.tsv"
        threads: rule_threads("teacher_cache")
        resources: **rule_resources("teacher_cache")
        params: env=ENV, py=PY, m=P.model, t=P.threads, dev=P.device, flags=teacher_flags(C["corpus"], TEACHER_TEXT)
        shell:
            teacher_command()


# The corpus's training shards as a text set (their answers are the model's own greedy tokens:
# BiLD's aligned small model learns them with text labels, as the paper fine-tunes on the large
# model's generated outputs): no pass over them, only the held-out shard's (minutes, not hours).
if TEACHER_ANSWERS:
    rule teacher_answers:
        input: model_files(), **teacher_inputs(TEACHER_ANSWERS)
        output: cache=f"{COMP}/teacher_answers.pt", stats=f"{COMP}/teacher_answers_stats.json"
        conda: "../env.yml"
        log: f"{LOGS}/teacher_answers.log"
        benchmark: f"{BENCH}/teacher_answers.tsv"
        threads: rule_threads("teacher_cache")
        resources: **rule_resources("teacher_cache")
        params: env=ENV, py=PY, m=P.model, t=P.threads, dev=P.device, flags=teacher_flags(C["corpus"], TEACHER_ANSWERS)
        shell:
            teacher_command()


rule train_medusa:
    input: teacher=f"{COMP}/teacher.pt", **teacher_inputs(C["teacher"])
    output:
        heads=f"{COMP}/medusa/heads.pt",
        trees=[f"{COMP}/medusa/tree_{n}.json" for n in TREE_SIZES],
        stats=f"{ROOT}/cross/raw/medusa_stats.json",
        curve=f"{ROOT}/cross/raw/medusa_curve.jsonl",
    conda: "../env.yml"
    log: f"{LOGS}/train_medusa.log"
    benchmark: f"{BENCH}/train_medusa.tsv"
    threads: rule_threads("train_medusa")
    resources: **rule_resources("train_medusa")
    params:
        env=ENV, py=PY, m=P.model, t=P.threads, dev=P.device, out=parent_of_heads,
        teacher=teacher_flags(C["corpus"], C["teacher"]), heads=head_train_flags(C["medusa"]),
    shell:
        "{params.env} {params.py} -m common.components.medusa_heads --model {params.m} --teacher {input.teacher}"
        " {params.teacher} --out {params.out}"
        " --stats-out {output.stats} --curve-out {output.curve} {params.heads}"
        " --device {params.dev} --threads {params.t} > {log} 2>&1"


rule distill_draft:
    input: teacher=f"{COMP}/teacher.pt", **teacher_inputs(C["teacher"])
    output:
        model=f"{COMP}/draft/model/config.json",
        stats=f"{ROOT}/cross/raw/draft_stats.json",
        curve=f"{ROOT}/cross/raw/draft_curve.jsonl",
    conda: "../env.yml"
    log: f"{LOGS}/distill_draft.log"
    benchmark: f"{BENCH}/distill_draft.tsv"
    threads: rule_threads("distill_draft")
    resources: **rule_resources("distill_draft")
    params:
        env=ENV, py=PY, m=P.model, d=C["draft"], t=P.threads, dev=P.device, out=parent_of_draft,
        teacher=teacher_flags(C["corpus"], C["teacher"]), stop=stopping_flags(C["draft"]),
    shell:
        "{params.env} {params.py} -m common.components.draft_model --model {params.m} --teacher {input.teacher}"
        " {params.teacher} --out {params.out}"
        " --stats-out {output.stats} --curve-out {output.curve} --layers {params.d[layers]} {params.stop}"
        " --lr {params.d[lr]} --batch-size {params.d[batch_size]} --device {params.dev} --threads {params.t} > {log} 2>&1"


# The in-forward trainers' data (prompt tokens, FIRP's maps): the base model's greedy answers to
# the ShareGPT prompts after the held-out ones (common.training.seqtrain). One rule, so two trainers
# running at once never build the same cache.
rule seq_corpus:
    input: model_files()
    output: f"{COMP}/seqcorpus.pt"
    conda: "../env.yml"
    log: f"{LOGS}/seq_corpus.log"
    benchmark: f"{BENCH}/seq_corpus.tsv"
    threads: rule_threads("seq_corpus")
    resources: **rule_resources("seq_corpus")
    params: env=ENV, py=PY, m=P.model, c=C["corpus"], s=C["seqcorpus"], t=P.threads, dev=P.device
    shell:
        answer_set_command("{output}", "{params.s[prompts]}", skip="{params.c[prompts]}",
                           max_prompt_tokens="{params.s[max_prompt_tokens]}")


# The authors' released components (the profile's `released`: a folder or hub id each), converted
# into this repository's folders by common.components.released_heads, so decoders run them beside the ones trained
# above (placeholders {medusa_released}, {prompt_tokens_released}). Medusa's trees are built for
# the released heads' accuracies on the teacher cache's held-out answers, as after training.
RELEASED = P.raw.get("released") or {}
for _kind, _key in (("medusa", "{medusa_released}"), ("prompt_tokens", "{prompt_tokens_released}")):
    if not RELEASED.get(_kind) and any(_key in json.dumps(group_config(P, g)) for g in P.cross.groups):
        print(f"error: profile {P.name!r}: a cross group runs {_key} but released.{_kind} names no source; "
              f"valid: released: {{{_kind}: <the authors' folder or hub id>}}", file=sys.stderr)
        sys.exit(2)

if RELEASED.get("medusa"):
    rule released_medusa:
        input: model_files(), teacher=f"{COMP}/teacher.pt"
        output:
            heads=f"{COMP}/medusa_released/heads.pt",
            trees=[f"{COMP}/medusa_released/tree_{n}.json" for n in TREE_SIZES],
        conda: "../env.yml"
        log: f"{LOGS}/released_medusa.log"
        benchmark: f"{BENCH}/released_medusa.tsv"
        threads: rule_threads("released_medusa")
        resources: **rule_resources("released_medusa")
        params: env=ENV, py=PY, m=P.model, src=RELEASED["medusa"], out=parent_of_heads, dt=P.dtype, dev=P.device
        shell:
            "{params.env} {params.py} -m common.components.released_heads medusa --src {params.src} --model {params.m}"
            " --teacher {input.teacher} --out {params.out} --dtype {params.dt} --device {params.dev} > {log} 2>&1"

if RELEASED.get("prompt_tokens"):
    rule released_prompt_tokens:
        input: model_files()
        output: prompts=f"{COMP}/prompt_tokens_released/prompts.pt"
        conda: "../env.yml"
        log: f"{LOGS}/released_prompt_tokens.log"
        benchmark: f"{BENCH}/released_prompt_tokens.tsv"
        threads: rule_threads("released_prompt_tokens")
        resources: **rule_resources("released_prompt_tokens")
        params: env=ENV, py=PY, m=P.model, src=RELEASED["prompt_tokens"], dt=P.dtype, dev=P.device, out=parent_of_prompts
        shell:
            "{params.env} {params.py} -m prompt_decoding.released --src {params.src} --model {params.m}"
            " --out {params.out} --dtype {params.dt} --device {params.dev} > {log} 2>&1"


# The sharded self-distillation corpora (common.training.corpus): the model's own greedy answers, resumable
# by shard; the embedded profile's shards are committed under results/corpus/. corpus_shards answers ShareGPT
# first turns (what the components trained on so far); corpus_turns every human turn with its conversation
# so far, longer answers (issue #78's larger corpus, what EAGLE-3 trains on). A rule's output is the summary,
# not the manifest, so a rerun never deletes what it resumes from. Its input is the converted model only
# while the corpus is still to be made (corpus_inputs: a fresh clone's conversion never replans it).
CORPUS = f"{ROOT}/{corpus_folder(P, 'shards')}"

for _rule, _folder in CORPORA.values():
    if _rule not in C:
        continue
    _folder = f"{ROOT}/{_folder.format(profile=P.name)}"
    rule:
        name: _rule
        input: corpus_inputs(_folder)
        output: stats=f"{_folder}/stats.json"
        conda: "../env.yml"
        log: f"{LOGS}/{_rule}.log"
        benchmark: f"{BENCH}/{_rule}.tsv"
        threads: rule_threads(_rule)
        resources: **rule_resources(_rule)
        params: env=ENV, py=PY, m=P.model, t=P.threads, dev=P.device, flags=corpus_flags(C[_rule]), out=parent_of_stats
        shell: corpus_command()


rule train_eagle:
    input: teacher=f"{COMP}/teacher.pt", **teacher_inputs(C["teacher"])
    output:
        head=f"{COMP}/eagle/head.pt",
        trees=[f"{COMP}/eagle/tree_{n}.json" for n in (8, 16, 32, 63)],
        stats=f"{ROOT}/cross/raw/eagle_stats.json",
        curve=f"{ROOT}/cross/raw/eagle_curve.jsonl",
    conda: "../env.yml"
    log: f"{LOGS}/train_eagle.log"
    benchmark: f"{BENCH}/train_eagle.tsv"
    threads: rule_threads("train_eagle")
    resources: **rule_resources("train_eagle")
    params:
        env=ENV, py=PY, m=P.model, t=P.threads, dev=P.device, out=parent_of_head,
        teacher=teacher_flags(C["corpus"], C["teacher"]), flags=eagle_flags(C["eagle"]),
    shell:
        "{params.env} {params.py} -m common.components.eagle_head --model {params.m} --teacher {input.teacher} {params.teacher}"
        " --out {params.out}"
        " {params.flags} --stats-out {output.stats} --curve-out {output.curve}"
        " --device {params.dev} --threads {params.t} > {log} 2>&1"


# EAGLE-3's heads (common.components.eagle3_head) read a sharded corpus themselves, not a teacher
# cache: each batch runs the frozen model for its fused layers' inputs (three layers' features of
# the whole corpus would take 17-35 GB). Each is trained until its held-out curve flattens, its step
# cap or its wall budget; resumable from its checkpoint. eagle3 and the ablation's variants
# (components.eagle3_variants: eagle3_recipes), each its own component "{name}".
for _name, _recipe in eagle3_recipes(P).items():
    rule:
        name: f"train_{_name}"
        input: model_files(), corpus=f"{ROOT}/{corpus_folder(P, _recipe['corpus'])}/stats.json"
        output:
            head=f"{COMP}/{_name}/head.pt",
            trees=[f"{COMP}/{_name}/tree_{n}.json" for n in EAGLE_TREE_SIZES],
            stats=f"{ROOT}/cross/raw/{_name}_stats.json",
            curve=f"{ROOT}/cross/raw/{_name}_curve.jsonl",
        conda: "../env.yml"
        log: f"{LOGS}/train_{_name}.log"
        benchmark: f"{BENCH}/train_{_name}.tsv"
        # every variant is the same kind of job: train_eagle3's resource class and overrides
        threads: rule_threads("train_eagle3")
        resources: **rule_resources("train_eagle3")
        params:
            env=ENV, py=PY, m=P.model, t=P.threads, dev=P.device, out=parent_of_head, corpus=corpus_of,
            flags=eagle3_flags(_recipe),
        shell:
            "{params.env} {params.py} -m common.components.eagle3_head --model {params.m} --corpus-dir {params.corpus}"
            " --out {params.out} {params.flags} --stats-out {output.stats} --curve-out {output.curve}"
            " --device {params.dev} --threads {params.t} > {log} 2>&1"