"""The repository documents itself: the artifact catalogue agrees with config/artifacts.yaml,
and the README cites only what a clone contains."""
import re
from pathlib import Path

from common.config import load_artifacts

ROOT = Path(__file__).resolve().parent.parent
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
