"""tools/device/jobs.py: a dry run's printout becomes the GPU call's script (the rule's own
command on CUDA, its files back to $OUT); a plan whose jobs read each other's outputs is refused."""
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "device"))
import jobs  # noqa: E402

PY = "/repo/.venv/bin/python"
PLAN = f"""Building DAG of jobs...
rule firp_train:
    input: results/corpus/embedded/stats.json
    output: .cache/components/embedded/firp_maps/k1l14/maps.pt, results/firp/raw/train_k1l14_stats.json
    log: .cache/logs/embedded/firp_train_k1l14.log
    jobid: 1
    wildcards: firpv=k1l14
Shell command: HF_HUB_OFFLINE=1 {PY} -m firp.train --model m --device cpu --threads 2 > .cache/logs/embedded/firp_train_k1l14.log 2>&1

rule firp_train:
    input: results/corpus/embedded/stats.json
    output: .cache/components/embedded/firp_maps/k1l19/maps.pt, results/firp/raw/train_k1l19_stats.json
    log: .cache/logs/embedded/firp_train_k1l19.log
Shell command: HF_HUB_OFFLINE=1 {PY} -m firp.train --model m --layers 19 --device cpu --threads 2
Job stats:
"""


def test_a_plan_becomes_the_calls_script():
    plan = jobs.parse_plan(PLAN)
    assert [j["rule"] for j in plan] == ["firp_train", "firp_train"]
    assert plan[0]["outputs"][1] == "results/firp/raw/train_k1l14_stats.json"
    assert plan[1]["log"] == ".cache/logs/embedded/firp_train_k1l19.log"
    text = jobs.script(plan, "# header")
    assert text.count("python3 -m firp.train") == 2 and "--device cpu" not in text and PY not in text
    assert ". tools/device/model.sh" in text and text.rstrip().endswith('ls -la "$OUT"')
    assert "results/firp/raw/train_k1l19_stats.json" in text.split("for p in ")[1]
    assert "tools/keep_components.py keep" not in text  # no whole model among the outputs


def test_jobs_that_read_each_others_outputs_are_refused():
    plan = jobs.parse_plan(PLAN)
    plan[1]["inputs"] = ["results/firp/raw/train_k1l14_stats.json"]
    with pytest.raises(ValueError, match="another job of the plan writes"):
        jobs.script(plan, "#")
    plan = jobs.parse_plan(PLAN.replace("--device cpu --threads 2 >", "--threads 2 >"))
    with pytest.raises(ValueError, match="without --device cpu"):
        jobs.script(plan, "#")


def _run_return(tree: Path, back: list[str], piece_mib: float, keep_stub: str | None = None) -> Path:
    """Run the script's return lines in ``tree`` (as the device call does, $OUT empty);
    ``keep_stub``: a shell script standing in for tools/keep_components.py keep (PY)."""
    out = tree / "OUT"
    out.mkdir()
    env = {"OUT": str(out), "PATH": "/usr/bin:/bin"}
    if keep_stub:
        (tree / "stub.sh").write_text(keep_stub)
        env["PY"] = f"bash {tree / 'stub.sh'}"
    r = subprocess.run(["bash", "-c", "\n".join(jobs.return_lines(back, piece_mib))], cwd=tree, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0 and "error:" not in r.stdout + r.stderr, r.stdout + r.stderr
    return out


def test_the_returned_pieces_are_small_enough_and_unpack_to_the_same_files(tmp_path):
    """A call brings back at most 8 files of 16 MiB, no more than 2 folders down: the outputs come
    back as one tar in pieces, and --unpack puts every file at its path again."""
    tree, home = tmp_path / "device", tmp_path / "home"
    files = {"results/firp/raw/train_k1l14_stats.json": b"{}" * 10,
             ".cache/components/embedded/firp_maps/k1l14/maps.pt": bytes(range(256)) * 20,
             ".cache/logs/embedded/firp_train_k1l14.log": b"done\n"}
    for p, data in files.items():
        (tree / p).parent.mkdir(parents=True, exist_ok=True)
        (tree / p).write_bytes(data)
    out = _run_return(tree, [*files, "results/firp/raw/not_written.json"], piece_mib=2048 / 2**20)
    pieces = sorted(out.iterdir())
    assert len(pieces) >= 3 and all(p.is_file() and p.stat().st_size <= 2048 for p in pieces)
    assert sorted(jobs.unpack(out, home)) == sorted(files)
    assert all((home / p).read_bytes() == data for p, data in files.items())


def test_a_whole_model_comes_back_kept_in_parts_not_as_its_folder(tmp_path):
    tree, home = tmp_path / "device", tmp_path / "home"
    model = tree / ".cache/components/embedded/draft/model"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"w" * 5000)  # far over a piece: must not travel
    (tree / "results/cross/raw").mkdir(parents=True)
    (tree / "results/cross/raw/draft_stats.json").write_text("{}")
    stub = ('[ "$2 $3 $4" = "keep cross draft" ] || exit 1\n'
            'mkdir -p results/cross/checkpoints/embedded/draft/model\n'
            'echo part > results/cross/checkpoints/embedded/draft/model/model.safetensors.delta.part00\n')
    back = [".cache/components/embedded/draft/model/config.json", "results/cross/raw/draft_stats.json"]
    out = _run_return(tree, back, piece_mib=4096 / 2**20, keep_stub=stub)
    names = jobs.unpack(out, home)
    assert "results/cross/checkpoints/embedded/draft/model/model.safetensors.delta.part00" in names
    assert "results/cross/raw/draft_stats.json" in names and not any(n.startswith(".cache/") for n in names)


