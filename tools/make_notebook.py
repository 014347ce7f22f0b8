"""Write one parameterized notebook per artifact id from the plain Python files in notebooks/src/.

A source (``# %%`` cell markers) holds one section of a paper; ``config/artifacts.yaml`` says
which ids it makes. Each id gets its own ``notebooks/<id>.ipynb`` holding only its own cells:

    # %% md                 markdown cell, in every id's notebook
    # %% [ppdp.table2]      code cell only in ppdp.table2's notebook
    # %% md [ppdp.fig3, ppdp.fig4]   markdown only in those two

The first cell, tagged ``parameters`` (papermill), is written here, the same for every
notebook: the artifact id and package from config/artifacts.yaml, the embedded profile's
defaults, and ``inputs = None`` (the rule passes the raw records it declares; a notebook run by
hand computes the same list from the config).

    python tools/make_notebook.py            # rewrite every notebooks/<id>.ipynb
    python tools/make_notebook.py --check    # exit 1 naming each notebook that differs from its source
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^ ?(md|\[markdown\])?\s*(?:\[([^\]]*)\])?\s*$")


def cells_of(text: str) -> list[tuple[str, set[str] | None, str]]:
    """(kind, ids or None for every id, body) per ``# %%`` cell of a source."""
    out = []
    for chunk in text.split("# %%")[1:]:
        head, _, body = chunk.partition("\n")
        m = MARKER.match(head)
        if not m:
            raise SystemExit(f"error: bad cell marker '# %%{head}'")
        kind = {"md": "markdown", "[markdown]": "markdown"}.get(m.group(1), m.group(1) or "code")
        ids = {s.strip() for s in m.group(2).split(",")} if m.group(2) else None
        if body.strip():
            out.append((kind, ids, body.strip("\n")))
    return out


PARAMETERS = """\
artifact_id = "{aid}"
results_root = "results"
package = "{package}"
profile = "embedded"
inputs = None  # the raw records the rule declares; None: the same list, computed from config"""


def build(src: Path, aid: str, package: str) -> nbformat.NotebookNode:
    """The notebook of artifact ``aid`` from section source ``src``."""
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                   "language_info": {"name": "python"}}
    params = nbformat.v4.new_code_cell(PARAMETERS.format(aid=aid, package=package))
    params.metadata["tags"] = ["parameters"]
    nb.cells.append(params)
    for kind, ids, body in cells_of(src.read_text()):
        if ids is not None and aid not in ids:
            continue
        if kind == "markdown":
            lines = [l[2:] if l.startswith("# ") else l.lstrip("#") for l in body.splitlines()]
            nb.cells.append(nbformat.v4.new_markdown_cell("\n".join(lines)))
        else:
            nb.cells.append(nbformat.v4.new_code_cell(body))
    for i, c in enumerate(nb.cells):
        c["id"] = f"cell-{i}"  # stable ids: regenerating gives no spurious diff
    return nb


def expected() -> dict[Path, str]:
    """Every notebook the sources make, as the text it must have."""
    artifacts = yaml.safe_load((ROOT / "config" / "artifacts.yaml").read_text())
    return {ROOT / "notebooks" / f"{aid}.ipynb":
            nbformat.writes(build(ROOT / "notebooks" / "src" / f"{spec['notebook']}.py", aid, spec["package"])) + "\n"
            for aid, spec in artifacts.items()}


def stale() -> list[str]:
    """Notebooks that differ from their sources, are missing, or have no source."""
    want = expected()
    have = set((ROOT / "notebooks").glob("*.ipynb"))
    bad = [str(p.relative_to(ROOT)) for p, text in want.items() if not p.is_file() or p.read_text() != text]
    return bad + [f"{p.relative_to(ROOT)} (no artifact makes it)" for p in sorted(have - set(want))]


def main(argv: list[str]) -> None:
    if argv[:1] == ["--check"]:
        bad = stale()
        if bad:
            print(f"error: notebooks differ from notebooks/src (run tools/make_notebook.py): {', '.join(bad)}",
                  file=sys.stderr)
            sys.exit(1)
        return
    for p, text in expected().items():
        p.write_text(text)
    for p in set((ROOT / "notebooks").glob("*.ipynb")) - set(expected()):
        p.unlink()  # a notebook no artifact makes any more


if __name__ == "__main__":
    main(sys.argv[1:])
