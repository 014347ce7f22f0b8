"""Raw records under results/ come only from committed code (common.records.traced_path)."""
import json
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
    (tmp_path / "notes.md").write_text("notes\n")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "old.jsonl").write_text("{}\n")
    git("add", "code.py", "notes.md", "results/old.jsonl")
    git("commit", "-q", "-m", "c")
    monkeypatch.setattr(records, "REPO", tmp_path)
    monkeypatch.delenv(records.EXPLORATORY_ENV, raising=False)
    monkeypatch.delenv("CODE_VERSION", raising=False)
    monkeypatch.setattr(records, "_CLEAN_AT_START", False)  # no run started in this process
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


def test_a_run_started_on_uncommitted_code_is_refused_at_its_start(repo):
    (repo / "code.py").write_text("x = 2\n")
    with pytest.raises(UserError, match=r"refusing to write .*r\.jsonl: .*code\.py"):
        records.check_start(repo / "results" / "r.jsonl", None)
    records.check_start(repo / "elsewhere" / "r.jsonl")  # outside results/: no check
    assert not records._CLEAN_AT_START


def test_a_run_started_clean_is_refused_only_for_files_it_imported(repo, monkeypatch):
    (repo / "notes.md").write_text("edited\n")  # without a clean start, any tracked edit refuses
    with pytest.raises(UserError, match="notes.md"):
        records.write_json(repo / "results" / "s.json", {})
    (repo / "notes.md").write_text("notes\n")
    records.check_start(repo / "results" / "s.json")
    assert records._CLEAN_AT_START
    monkeypatch.setattr(records, "_imported_files", lambda: {"code.py"})  # what this "process" loaded
    (repo / "notes.md").write_text("edited beside the run\n")
    records.write_json(repo / "results" / "s.json", {"a": 1})  # the run's code is still the commit's
    assert json.loads((repo / "results" / "s.json").read_text()) == {"a": 1}
    (repo / "code.py").write_text("x = 2\n")
    with pytest.raises(UserError, match=r"uncommitted changes \(code\.py\)"):
        records.write_json(repo / "results" / "t.json", {})
    assert not (repo / "results" / "t.json").exists()


def test_imported_files_names_this_process_modules_relative_to_the_repository():
    assert "common/records.py" in records._imported_files()
