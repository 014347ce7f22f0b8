"""Raw records under results/ come only from committed code (common.records.traced_path)."""
import subprocess

import pytest

from common import records
from common.errors import UserError


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A git checkout with one committed code file, standing in for this repository."""
    def git(*a):
        subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True)
    git("init", "-q")
    git("config", "user.email", "t@t")
    git("config", "user.name", "t")
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "old.jsonl").write_text("{}\n")
    git("add", "code.py", "results/old.jsonl")
    git("commit", "-q", "-m", "c")
    monkeypatch.setattr(records, "REPO", tmp_path)
    monkeypatch.delenv(records.EXPLORATORY_ENV, raising=False)
    monkeypatch.delenv("CODE_VERSION", raising=False)
    return tmp_path


def test_clean_tree_writes_under_results(repo):
    records.write_jsonl(repo / "results" / "r.jsonl", [{"a": 1}])
    assert records.read_jsonl(repo / "results" / "r.jsonl") == [{"a": 1}]


def test_changed_results_alone_do_not_count(repo):
    (repo / "results" / "old.jsonl").write_text('{"b": 2}\n')  # a rerun's records are not code
    records.write_json(repo / "results" / "s.json", {"a": 1})
    assert (repo / "results" / "s.json").is_file()


def test_dirty_tree_is_refused_naming_the_files(repo):
    (repo / "code.py").write_text("x = 2\n")
    with pytest.raises(UserError, match=r"refusing to write .*r\.jsonl: tracked code has uncommitted changes \(code\.py\)"):
        records.write_jsonl(repo / "results" / "r.jsonl", [{"a": 1}])
    with pytest.raises(UserError, match="code.py"):
        records.write_json(repo / "results" / "s.json", {})
    assert not (repo / "results" / "r.jsonl").exists() and not (repo / "results" / "s.json").exists()
    records.write_jsonl(repo / "elsewhere" / "r.jsonl", [{"a": 1}])  # outside results/: no check
    assert (repo / "elsewhere" / "r.jsonl").is_file()


def test_exploratory_run_writes_elsewhere(repo, monkeypatch, capsys):
    (repo / "code.py").write_text("x = 2\n")
    monkeypatch.setenv(records.EXPLORATORY_ENV, "1")
    with records.JsonlWriter(repo / "results" / "pkg" / "r.jsonl") as w:
        w.write({"a": 1})
    assert not (repo / "results" / "pkg" / "r.jsonl").exists()
    assert records.read_jsonl(repo / ".cache" / "exploratory" / "results" / "pkg" / "r.jsonl") == [{"a": 1}]
    assert "exploratory" in capsys.readouterr().err


def test_the_cli_error_is_one_line(repo, monkeypatch, capsys):
    from common.errors import cli_main
    (repo / "code.py").write_text("x = 2\n")
    with pytest.raises(SystemExit) as e:
        cli_main(lambda: records.write_jsonl(repo / "results" / "r.jsonl", [{}]))
    assert e.value.code != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: refusing to write")
