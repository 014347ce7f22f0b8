"""The re-render check (tools/check_rerender.py): it catches a stale table and nothing else."""
import importlib.util
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("check_rerender", ROOT / "tools" / "check_rerender.py")
cr = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cr)

CSV = "dataset,k,trained,p\nSQuAD,1,Y,5.49\nWMT,1,N,0.1234567890123\n"
MD = "# t\n\n- **trend**: 90/90\n\n| a |\n|--:|\n| 5.490 |\n"


def test_identical_tables_pass():
    assert cr.table_differences({"p/tables/t.csv": CSV, "p/tables/t.md": MD},
                                {"p/tables/t.csv": CSV, "p/tables/t.md": MD}) == []


def test_float_noise_in_the_last_bits_passes():
    noisy = CSV.replace("0.1234567890123", "0.12345678901230001")
    assert cr.table_differences({"t.csv": CSV}, {"t.csv": noisy}) == []


def test_a_stale_value_fails_and_is_named():
    stale = CSV.replace("5.49", "10.98")
    diffs = cr.table_differences({"t.csv": CSV}, {"t.csv": stale})
    assert len(diffs) == 1 and "row 1" in diffs[0] and "'p'" in diffs[0] and "10.98" in diffs[0]
    diffs = cr.table_differences({"t.md": MD}, {"t.md": MD.replace("90/90", "88/90")})
    assert diffs and "88/90" in diffs[0]


def test_missing_new_and_reshaped_tables_fail():
    assert cr.table_differences({"a.csv": CSV}, {}) == ["a.csv: no longer written by the re-render"]
    assert "not committed" in cr.table_differences({}, {"a.csv": CSV})[0]
    assert "rows" in cr.table_differences({"a.csv": CSV}, {"a.csv": CSV + "X,3,N,1\n"})[0]
    assert "columns" in cr.table_differences({"a.csv": CSV}, {"a.csv": CSV.replace("trained", "head")})[0]


def test_every_figure_artifact_writes_a_table():
    import yaml
    artifacts = yaml.safe_load((ROOT / "config" / "artifacts.yaml").read_text())
    assert cr.figures_without_table(artifacts) == []
    assert cr.figures_without_table({"x.fig": {"outputs": ["figure"]}}) == ["x.fig"]


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "pkg" / "tables").mkdir(parents=True)
    (tmp_path / "pkg" / "tables" / "x.csv").write_text(CSV)
    (tmp_path / "pkg" / "tables" / "x.md").write_text(MD)
    return tmp_path


def _fake_render(rewrite, rc=0):
    def run(cmd, cwd):
        assert "--forceall" in cmd and not any("rerun" in c for c in cmd)  # never reruns an experiment
        rewrite()
        return subprocess.CompletedProcess(cmd, rc)
    return run


def test_main_fails_on_a_deliberately_stale_table(tree, monkeypatch, capsys):
    # The committed table is stale: the render (here faked) writes what the records say.
    monkeypatch.setattr(cr.subprocess, "run", _fake_render(
        lambda: (tree / "pkg" / "tables" / "x.csv").write_text(CSV.replace("5.49", "10.98"))))
    assert cr.main(["--results", str(tree)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "10.98" in err


def test_main_passes_when_the_render_changes_nothing(tree, monkeypatch, capsys):
    monkeypatch.setattr(cr.subprocess, "run", _fake_render(lambda: None))
    assert cr.main(["--results", str(tree)]) == 0
    assert "2 table files unchanged" in capsys.readouterr().out


def test_main_fails_when_the_render_fails(tree, monkeypatch, capsys):
    monkeypatch.setattr(cr.subprocess, "run", _fake_render(lambda: None, rc=1))
    assert cr.main(["--results", str(tree)]) == 1
    assert "re-render failed" in capsys.readouterr().err
