"""The repository documents itself: the artifact catalogue agrees with config/artifacts.yaml,
and the README cites only what a clone contains."""
import re
from pathlib import Path

from common.workflow.artifacts import load_artifacts

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| ([a-z]+\.[\w.\-]+) \| .* \| (built|pending|not built) \|$", re.M)


def catalogue(text=None):
    text = text if text is not None else (ROOT / "docs" / "artifacts.md").read_text()
    return {aid: status for aid, status in ROW.findall(text)}


def test_catalogue_marks_exactly_the_registered_ids_built():
    """Registered ids are built, or pending when the registry says their records are not
    committed yet; no other id is either."""
    arts, cat = load_artifacts(), catalogue()
    assert set(arts) <= set(cat), set(arts) - set(cat)
    assert {a for a, s in cat.items() if s == "built"} == {a for a, spec in arts.items() if not spec.get("pending")}
    assert {a for a, s in cat.items() if s == "pending"} == {a for a, spec in arts.items() if spec.get("pending")}


def test_catalogue_check_can_fail():
    assert catalogue("| ppdp.table2 | match rate | not built |\n") == {"ppdp.table2": "not built"}


def test_readme_cites_only_files_in_the_repository():
    readme = (ROOT / "README.md").read_text()
    assert "shared/" not in readme
    for path in re.findall(r"`((?:docs|config|notebooks|tools|rules|ppd_pipelined|common)/[\w./-]+)`", readme):
        if "<" not in path and "*" not in path:
            assert (ROOT / path).exists(), path


# Measured results belong in the tables (results/), not in README prose: a speedup (1.33x),
# a throughput (21 tok/s), a percentage, a wall time (17 min) or a quality/acceptance figure
# typed by hand goes stale the day the records change.
MEASURED = [
    re.compile(r"\b\d+(?:\.\d+)?\s?[x×](?![\w-])"),                        # speedups: 1.33x, 0.9 ×
    re.compile(r"\b\d+(?:\.\d+)?\s?(?:tok(?:en)?s?|it)/s\b", re.I),         # throughput
    re.compile(r"\b\d+(?:\.\d+)?\s?%"),                                     # shares and accuracies
    re.compile(r"\b\d+(?:\.\d+)?\s?(?:ms|s|sec|seconds?|min|minutes?|h|hours?)\b"),  # wall times
    re.compile(r"\b(?:speedup|accept\w*|BLEU|ROUGE(?:-L)?|top-1|accuracy|agreement|τ|tau)\b[^.\n|]{0,25}?\d+\.\d+",
               re.I),                                                       # quality or acceptance figures
]


def measured_results(text: str) -> list[str]:
    """Lines of ``text`` that state a measured result (outside fenced code blocks)."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced and any(p.search(line) for p in MEASURED):
            out.append(line)
    return out


def test_readme_types_no_measured_result():
    """README prose links the tables instead of quoting them (results/SUMMARY.md collects them)."""
    assert measured_results((ROOT / "README.md").read_text()) == []


def test_measured_result_check_can_fail():
    for line in ["prompt lookup reaches 1.33x vanilla", "1.14× at the hardware-aware size",
                 "vanilla runs at 21.5 tok/s", "the exit keeps 24% of the tokens", "the teacher pass took 17 min",
                 "one forward costs 21.7 ms", "mean accepted length 1.48", "ROUGE-L 18.81 -> 18.76",
                 "held-out top-1 0.219"]:
        assert measured_results(line) == [line], line
    benign = ["Python 3.11, no GPU", "the plan (136 jobs)", "2 CPU cores", "SmolLM2-135M-Instruct",
              "Vicuna-7B/13B, LLaMA-2-13B-chat", "-j4 all", "top-32 log-probabilities", "fp16 on CUDA",
              "```\n1.33x inside a code block\n```"]
    assert measured_results("\n".join(benign)) == []


def test_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150
