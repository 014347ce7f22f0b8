"""What every artifact notebook does around its own computation: read exactly the raw records
its rule declares, stage its tables and figure, publish them atomically at the end, and put the
paper's reported numbers beside ours.

    R = Render(artifact_id, results_root, package, profile, inputs)   # papermill's parameters
    ...                                                               # the artifact's own cells
    print(R.trend("what the paper claims", ours_flags, paper_flags, over="the range measured"))
    R.save_table(df, meta); R.save_figure(fig); R.publish()

Every table states a verdict: the trend lines the notebook computed (:meth:`Render.trend`,
:meth:`Render.verdict`) become the table's ``**verdict**:`` header line, written when the
notebook publishes (so a trend computed after ``save_table`` still reaches the table). A table
with none is refused at :meth:`Render.publish`; a table that only states a setup says so with
:meth:`Render.setup_only`. In the executed notebook the figure is shown inline, the paper's
numbers stand beside ours in one merged table (ours, paper, ours / paper), missing cells print
as "—", and a closing markdown cell (rules/artifacts.smk appends it: :func:`close_notebook`)
says what the artifact shows, from the same verdict lines.
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Callable

import pandas as pd
import yaml

from ..config import Profile, load_profile
from ..cost import cost_curve_paths
from ..workflow.artifacts import Staged, artifact_inputs, check_inputs
from ..records import read_jsonl
from . import report
from .report import to_markdown, write_table

REPO = Path(__file__).resolve().parents[2]


def paper_numbers(package: str) -> dict:
    """A paper package's ``paper_numbers.yaml``: its reported numbers and claims, each citing
    the table or figure they come from."""
    return yaml.safe_load((REPO / package / "paper_numbers.yaml").read_text())


class Render:
    """One artifact's render: its declared inputs (checked), its profile (and the package's
    config of it, through ``build_cfg``), its staged outputs."""

    def __init__(self, artifact_id: str, results_root: str, package: str, profile: str,
                 inputs: list[str] | None = None, build_cfg: Callable[[Profile], object] | None = None,
                 noise: bool = True):
        """``noise=False``: the table's header gets no noise line from its benchmark inputs
        (cross-method groups, each with its own vanilla and no A/A pair, state none)."""
        self.artifact_id, self.profile_name = artifact_id, profile
        prof = load_profile(None, profile)
        if inputs is None:  # run by hand: the same list the rule declares, for this results root
            prof = dataclasses.replace(prof, results_root=results_root)
            inputs = artifact_inputs(prof, artifact_id)
        self.inputs = check_inputs(list(inputs))
        self.profile = prof
        self.cfg = build_cfg(prof) if build_cfg is not None else None
        self.base = Path(results_root) / package
        self.staged = Staged({"tables": self.base / "tables", "figures": self.base / "figures"})
        self.noise = noise
        self.note: str | None = None
        self.verdicts: list[str] = []
        self.cuts: list[str] = []
        self._bench: dict[str, list[dict]] | None = None
        self._all: dict[str, list[dict]] | None = None
        self._beside: pd.DataFrame | None = None
        self._table: tuple[pd.DataFrame, dict, str] | None = None

    def bench_runs(self) -> dict[str, list[dict]]:
        """Every declared input that holds ``common.harness.bench`` records with a ``vanilla`` row, by
        file name: the runs whose speedups the table's noise line speaks for."""
        if self._bench is None:
            self._bench = {}
            for p in self.inputs:
                if p.endswith(".jsonl") and Path(p).is_file():
                    recs = read_jsonl(p)
                    if recs and report.BENCH_FIELDS <= set(recs[0]) and any(r["decoder"] == "vanilla" for r in recs):
                        self._bench[Path(p).stem] = recs
        return self._bench

    def input_runs(self) -> dict[str, list[dict]]:
        """Every declared JSONL input's records, by file name: what the table's header counts
        (prompts per cell, decoding mode) and the hosts its verdicts rest on, by default."""
        if self._all is None:
            self._all = {Path(p).stem: read_jsonl(p) for p in self.inputs
                         if p.endswith(".jsonl") and Path(p).is_file()}
        return self._all

    def evidence_records(self) -> list[dict]:
        """The records a verdict compares, by default: every declared JSONL input's but the cost
        curves' (each host's own hardware curve, read per host: :mod:`common.cost`), whose hosts
        are no part of a comparison."""
        curves = {Path(p).stem for p in cost_curve_paths(self.inputs)}
        return [r for name, recs in self.input_runs().items() if name not in curves for r in recs]

    @property
    def aa_spread(self) -> float | None:
        """The widest A/A spread among the table's benchmark runs; None when any lacks a pair
        (then no difference can be called noise)."""
        spreads = [report.aa_spread(r) for r in self.bench_runs().values()]
        return max(spreads) if spreads and None not in spreads else None

    def trend(self, what: str, ours, paper=None, *, over: str | None = None, caveat: str | None = None,
              gaps: list[tuple[float, float]] | None = None, evidence: bool = True,
              mixed: str | None = None, by_construction: bool = False,
              ties: list[tuple[float, float]] | None = None, tol: float | None = None, seeds: int = 1,
              records: list[dict] | None = None) -> str:
        """:func:`common.harness.report.trend`'s line, kept as one of this table's verdicts and returned.

        ``over``: the range it was measured over (settings, latencies, datasets); ``caveat``: a
        mismatch it rests on (different base models, a stand-in, a consistency check rather
        than evidence). Both are written into the line, so the table cannot drop them.
        ``gaps``: the (ours, other) speedups the comparison rests on; when every one is inside
        the run's A/A spread the line says "within noise". ``evidence=False``: the comparison
        cannot test the paper (it holds by construction, or rests on a mismatch), so the line
        reports the count without a holds / does-not-hold verdict. ``mixed``: the rows compared
        were trained on different data (:func:`common.harness.report.mixed_data`), so the count is
        reported as no test either way, with who saw what. ``by_construction``: the comparison
        cannot fail (a top-1 match is always a top-3 match), so it is labelled so and not counted
        as the paper's trend holding. ``ties``: the (ours, other) accuracies the comparison rests
        on, measured on ``seeds`` seeds; when every gap is a tie (:func:`common.harness.report.tie`,
        ``tol`` default :data:`common.harness.report.ACCURACY_TOL`) the line says so instead of
        a verdict. ``records``: the records behind it (default: :meth:`evidence_records`); from
        several hosts, the line says so (:func:`common.harness.report.host_caveat`)."""
        line = report.trend(what, ours, paper)
        head, _, _ = line.partition(" -> ")
        tol = report.ACCURACY_TOL if tol is None else tol
        if mixed:
            line = f"{head} -> not a like-for-like test, no verdict"
            caveat = f"{mixed}; {caveat}" if caveat else mixed
        elif by_construction:
            line = f"{head} (holds by construction, not evidence)"
        elif ties and all(report.tie(a, b, tol, seeds) for a, b in ties):
            line = f"{head} -> {report.tie_note(tol, seeds)}: no verdict either way"
        elif not evidence:
            line = f"{head} -> consistent, but not a test of the paper's claim"
        hosts = report.host_caveat(records if records is not None else self.evidence_records())
        if hosts:
            caveat = f"{caveat}, {hosts}" if caveat else hosts
        if gaps and all(report.within_noise(a, b, self.aa_spread) for a, b in gaps):
            line += " - within noise: every difference it counts is inside the run's A/A spread"
        if over:
            line += f", measured over {over}"
        if caveat:
            line += f" [{caveat}]"
        self.verdicts.append(line)
        return line

    def beside(self, df: pd.DataFrame, pairs: dict[str, str], labels: list[str]) -> pd.DataFrame:
        """The merged paper-vs-ours table this notebook shows (when the paper's numbers are not
        columns of its own table): ``df``'s ``labels``, then per ``pairs`` item {ours: paper}
        ours, the paper's and their ratio. Shown at :meth:`publish`; returned."""
        self._beside = paper_beside_ours(df, pairs, labels)
        return self._beside

    def verdict(self, text: str) -> str:
        """A verdict not counted by :meth:`trend` (one stated comparison), kept and returned."""
        self.verdicts.append(text)
        return text

    def cut(self, what: str, ours, paper) -> str | None:
        """Where this table's sweep or data is cut from the paper's (``ours``: the values the
        records or config hold; ``paper``: the paper's, from its ``paper_numbers.yaml``): kept for
        the header's ``cut`` line (:func:`common.harness.report.cut_line`) and returned; None
        when nothing is cut."""
        line = report.cut_line(what, ours, paper)
        if line and line not in self.cuts:
            self.cuts.append(line)
        return line

    def setup_only(self, what: str) -> str:
        """The verdict of a table that states a setup (templates, hyperparameters, model sizes)."""
        return self.verdict(f"setup only ({what}): no measured result, nothing to hold or fail")

    def no_paper_numbers(self, note: str) -> None:
        """Why no paper's numbers stand beside this table (the comparison is this project's own,
        a learning curve no paper reports): shown at :meth:`publish` where they would stand."""
        self.note = note

    def stage(self, kind: str) -> Path:
        """A staging folder for outputs besides tables and figures (an export), published with
        them under ``<results_root>/<package>/<kind>``."""
        self.staged.final.setdefault(kind, self.base / kind)
        return self.staged.dir(kind)

    def path(self, name: str) -> str:
        """The declared input whose file name is ``name`` (an undeclared name is an error)."""
        hits = [p for p in self.inputs if Path(p).name == name]
        if not hits:
            raise FileNotFoundError(f"{name} is not among {self.artifact_id}'s declared inputs {self.inputs}")
        return hits[0]

    def records(self, prefix: str) -> tuple[list[dict], list[str]]:
        """Every record of the declared JSONL inputs named ``<prefix>*.jsonl``, and their paths."""
        paths = [p for p in self.inputs if Path(p).name.startswith(prefix) and p.endswith(".jsonl")]
        return [r for p in paths for r in read_jsonl(p)], paths

    def runs(self, prefix: str = "bench_", under: str | None = None) -> dict[str, list[dict]]:
        """The records of each declared ``<prefix><name>.jsonl`` input, by ``name`` (one
        benchmark run per dataset, one training curve per variant); ``under``: only those in
        that folder (a package's own raw records, leaving out a cross-method group's)."""
        return {Path(p).name.removeprefix(prefix).removesuffix(".jsonl"): read_jsonl(p)
                for p in self.inputs if Path(p).name.startswith(prefix) and p.endswith(".jsonl")
                and (under is None or Path(p).parent.as_posix().endswith(under))}

    def find(self, suffix: str, required: bool = True):
        """The declared input whose path ends with ``suffix``, read (JSON or JSONL); None when
        it is optional and not declared (a component this profile does not train)."""
        hits = [p for p in self.inputs if p.endswith(suffix)]
        if not hits:
            if required:
                raise FileNotFoundError(f"no input ending with {suffix} among {self.artifact_id}'s {self.inputs}")
            return None
        return read_jsonl(hits[0]) if hits[0].endswith(".jsonl") else json.loads(Path(hits[0]).read_text())

    def save_table(self, df: pd.DataFrame, meta: dict, floatfmt: str = ".3f") -> None:
        """Keep ``tables/<id>.{md,csv}`` for :meth:`publish`, which writes it with the verdicts
        computed by then, and show the table (missing cells as "—")."""
        self._table = (df.copy(), dict(meta), floatfmt)
        _display_markdown(to_markdown(df, floatfmt))

    def save_figure(self, fig) -> None:
        """Stage ``figures/<id>.png`` and show the figure in the executed notebook."""
        path = self.staged.dir("figures") / f"{self.artifact_id}.png"
        fig.savefig(path, dpi=120, bbox_inches="tight")
        show(fig, path)

    def closing(self, meta: dict) -> str:
        """The closing cell's markdown: what the artifact shows here, from its verdict lines,
        and the paper's statement it is compared with."""
        return closing_text(self.artifact_id, meta)

    def publish(self) -> None:
        """The notebook's last step: write the table with its verdict, show the paper beside
        ours and the closing summary, and move the staged tables and figure into place."""
        if self._table is not None:
            df, meta, floatfmt = self._table
            meta = {"artifact": self.artifact_id, **meta}
            if self.noise and self.bench_runs() and "noise" not in meta:
                # every speedup's worth: the A/A spread (or that the run has no pair) and the
                # bootstrap intervals over prompts
                meta = _before_sources(meta, "noise", report.noise_line(self.bench_runs()))
            if self.cuts:
                meta = _before_sources(meta, "cut", "; ".join(self.cuts))
            if self.verdicts:
                meta = _with_verdict(meta, self.verdicts)
            hosts = report.host_caveat(self.evidence_records())
            if hosts and meta.get("verdict") and hosts not in str(meta["verdict"]):
                # a verdict the notebook stated itself (not through trend) rests on the same records
                meta["verdict"] = f"{meta['verdict']}; every comparison above: {hosts}"
            if not _verdicts_of(meta):
                raise RuntimeError(f"{self.artifact_id}: no verdict (Render.trend, .verdict or .setup_only) "
                                   "for its table; every table says whether the paper's trend holds")
            merged = self._beside if self._beside is not None else paper_beside_ours(df)
            if merged is not None and beside_line(merged):
                meta = _before_sources(meta, "beside the paper", beside_line(merged))
            write_table(df, self.artifact_id, self.staged.dir("tables"), meta, floatfmt, runs=self.input_runs())
            if merged is not None:
                _display_markdown("### The paper beside ours\n\n" + to_markdown(merged, floatfmt))
            elif self.note:
                _display_markdown(f"### The paper beside ours\n\n{self.note}")
            else:
                _display_markdown("### The paper beside ours\n\nThe paper reports no number per row of this "
                                  "table" + (f"; what it states: {meta['paper']}" if meta.get("paper") else "")
                                  + "; the verdict below compares with its claim.")
            _display_markdown(self.closing(meta), closing=True)
        for f in self.staged.publish():
            print("wrote", f)


