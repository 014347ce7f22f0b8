"""Export benchmark records in Spec-Bench's answer format, so its own scripts read our outputs.

Spec-Bench (Xia et al., 2024) keeps one JSONL per method and model; its ``evaluation/speed.py``
reads, per line, ``category`` and ``choices[0]``'s ``new_tokens`` and ``wall_time`` (lists, one
entry per turn), ``accept_lengths`` (one entry per decoding step) and, for the baseline file,
``turns`` (the answer texts, re-tokenized to count tokens); ``equal.py`` compares ``turns``
between a method and the baseline. Categories: MT-Bench's eight (``writing`` .. ``humanities``,
its "mt_bench" task) and ``translation``, ``summarization``, ``qa``, ``math_reasoning``,
``rag``; our offline stand-ins map onto those names (:data:`CATEGORY`), and categories Spec-Bench
lacks (e.g. HumanEval's ``code``) keep their own name.

Caveat for ``speed.py``'s baseline: it counts a baseline answer's tokens as
``len(tokenizer(text).input_ids) - 1``, assuming the tokenizer adds a BOS. The embedded
model's tokenizer adds none, so its baseline count comes out one token short per answer;
``new_tokens`` (which it uses for the method's own file) is exact.

CLI: ``python -m common.harness.specbench RECORDS.jsonl [...] --out DIR [--tokenizer MODEL]``: one file
per (decoder, model) named ``{model}-{decoder}-{dtype}-temp-{t}.jsonl``.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from ..errors import UserError
from ..records import read_jsonl, write_jsonl

# our datasets -> Spec-Bench's task names (a dataset not listed keeps each sample's category).
# Spec-Bench's own sources: WMT14 DE-EN, CNN/DM, Natural Questions (qa; rag with DPR passages),
# GSM8K; the offline ShareGPT stand-ins and the paper profile's datasets map onto those names.
CATEGORY = {
    "sharegpt-translate": "translation",
    "sharegpt-summarize": "summarization",
    "sharegpt-math": "math_reasoning",
    "sharegpt-qa": "qa",
    "sharegpt-rag": "rag",
    "humaneval": "code",
    "wmt14-de-en": "translation",
    "iwslt2017-de-en": "translation",
    "cnn_dm": "summarization",
    "xsum": "summarization",
    "gsm8k": "math_reasoning",
    "squad": "qa",
}
REQUIRED = ("question_id", "decoder", "tokens", "new_tokens", "wall_time", "accept_lengths")


# MT-Bench's eight categories, together Spec-Bench's "Multi-turn Conversation" task (mt_bench)
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
# the published leaderboard the study ranks its methods beside (study.specbench)
LEADERBOARD = Path(__file__).with_name("specbench_leaderboard.yaml")


def task_of(category: str) -> str | None:
    """Spec-Bench's task column of one of our categories: ``mt_bench`` for MT-Bench's eight, the
    five other tasks as named; None for a category Spec-Bench lacks (HumanEval's ``code``)."""
    if category in MT_BENCH:
        return "mt_bench"
    return category if category in {"translation", "summarization", "qa", "math_reasoning", "rag"} else None


def leaderboard(path: Path = LEADERBOARD) -> dict:
    """Spec-Bench's published leaderboard (``specbench_leaderboard.yaml``): its source, the study
    label of each method it ranks, its task columns and, per board (GPU and model), the speedups."""
    import yaml

    return yaml.safe_load(Path(path).read_text())


def ranks_beside(ours: dict[str, dict[str, float]], board: dict, methods: dict[str, str],
                 tasks: list[str]) -> list[dict]:
    """Per task, the order of the methods both rank, ours beside the board's.

    Args:
        ours: task -> {study label -> our speedup over vanilla} (a method we did not run is absent).
        board: one of :func:`leaderboard`'s boards (``speedup``: method -> one value per task).
        methods: Spec-Bench's method name -> our study label.
        tasks: the board's task columns, in its order.
    Returns:
        one dict per task: ``task``, ``methods`` (how many both rank), ``ours`` and ``specbench``
        (the methods fastest first, as ``A > B > ...``, by Spec-Bench's names), ``spearman`` (rank
        correlation of the two orders; None under three methods) and ``same_fastest``.
    """
    import pandas as pd

    rows = []
    for i, task in enumerate(tasks):
        both = {m: (ours.get(task, {})[lab], board["speedup"][m][i]) for m, lab in methods.items()
                if m in board["speedup"] and lab in ours.get(task, {})}
        if not both:
            continue
        a = pd.Series({m: v[0] for m, v in both.items()})
        b = pd.Series({m: v[1] for m, v in both.items()})
        # Spearman: Pearson of the ranks, rounded because the float sum depends on the order pandas
        # adds in (identical orders gave 0.9999999999999999, a rerun flipped last digits of the CSV).
        rho = round(float(a.rank().corr(b.rank())), 12) if len(both) >= 3 else None
        rows.append({"task": task, "methods": len(both),
                     "ours": " > ".join(a.sort_values(ascending=False).index),
                     "specbench": " > ".join(b.sort_values(ascending=False).index),
                     "spearman": rho, "same_fastest": a.idxmax() == b.idxmax()})
    return rows


def categories(dataset: str) -> dict[str, str]:
    """``question_id -> category`` of a dataset's samples, in Spec-Bench's names."""
    from ..assets.data import load_dataset_samples

    if dataset in CATEGORY:
        return {s.question_id: CATEGORY[dataset] for s in load_dataset_samples(dataset)}
    return {s.question_id: s.category for s in load_dataset_samples(dataset)}


def category_of(rec: dict) -> str:
    """A benchmark record's category in Spec-Bench's names: its dataset's task where
    :data:`CATEGORY` maps the dataset, else the sample's own (``category``, recorded by
    ``common.harness.bench``; MT-Bench's eight)."""
    if rec.get("dataset") in CATEGORY:
        return CATEGORY[rec["dataset"]]
    if "category" not in rec:
        raise UserError(f"record of question {rec.get('question_id')!r} ({rec.get('dataset')}) has no category; "
                        "valid: records of common.harness.bench, which writes each sample's category")
    return str(rec["category"])


def check_fields(rec: dict) -> None:
    """A record must carry every field Spec-Bench's answer line is made of (:data:`REQUIRED`)."""
    missing = [k for k in REQUIRED if k not in rec]
    if missing:
        raise UserError(f"record of question {rec.get('question_id')!r} lacks {', '.join(missing)}; "
                        f"valid: benchmark records (common.harness.bench) with {', '.join(REQUIRED)}")


def to_specbench(rec: dict, category: str, text: str) -> dict:
    """One of our records (one turn) as a Spec-Bench answer line."""
    check_fields(rec)
    steps = rec.get("steps", len(rec["accept_lengths"]))
    return {"question_id": rec["question_id"], "category": category,
            "answer_id": f"{rec['decoder']}-{rec['question_id']}", "model_id": rec.get("model", ""),
            "choices": [{"index": 0, "turns": [text], "new_tokens": [int(rec["new_tokens"])],
                         "wall_time": [float(rec["wall_time"])], "accept_lengths": list(rec["accept_lengths"]),
                         "decoding_steps": [int(steps)]}],
            "tstamp": rec.get("tstamp", 0.0)}


def file_name(rec: dict) -> str:
    safe = lambda s: re.sub(r"[^A-Za-z0-9_.@=+-]", "_", str(s))  # noqa: E731
    return (f"{safe(rec.get('model', 'model'))}-{safe(rec['decoder'])}-{safe(rec.get('dtype', 'float32'))}"
            f"-temp-{float(rec.get('temperature', 0.0))}.jsonl")


def export(records: list[dict], out_dir: Path, decode=None, category_of=category_of, name=None) -> dict[str, int]:
    """Write Spec-Bench files for ``records``; ``decode(tokens) -> text`` (default: the record's
    own decoded ``text``), ``category_of(record) -> category``, ``name(record) -> file name``
    (default :func:`file_name`: one file per model and decoder). Returns ``{file name: lines}``."""
    decode_of = (lambda r: r["text"]) if decode is None else (lambda r: decode(r["tokens"]))
    name = name or file_name
    groups: dict[str, list[dict]] = {}
    for rec in records:
        check_fields(rec)
        if decode is None and "text" not in rec:
            raise UserError(f"record of question {rec.get('question_id')!r} has no decoded text; valid: records of "
                            "common.harness.bench, or pass a tokenizer to decode the tokens")
        groups.setdefault(name(rec), []).append(to_specbench(rec, category_of(rec), decode_of(rec)))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, lines in groups.items():
        write_jsonl(out_dir / name, lines)
    return {k: len(v) for k, v in groups.items()}


def _tokenizer(name: str):
    from transformers import AutoTokenizer

    from ..assets.models import resolve
    try:
        return AutoTokenizer.from_pretrained(resolve(name))
    except OSError as e:
        raise UserError(f"no tokenizer for model {name!r}: {e}".splitlines()[0]) from e


def _main(argv=None) -> None:
    from ..checks import ArgumentParser

    ap = ArgumentParser(prog="python -m common.harness.specbench",
                        description="export benchmark records in Spec-Bench's answer format")
    ap.add_argument("records", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tokenizer", default=None, help="model whose tokenizer decodes the answers (default: "
                    "each record's model)")
    a = ap.parse_args(argv)
    if a.out.exists() and not a.out.is_dir():
        raise UserError(f"--out {a.out} is a file; valid: a folder (the Spec-Bench files are written into it)")
    records = []
    for p in a.records:   # every file read and checked before a tokenizer loads or a file is written
        if not p.is_file():
            raise UserError(f"records file {p} does not exist")
        recs = read_jsonl(p, fix="valid: a JSONL file of common.harness.bench's records; rerun the benchmark that wrote it")
        for r in recs:
            check_fields(r)
        records += [{**r, "_tok": a.tokenizer or r.get("model")} for r in recs]
    if not records:
        raise UserError("no records in " + ", ".join(map(str, a.records)))
    if any(r["_tok"] is None for r in records):
        raise UserError("some records name no model, so no tokenizer decodes them; valid: --tokenizer MODEL")
    toks = {name: _tokenizer(name) for name in {r["_tok"] for r in records}}
    cats: dict[str, dict] = {}

    def category_of_old(rec):  # records written before common.harness.bench recorded the category
        if "category" in rec or rec.get("dataset") in CATEGORY:
            return category_of(rec)
        ds = rec.get("dataset", "")
        if ds not in cats:
            cats[ds] = categories(ds)
        return cats[ds].get(str(rec["question_id"]), "unknown")

    # one tokenizer per model: decode inside each record's own group
    written = {}
    for name, tok in toks.items():
        written.update(export([r for r in records if r["_tok"] == name], a.out,
                              lambda t, tok=tok: tok.decode(t, skip_special_tokens=True), category_of_old))
    print(json.dumps(written))


if __name__ == "__main__":
    from ..errors import cli_main
    cli_main(_main)
