"""common.harness.render: every table carries a verdict, the paper's numbers stand beside ours, missing
cells print as "—", and the executed notebook closes with what the artifact shows;
common.harness.summary: results/SUMMARY.md is made from the tables."""
import json
import math
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from common.harness.render import Render, beside_line, close_notebook, paper_beside_ours
from common.harness.summary import header, summary

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def R(tmp_path):
    raw = tmp_path / "cross" / "raw"
    raw.mkdir(parents=True)
    (raw / "x.jsonl").write_text('{"a": 1}\n')
    return Render("cost.fig", str(tmp_path), "cross", "embedded", inputs=[str(raw / "x.jsonl")])


def _md(tmp_path):
    return (tmp_path / "cross" / "tables" / "cost.fig.md").read_text()


def test_a_table_without_a_verdict_is_refused(R, tmp_path):
    R.save_table(pd.DataFrame({"a": [1.0]}), {"model": "m"})
    with pytest.raises(RuntimeError, match="no verdict"):
        R.publish()
    assert not (tmp_path / "cross" / "tables" / "cost.fig.md").exists()  # nothing published


def test_trend_computed_after_save_table_reaches_the_header(R, tmp_path):
    R.save_table(pd.DataFrame({"speedup": [0.9, float("nan")], "paper speedup": [1.5, 2.0]}),
                 {"model": "m", "sources": "x.jsonl"})
    line = R.trend("faster than vanilla", [False], [True, True], over="latency 1.06-1.23x",
                   caveat="two different base models")
    R.publish()
    md = _md(tmp_path)
    head = header(md)
    assert head["verdict"] == line
    assert "does not hold" in line and "measured over latency 1.06-1.23x" in line and "[two different base models]" in line
    assert list(head)[-1] == "sources"  # the verdict sits above the sources
    assert "nan" not in md and "—" in md  # missing cells print as a dash


def test_setup_only_and_existing_trend_count(R, tmp_path):
    R.save_table(pd.DataFrame({"a": [1]}), {"model": "m"})
    R.setup_only("templates")
    R.publish()
    assert header(_md(tmp_path))["verdict"].startswith("setup only (templates)")


def test_a_comparison_across_training_data_is_no_test(R):
    """Trainings on different data make the line name who saw what and give no verdict; the
    same data (or one training) leave the line as it was."""
    from common.harness.report import mixed_data
    a = {"train_sequences": 8960, "heldout_sequences": 64}
    b = {"train_sequences": 320, "heldout_sequences": 32}
    assert mixed_data({"x": a, "y": dict(a)}) is None and mixed_data({"x": a}) is None
    mixed = mixed_data({"x": a, "y": b, "z": dict(b)})
    assert mixed == "trained on different data: x on 8960 sequences (64 held out); y, z on 320 sequences (32 held out)"
    line = R.trend("x >= y", [False, False], [True, True], mixed=mixed, caveat="stand-in data")
    assert line.endswith(f"-> not a like-for-like test, no verdict [{mixed}; stand-in data]")
    assert "holds" not in line and line in R.verdicts
    same = R.trend("x >= y", [True], [True], mixed=mixed_data({"x": a, "y": dict(a)}))
    assert same.endswith("the paper's trend holds here")


def test_paper_beside_ours_merges_twins_with_a_ratio():
    df = pd.DataFrame({"dataset": ["a", "b"], "speedup": [1.0, 2.0], "paper speedup": [2.0, None],
                       "tau": [1.5, 1.6], "paper_tau": [3.0, 3.2], "other": [1, 2]})
    m = paper_beside_ours(df)
    assert list(m.columns) == ["dataset", "speedup (ours)", "speedup (paper)", "speedup: ours / paper",
                               "tau (ours)", "tau (paper)", "tau: ours / paper"]
    assert m["speedup: ours / paper"][0] == 0.5 and math.isnan(m["speedup: ours / paper"][1])
    assert m["tau: ours / paper"].tolist() == [0.5, 0.5]
    assert paper_beside_ours(pd.DataFrame({"a": [1]})) is None


def test_close_notebook_appends_the_closing_cell_once(tmp_path):
    nb = nbformat.v4.new_notebook()
    code = nbformat.v4.new_code_cell("R.publish()")
    code.outputs = [nbformat.v4.new_output("display_data", data={"text/markdown": "## What x shows here\n- holds"},
                                           metadata={"closing": True})]
    nb.cells = [code]
    path = tmp_path / "x.ipynb"
    nbformat.write(nb, str(path))
    close_notebook(path)
    close_notebook(path)  # idempotent: one closing cell
    cells = nbformat.read(str(path), as_version=4).cells
    assert [c.cell_type for c in cells] == ["code", "markdown"] and cells[-1].source.startswith("## What x shows")


