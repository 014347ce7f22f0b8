"""common.harness.render.Render's options for the project's own comparisons: no noise line where the
runs have no A/A pair to state (noise=False), the note shown where the paper's numbers would
stand, and an extra staged folder published with the tables (the Spec-Bench export)."""
import json

import pandas as pd
import pytest

from common.harness.render import Render
from common.harness.summary import header


def bench_file(tmp_path):
    raw = tmp_path / "cross" / "raw"
    raw.mkdir(parents=True)
    path = raw / "bench_x.jsonl"
    path.write_text("".join(json.dumps({"question_id": q, "decoder": d, "tokens": [1], "new_tokens": 1, "steps": 1,
                                        "wall_time": 1.0, "peak_mem_bytes": 1}) + "\n"
                            for q in range(3) for d in ("vanilla", "fast")))
    return str(path)


@pytest.mark.parametrize("noise", [True, False])
def test_noise_line_only_when_asked(tmp_path, noise):
    R = Render("cost.fig", str(tmp_path), "cross", "embedded", inputs=[bench_file(tmp_path)], noise=noise)
    R.save_table(pd.DataFrame({"a": [1.0]}), {"model": "m", "sources": "x", "verdict": "v"})
    R.publish()
    head = header((tmp_path / "cross" / "tables" / "cost.fig.md").read_text())
    assert ("noise" in head) == noise
    # the noise line, then what was measured (prompts per cell, decoding), go just before the sources
    assert list(head) == (["artifact", "model", "verdict", "noise", "prompts", "decoding", "sources"] if noise
                          else ["artifact", "model", "verdict", "prompts", "decoding", "sources"])


def test_note_stands_where_the_papers_numbers_would(tmp_path, capsys):
    R = Render("cost.fig", str(tmp_path), "cross", "embedded", inputs=[bench_file(tmp_path)])
    R.no_paper_numbers("No paper reports this.")
    R.save_table(pd.DataFrame({"a": [1.0]}), {"verdict": "v"})
    R.publish()
    out = capsys.readouterr().out
    assert "### The paper beside ours\n\nNo paper reports this." in out and "reports no number per row" not in out


def test_a_staged_export_is_published_with_the_table(tmp_path):
    R = Render("cost.fig", str(tmp_path), "cross", "embedded", inputs=[bench_file(tmp_path)])
    (R.stage("specbench") / "vanilla.jsonl").write_text("{}\n")
    assert not (tmp_path / "cross" / "specbench").exists()  # nothing in place before publish
    R.save_table(pd.DataFrame({"a": [1.0]}), {"verdict": "v"})
    R.publish()
    assert (tmp_path / "cross" / "specbench" / "vanilla.jsonl").read_text() == "{}\n"
