"""Table 1's prompts on the profile's data, written once as a prompt file both runs read.

The templates are :data:`TEMPLATES` (``ppdp-squad``, ``ppdp-wmt``, ``ppdp-cnn_dm``, the
paper's text verbatim). This module fills their fields
from a dataset sample and writes the rendered prompts as an MT-Bench-format JSONL, so the
match-rate runs (:mod:`ppd_pipelined.matchrate`) and the Table 3 benchmark
(``common.harness.bench --prompts``) see the same prompt text. Each record also names the template,
its text, the dataset and how the fields were filled (what ``ppdp.table1`` prints).

    python -m ppd_pipelined.templates --task squad --dataset mt-bench --template ppdp-squad \
        --n 20 --out results/ppd_pipelined/raw/prompts_squad.jsonl

Field sources (``FIELD_RULES``): the paper's hub sets give the fields directly (SQuAD's
context and question, the WMT English sentence, the CNN/DM article). The offline stand-ins:
for SQuAD a sample with a reference answer gives ``context`` = the reference and ``question``
= the first turn (MT-Bench's 30 questions with a reference: a context-grounded QA); for WMT
and CNN/DM the whole first human turn of the mined ShareGPT set is the source sentence /
article (it carries its own "translate into ..." / "summarize ..." request).
"""
from __future__ import annotations

import argparse
import string
from pathlib import Path

from common.assets.data import PAPER_DATASETS, Sample, load_dataset_samples
from common.errors import UserError, check_range, cli_main, unknown
from common.records import JsonlWriter

# Table 1 of the paper, verbatim.
TEMPLATES: dict[str, str] = {
    "ppdp-squad": ("We have provided context information below.\n———————\n{context}\n———————\n"
                   "### Given this information, please answer the question: {question}\n### Assistant:"),
    "ppdp-wmt": ("### Instruction: Translate English sentence into French.\n"
                 "English: Sounds like a typical rugby club to me.\n"
                 "French: Ça m’a l’air d’être un club de rugby typique. #\n"
                 "English: At an English university, perhaps…\n"
                 "French: Dans une université anglaise, peut-être… #\n"
                 "English: {source_sentence}\nFrench:"),
    "ppdp-cnn_dm": "# Article\n{context}\n# Summarize the article\n### Assistant:",
}

PAPER_DATA = {"squad": "squad", "wmt": "wmt14-en-fr", "cnn_dm": "cnn_dm"}  # task -> the paper's set
FIELD_RULES = {
    ("squad", "hub"): "context and question from SQuAD 1.1 validation",
    ("squad", "stand-in"): "context = the sample's reference answer, question = its first turn "
                           "(samples without a reference are skipped)",
    ("wmt", "hub"): "source_sentence = the English sentence of WMT14 fr-en test",
    ("wmt", "stand-in"): "source_sentence = the whole first human turn (its own translation request)",
    ("cnn_dm", "hub"): "context = the CNN/DM article",
    ("cnn_dm", "stand-in"): "context = the whole first human turn (its own 'Summarize ...' request)",
}


def template_fields(template: str) -> list[str]:
    """Field names of a registered template, in order."""
    if template not in TEMPLATES:
        raise unknown("prompt template", template, TEMPLATES)
    return [f for _, f, _, _ in string.Formatter().parse(TEMPLATES[template]) if f]


def fields_for(task: str, sample: Sample) -> dict | None:
    """The template fields for one sample, or None when the sample cannot fill them."""
    text = sample.turns[0]
    hub = sample.category in PAPER_DATASETS
    if task == "squad":
        if hub:  # common.assets.data joins SQuAD's context and question with a blank line
            context, _, question = text.rpartition("\n\n")
            return {"context": context, "question": question} if context else None
        return {"context": sample.reference, "question": text} if sample.reference else None
    if task == "wmt":
        return {"source_sentence": text}
    if task == "cnn_dm":
        return {"context": text}
    raise unknown("task", task, PAPER_DATA)


def render_task(task: str, template: str, sample: Sample) -> str | None:
    """Fill ``template`` for one sample (None: the sample has no such fields)."""
    fields = fields_for(task, sample)
    if fields is None:
        return None
    need = template_fields(template)
    missing = [f for f in need if f not in fields]
    if missing:
        raise UserError(f"template {template!r} needs field(s) {', '.join(missing)}, which task {task!r} "
                        f"does not provide; provides: {', '.join(fields)}")
    return TEMPLATES[template].format(**{f: fields[f] for f in need})


def build_prompts(task: str, dataset: str, template: str, n: int) -> list[dict]:
    """The first ``n`` usable samples of ``dataset`` rendered with ``template``, as records."""
    check_range("n", n, 1)
    if task not in PAPER_DATA:
        raise unknown("task", task, PAPER_DATA)
    template_fields(template)  # unknown template -> UserError before loading data
    hub = dataset in PAPER_DATASETS
    rule = FIELD_RULES[(task, "hub" if hub else "stand-in")]
    # SQuAD stand-ins skip samples without a reference, so read them all and take n usable.
    samples = load_dataset_samples(dataset, n=None if (task == "squad" and not hub) else n)
    out = []
    for s in samples:
        text = render_task(task, template, s)
        if text is None:
            continue
        out.append({"question_id": s.question_id, "category": task, "turns": [text],
                    "task": task, "dataset": dataset, "paper_dataset": PAPER_DATA[task],
                    "stand_in": dataset != PAPER_DATA[task], "template": template,
                    "template_text": TEMPLATES[template], "fields_rule": rule, "source": s.source})
        if len(out) == n:
            break
    if not out:
        raise UserError(f"dataset {dataset!r} has no sample that fills template {template!r} ({rule})")
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="render Table 1's prompts into an MT-Bench-format JSONL")
    ap.add_argument("--task", required=True, choices=sorted(PAPER_DATA))
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--template", required=True)
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    records = build_prompts(a.task, a.dataset, a.template, a.n)
    with JsonlWriter(a.out) as w:
        for r in records:
            w.write(r)
    print(f"{len(records)} prompts -> {a.out}")


if __name__ == "__main__":
    cli_main(main)