def closing_text(artifact_id: str, meta: dict) -> str:
    """What artifact ``artifact_id`` shows here, from its table header ``meta``: its verdict
    lines, the paper's statement and where it was measured (the closing markdown cell)."""
    lines = [f"## What {artifact_id} shows here", ""]
    lines += [f"- {v}" for v in _verdicts_of(meta)]
    if meta.get("paper"):
        lines += ["", f"The paper: {meta['paper']}"]
    if meta.get("beside the paper"):
        lines += ["", f"Ours beside the paper's numbers: {meta['beside the paper']}."]
    where = ", ".join(str(meta[k]) for k in ("model", "profile", "hardware", "device") if meta.get(k))
    if where:
        lines += ["", f"Measured with {where}."]
    return "\n".join(lines)


PAPER_PREFIXES = ("paper ", "paper_")


def paper_beside_ours(df: pd.DataFrame, pairs: dict[str, str] | None = None,
                      labels: list[str] | None = None) -> pd.DataFrame | None:
    """One table of the paper's numbers beside ours: the row labels (``labels``, default the
    text columns), then per measured column with a paper twin (``pairs`` {ours: paper}, default
    every ``paper <col>`` / ``paper_<col>`` beside a ``<col>``): ours, the paper's, and ours /
    paper (missing where either is missing or not a number). None when no column has a twin."""
    if df.empty:  # nothing measured that the paper reports (no stand-in matches, say)
        return None
    pairs = list(pairs.items()) if pairs else [
        (c, p) for p in df.columns if isinstance(p, str) and p.startswith(PAPER_PREFIXES)
        for c in [p[len("paper "):] if p.startswith("paper ") else p[len("paper_"):]] if c in df.columns]
    if not pairs:
        return None
    if labels is None:
        labels = [c for c in df.columns if not pd.api.types.is_numeric_dtype(df[c])
                  and not (isinstance(c, str) and c.startswith(PAPER_PREFIXES)) and c not in dict(pairs)]
    out = df[labels].copy()
    for ours, theirs in pairs:
        a, b = pd.to_numeric(df[ours], errors="coerce"), pd.to_numeric(df[theirs], errors="coerce")
        out[f"{ours} (ours)"], out[f"{ours} (paper)"] = df[ours], df[theirs]
        out[f"{ours}: ours / paper"] = [x / y if not (math.isnan(x) or math.isnan(y) or y == 0) else float("nan")
                                        for x, y in zip(a, b)]
    return out