@pytest.mark.parametrize("fault", ["gap", "truncated", "none"])
def test_missing_or_truncated_pieces_are_one_error_and_write_nothing(tmp_path, fault, capsys):
    tree, home = tmp_path / "device", tmp_path / "home"
    (tree / "results").mkdir(parents=True)
    (tree / "results" / "a.bin").write_bytes(bytes(range(256)) * 40)
    out = _run_return(tree, ["results/a.bin"], piece_mib=4096 / 2**20)
    pieces = sorted(out.iterdir())
    if fault == "gap":
        pieces[1].unlink()
    elif fault == "truncated":  # the last pieces lost: the file's data ends early (not just the tar's padding)
        for p in pieces[2:]:
            p.unlink()
    else:
        for p in pieces:
            p.unlink()
    home.mkdir()
    with pytest.raises(ValueError):
        jobs.unpack(out, home)
    assert not list(home.iterdir())
    assert jobs.main(["--unpack", str(out)]) == 2  # refused before writing (above), so the tree is safe
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


CHAINED = f"""rule distill_draft:
    input: .cache/components/embedded/teacher.pt, results/corpus/embedded/stats.json
    output: .cache/components/embedded/draft/model/config.json, results/cross/raw/draft_stats.json
    log: .cache/logs/embedded/distill_draft.log
Shell command: {PY} -m common.components.draft_model --teacher .cache/components/embedded/teacher.pt --corpus-dir results/corpus/embedded --device cpu --threads 2

rule teacher_cache:
    input: results/corpus/embedded/stats.json
    output: .cache/components/embedded/teacher.pt, results/cross/raw/teacher_stats.json
    log: .cache/logs/embedded/teacher_cache.log
Shell command: {PY} -m common.training.teacher --teacher .cache/components/embedded/teacher.pt --device cpu --threads 2
"""


def test_chained_jobs_run_after_what_they_read_and_the_pass_stays_behind():
    """The draft on a lent GPU in one call: the teacher pass first (the printout lists it second),
    the draft after it; the pass's cache is not brought back, its stats and the kept draft are."""
    plan = jobs.parse_plan(CHAINED)
    with pytest.raises(ValueError, match="--chain them"):
        jobs.script(plan, "#")
    text = jobs.script(plan, "#", chain=True)
    assert text.index("-m common.training.teacher") < text.index("-m common.components.draft_model") and " &\n" not in text
    back = text.split("for p in ")[1].split(";")[0]
    assert "teacher.pt" not in back and "results/cross/raw/teacher_stats.json" in back
    assert "results/cross/checkpoints/embedded/draft" in back and "model/config.json" not in back
    assert "tools/keep_components.py keep cross draft --profile embedded" in text
    assert [j["rule"] for j in jobs.in_order(plan)] == ["teacher_cache", "distill_draft"]


def test_a_chained_job_stops_the_rest_when_it_fails(tmp_path):
    """Run the chain's job lines with stand-in commands: the first fails, the second never runs."""
    plan = jobs.parse_plan(CHAINED)
    plan[1]["shell"] = "false --device cpu"
    plan[0]["shell"] = "touch ran --device cpu"
    text = jobs.script(plan, "#", chain=True)
    body = [l for l in text.splitlines() if l.startswith(("mkdir", "ok=", "[ $ok"))]
    r = subprocess.run(["bash", "-c", "\n".join(body)], cwd=tmp_path, capture_output=True, text=True)
    assert "error: rule teacher_cache failed" in r.stdout and not (tmp_path / "ran").exists()


def test_what_to_keep_when_results_moves_aside_names_the_folders_commands_read():
    """The teacher pass and the draft read the corpus's shards through --corpus-dir, not only the
    stats.json their rules declare: the whole folder stays when results/ moves aside."""
    plan = jobs.parse_plan(CHAINED)
    assert jobs.results_read(plan) == ["results/corpus/embedded/"]
    assert jobs.results_read(jobs.parse_plan(PLAN)) == ["results/corpus/embedded/stats.json"]