def test_summary_is_made_from_the_tables(tmp_path):
    t = tmp_path / "bild" / "tables"
    t.mkdir(parents=True)
    merged = paper_beside_ours(pd.DataFrame({"task": ["a", "b"], "speedup": [0.8, 0.9], "paper speedup": [1.6, 1.8]}))
    line = beside_line(merged)
    assert line == "speedup: ours 0.8-0.9, paper 1.6-1.8, ours / paper 0.5 (2 rows)"
    (t / "bild.x.md").write_text("# bild.x\n\n- **profile**: embedded\n- **device**: cpu: EPYC\n"
                                 f"- **beside the paper**: {line}\n"
                                 "- **verdict**: faster: paper 2/2, ours 0/2 -> the paper's trend does not hold here\n")
    text = summary([t / "bild.x.md"])
    assert f"| [bild.x](bild/tables/bild.x.md) | {line} | faster: paper 2/2" in text
    assert "- **profile**: embedded" in text and "- **hardware**: cpu: EPYC" in text


def test_the_merged_table_reaches_the_header(R, tmp_path):
    R.save_table(pd.DataFrame({"k": ["a"], "tau": [1.5], "paper_tau": [3.0]}), {"model": "m"})
    R.trend("x", [True])
    R.publish()
    assert header(_md(tmp_path))["beside the paper"] == "tau: ours 1.5, paper 3, ours / paper 0.5 (1 rows)"


@pytest.mark.parametrize("table", sorted(p.relative_to(ROOT) for p in ROOT.glob("results/*/tables/*.md")), ids=str)
def test_every_committed_table_has_a_verdict(table):
    head = header((ROOT / table).read_text())
    assert head.get("verdict") or head.get("trend"), f"{table} has no verdict line"


@pytest.mark.parametrize("held, cases, word", [(12, 12, "holds"), (9, 12, "mostly holds"), (8, 12, "partly holds"),
                                               (7, 12, "partly holds"), (2, 3, "partly holds"), (3, 6, "partly holds"),
                                               (2, 5, "does not hold"), (1, 6, "does not hold"),
                                               (0, 5, "does not hold"), (0, 0, "untested")])
def test_mostly_needs_three_quarters(held, cases, word):
    from common.harness.report import trend, verdict_word
    assert verdict_word(held, cases) == word
    assert trend("x", [True] * held + [False] * (cases - held)).endswith(f"claim {word} here")


def test_a_check_that_cannot_fail_is_labelled_and_not_counted(R):
    line = R.trend("p_correct grows with k", [True] * 4, [True] * 4, by_construction=True)
    assert line.endswith("(holds by construction, not evidence)")
    assert "trend holds" not in line and "->" not in line


def test_single_seed_accuracy_gaps_below_the_tolerance_are_ties(R):
    # firp.fig7's case: 0.271 vs 0.280 on one seed
    line = R.trend("masked < not masked", [True], ties=[(0.271, 0.280)], tol=0.02)
    assert "tie (single seed, gap < 0.02): no verdict either way" in line and "holds" not in line
    wide = R.trend("masked < not masked", [True], ties=[(0.20, 0.280)], tol=0.02)
    assert wide.endswith("claim holds here")                                  # a gap above the tolerance counts
    seeds = R.trend("masked < not masked", [True], ties=[(0.271, 0.280)], tol=0.02, seeds=3)
    assert seeds.endswith("claim holds here")                                 # three seeds decide it


def test_a_verdict_on_records_from_several_hosts_says_so(R, tmp_path):
    recs = [{"question_id": 1, "device": "cpu: A"}, {"question_id": 1, "device": "cpu: B"}]
    line = R.trend("faster", [True], records=recs)
    assert "records from 2 hosts: cpu: A / cpu: B, not one-host evidence" in line
    assert "hosts" not in R.trend("faster", [True], records=recs[:1])
    # a verdict the notebook states itself gets the caveat of the table's own records
    raw = tmp_path / "cross" / "raw" / "x.jsonl"
    raw.write_text("\n".join(json.dumps({**r, "tokens": [1]}) for r in recs) + "\n")
    R2 = Render("cost.fig", str(tmp_path), "cross", "embedded", inputs=[str(raw)])
    R2.save_table(pd.DataFrame({"a": [1.0]}), {"model": "m", "verdict": "a project comparison"})
    R2.publish()
    assert "every comparison above: records from 2 hosts" in header(_md(tmp_path))["verdict"]