def _span(values) -> str:
    v = pd.to_numeric(pd.Series(values), errors="coerce").dropna()
    if v.empty:
        return "—"
    return f"{v.min():.3g}" if v.min() == v.max() else f"{v.min():.3g}-{v.max():.3g}"


def beside_line(merged: pd.DataFrame) -> str:
    """The merged table in one header line: per measured column, our range, the paper's and
    their ratio's, over the rows where both are numbers ('' when no row has both)."""
    parts = []
    for ratio in [c for c in merged.columns if str(c).endswith(": ours / paper")]:
        col = str(ratio).removesuffix(": ours / paper")
        rows = merged[merged[ratio].notna()]
        if len(rows):
            parts.append(f"{col}: ours {_span(rows[f'{col} (ours)'])}, paper {_span(rows[f'{col} (paper)'])}, "
                         f"ours / paper {_span(rows[ratio])} ({len(rows)} rows)")
    return "; ".join(parts)


def _verdicts_of(meta: dict) -> list[str]:
    """The verdict lines a table's header carries (``verdict`` and/or ``trend``)."""
    return [line for k in ("verdict", "trend") if meta.get(k) for line in str(meta[k]).split("; ") if line]


def _before_sources(meta: dict, key: str, value: str) -> dict:
    """``meta`` with ``key: value`` placed just before ``sources`` (or last)."""
    out = {k: v for k, v in meta.items() if k != "sources"}
    out[key] = value
    if "sources" in meta:
        out["sources"] = meta["sources"]
    return out