def test_cost_curves_of_other_hosts_are_no_part_of_a_comparison(tmp_path):
    # each host's cost curve is read for that host's records alone (common.cost), so a table whose
    # benchmark ran on one host is one-host evidence, whatever curves it declares beside it
    raw = tmp_path / "cross" / "raw"
    (raw / "cost_curves").mkdir(parents=True)
    bench = raw / "bench.jsonl"
    bench.write_text(json.dumps({"question_id": 1, "decoder": "vanilla", "tokens": [1], "device": "cpu: A"}) + "\n")
    (raw / "cost_curve.jsonl").write_text(json.dumps({"q": 1, "ms": 1.0, "device": "cpu: B"}) + "\n")
    (raw / "cost_curves" / "c.jsonl").write_text(json.dumps({"q": 1, "ms": 1.0, "device": "cpu: C"}) + "\n")
    inputs = [str(bench), str(raw / "cost_curve.jsonl"), str(raw / "cost_curves" / "c.jsonl")]
    R = Render("cost.fig", str(tmp_path), "cross", "embedded", inputs=inputs)
    assert [r["device"] for r in R.evidence_records()] == ["cpu: A"]
    assert "hosts" not in R.trend("faster", [True])
    other = {"question_id": 1, "decoder": "vanilla", "tokens": [1], "device": "cpu: B"}
    bench.write_text(bench.read_text() + json.dumps(other) + "\n")
    R2 = Render("cost.fig", str(tmp_path), "cross", "embedded", inputs=inputs)
    assert "records from 2 hosts: cpu: A / cpu: B" in R2.trend("faster", [True])


def _rec(q, decoder="vanilla", **cfg):
    return {"question_id": q, "decoder": decoder, "tokens": [1], "decoder_config": cfg}


def test_headers_state_prompts_per_cell_and_decoding(tmp_path):
    from common.harness.report import decoding_line, measured_header, prompts_line, write_table
    same = {"run": [_rec(q) for q in range(3)] + [_rec(q, "x") for q in range(3)]}
    assert prompts_line(same).startswith("3 per cell (2 cells")
    uneven = {"run": [_rec(q) for q in range(3)] + [_rec(q, "x") for q in range(2)]}
    assert prompts_line(uneven).startswith("2-3 per cell")
    assert prompts_line({"curve": [{"step": 1, "train_loss": 2.0}]}) is None       # no prompt behind it
    assert decoding_line(same["run"]) == "greedy (temperature 0 in every record)"
    mixed = same["run"] + [_rec(0, "spec@t1", temperature=1.0, acceptance="typical")]
    assert decoding_line(mixed) == "greedy, except spec@t1: temperature 1.0, acceptance typical"
    topk = [{"question_id": 0, "method": "top_k", "method_params": {"top_k": 3}, "tokens": [1]}]
    assert decoding_line(topk) == "sampled: top_k: top-k 3"
    # per-category temperatures: each label's temperatures named, greedy prompts said, the table named
    cat = [{**_rec(0, "medusa", temperature=0.7, acceptance="typical"), "category_temperatures": "mt-bench"},
           {**_rec(1, "medusa", temperature=0.1, acceptance="typical"), "category_temperatures": "mt-bench"},
           {**_rec(2, "medusa"), "category_temperatures": "mt-bench"}]
    assert decoding_line(cat) == ("each prompt at its category's temperature (mt-bench) - sampled: medusa: temperature "
                                  "0.7, acceptance typical or temperature 0.1, acceptance typical (greedy where the "
                                  "prompt's temperature is 0)")
    meta = measured_header({"model": "m", "sources": "s"}, same)
    assert list(meta) == ["model", "prompts", "decoding", "sources"]
    write_table(pd.DataFrame({"a": [1]}), "t", tmp_path, {"model": "m"}, runs=uneven)
    assert header((tmp_path / "t.md").read_text())["prompts"].startswith("2-3 per cell")


def test_a_cut_sweep_is_stated_from_the_values(R, tmp_path):
    from common.harness.report import cut_line
    assert cut_line("EPTs", [1, 2, 5, 10], [1, 2, 5, 10, 20, 50, 100]) == "EPTs 1, 2, 5, 10 of the paper's 1, 2, 5, 10, 20, 50, 100"
    assert cut_line("epochs", [1, 2, 3, 4], [1, 2, 3]) is None                        # nothing cut
    assert cut_line("layers", range(1, 11), range(1, 101)) == "layers 1-10 of the paper's 1-100"
    R.cut("EPTs", [1, 10], [1, 100])
    R.save_table(pd.DataFrame({"a": [1.0]}), {"model": "m", "sources": "s"})
    R.setup_only("x")
    R.publish()
    head = header(_md(tmp_path))
    assert head["cut"] == "EPTs 1, 10 of the paper's 1, 100" and list(head)[-1] == "sources"