def _with_verdict(meta: dict, verdicts: list[str]) -> dict:
    """``meta`` with the verdict lines not already in its ``trend`` as ``verdict``, placed
    before ``sources`` (the header reads: what was measured, what it shows, where from)."""
    stated = " ".join(str(meta.get(k, "")) for k in ("verdict", "trend"))
    new = [v for v in dict.fromkeys(verdicts) if v not in stated]
    if not new:
        return meta
    return _before_sources(meta, "verdict", "; ".join(([meta["verdict"]] if meta.get("verdict") else []) + new))


def _display(obj, **metadata) -> None:
    """Show ``obj`` in the executed notebook (IPython's display); outside a kernel, nothing."""
    if "IPython" in sys.modules:
        from IPython import get_ipython
        from IPython.display import display  # only inside a kernel: IPython is a notebook dependency
        if get_ipython() is not None:
            display(obj, metadata=metadata or None)


def show(fig, path: str | Path | None = None) -> None:
    """Show a figure inline in the executed notebook, as the PNG saved at ``path`` (a notebook
    that sets the Agg backend has no inline formatter for a Figure, which would show as text)."""
    if "IPython" not in sys.modules:
        return
    from IPython.display import Image
    if path is None:
        import io
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
        _display(Image(data=buf.getvalue()))
    else:
        _display(Image(filename=str(path)))


def _display_markdown(text: str, closing: bool = False) -> None:
    if "IPython" in sys.modules:
        from IPython.display import Markdown
        _display(Markdown(text), **({"closing": True} if closing else {}))
    else:
        print(text)


def close_notebook(path: str | Path) -> None:
    """Append the closing markdown cell to an executed notebook: the text of the output that
    :meth:`Render.publish` marked ``closing`` (the last one; nothing when there is none)."""
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    text = None
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("metadata", {}).get("closing"):
                text = out["data"]["text/markdown"]
    if text is None:
        return
    cell = nbformat.v4.new_markdown_cell(text)
    cell["id"] = "closing"
    nb.cells = [c for c in nb.cells if c.get("id") != "closing"] + [cell]
    nbformat.write(nb, str(path))


if __name__ == "__main__":  # python -m common.harness.render close NOTEBOOK (rules/artifacts.smk, after papermill)
    if sys.argv[1:2] != ["close"] or len(sys.argv) != 3:
        sys.exit("error: usage: python -m common.harness.render close NOTEBOOK")
    close_notebook(sys.argv[2])
