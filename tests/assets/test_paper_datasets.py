"""The paper profile's hub datasets read through the loader it runs, on hand-written fixtures in
each dataset card's schema and split names (tests/fixtures/datasets, laid out as local copies of
the hub repositories)."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from common.assets import data
from common.config import read_config
from common.assets.data import DATA_ROOT_ENV, EMBEDDED, PAPER_DATASETS, load_dataset_samples
from common.errors import UserError

pytest.importorskip("datasets")
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "datasets"
REPO = Path(__file__).resolve().parents[2]

# name -> (first question id, first prompt, first reference): read off the fixture rows by hand
FIRST = {
    "squad": ("56be4db0acb8001400a502ec",
              "Super Bowl 50 was an American football game played on February 7, 2016, at Levi's Stadium in "
              "Santa Clara, California.\n\nWhere was Super Bowl 50 played?", "Levi's Stadium"),
    "cnn_dm": ("92c514c913c0bdfe25341af9fd72b29db544099b",
               "(CNN) -- A small town library reopened on Monday after a flood closed it for three months. "
               "Volunteers dried and sorted every book, and the council paid for new shelves.",
               "A town library reopens after a flood .\nVolunteers saved the books ."),
    "xsum": ("38264402", "The bridge, which opened in 1890, will close for repairs for six weeks from next month.\n"
             "Drivers are advised to use the ring road instead.",
             "A Victorian bridge is to close for six weeks of repairs."),
    "wmt14-en-fr": ("wmt14-en-fr-0", "Spectacular Wingsuit Jump Over Bogota",
                    "Spectaculaire saut en wingsuit au-dessus de Bogota"),
    "wmt14-de-en": ("wmt14-de-en-0", "Gutach: Noch mehr Sicherheit für Fußgänger",
                    "Gutach: Increased safety for pedestrians"),
    "iwslt2017-de-en": ("iwslt2017-de-en-0", "Vielen Dank, Chris.", "Thank you so much, Chris."),
    "gsm8k": ("gsm8k-0", "Tom has 3 boxes with 4 pencils each. He gives away 5 pencils. How many pencils does he "
              "have left?", "Tom has 3 * 4 = <<3*4=12>>12 pencils.\nHe has 12 - 5 = <<12-5=7>>7 left.\n#### 7"),
    "alpaca": ("alpaca-0", "Give three tips for staying healthy.",
               "1. Eat a balanced diet.\n2. Exercise regularly.\n3. Sleep enough."),
}


@pytest.fixture(autouse=True)
def _no_env_root(monkeypatch):
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)


def test_every_registered_hub_dataset_has_a_fixture():
    assert set(FIRST) == set(PAPER_DATASETS)
    for spec in PAPER_DATASETS.values():
        assert (FIXTURES / spec.path / "README.md").is_file(), spec.path


def test_every_dataset_the_paper_profile_names_is_registered():
    cfg = read_config()
    names = set()

    def walk(x, key=None):
        if isinstance(x, dict):
            for k, v in x.items():
                if k == "dataset" and isinstance(v, str):
                    names.add(v)
                elif k == "datasets" and isinstance(v, dict):
                    names.update(v)
                walk(v, k)
        elif isinstance(x, list):
            for v in x:
                walk(v, key)

    walk(cfg["profiles"]["paper"])
    assert {"squad", "cnn_dm", "xsum", "wmt14-de-en", "wmt14-en-fr", "iwslt2017-de-en", "gsm8k"} <= names
    assert names <= set(EMBEDDED) | set(PAPER_DATASETS), names - set(EMBEDDED) - set(PAPER_DATASETS)


@pytest.mark.parametrize("name", sorted(FIRST))
def test_fixture_reads_through_the_profile_loader(name):
    spec = PAPER_DATASETS[name]
    rows = [json.loads(line) for f in sorted((FIXTURES / spec.path).rglob("*.jsonl"))
            if spec.config is None or f.parent.name == spec.config for line in f.read_text().splitlines()]
    s = load_dataset_samples(name, offline=True, root=FIXTURES)
    assert len(s) == len(rows) >= 2
    qid, prompt, ref = FIRST[name]
    assert (s[0].question_id, s[0].turns, s[0].reference, s[0].category) == (qid, (prompt,), ref, name)
    assert s[0].source == (f"local: {FIXTURES / spec.path}" + (f"/{spec.config}" if spec.config else "")
                           + f" [{spec.split}]")
    assert len({x.question_id for x in s}) == len(s)
    assert [x.question_id for x in load_dataset_samples(name, n=1, offline=True, root=FIXTURES)] == [qid]


def test_root_from_the_environment(monkeypatch):
    monkeypatch.setenv(DATA_ROOT_ENV, str(FIXTURES))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    (x,) = load_dataset_samples("gsm8k", n=1)
    assert x.question_id == "gsm8k-0" and x.source.startswith("local: ")


def _copy(tmp_path, name) -> Path:
    spec = PAPER_DATASETS[name]
    shutil.copytree(FIXTURES / spec.path, tmp_path / spec.path)
    return tmp_path / spec.path


@pytest.mark.parametrize("name,rename,missing", [
    ("cnn_dm", ("highlights", "summary"), "highlights"),
    ("xsum", ("document", "text"), "document"),
    ("gsm8k", ("question", "problem"), "question"),
    ("squad", ("answers", "answer"), "answers.text.0"),
    ("wmt14-de-en", ("translation", "pair"), "translation.de"),
])
def test_wrong_schema_names_the_missing_field(tmp_path, name, rename, missing):
    folder = _copy(tmp_path, name)
    for f in folder.rglob("*.jsonl"):
        rows = [json.loads(line) for line in f.read_text().splitlines()]
        f.write_text("".join(json.dumps({rename[1] if k == rename[0] else k: v for k, v in r.items()}) + "\n"
                             for r in rows))
    with pytest.raises(UserError, match=rf"dataset '{name}' \(local: .*\), row 0: no field '{missing}'") as e:
        load_dataset_samples(name, offline=True, root=tmp_path)
    assert rename[1] in str(e.value) and "\n" not in str(e.value)


def test_wrong_nested_field(tmp_path):
    folder = _copy(tmp_path, "wmt14-de-en")
    f = folder / "de-en" / "test.jsonl"
    f.write_text(json.dumps({"translation": {"en": "Hello", "fr": "Bonjour"}}) + "\n")
    with pytest.raises(UserError, match=r"no field 'translation.de' \(missing 'de'\); the row has: "
                                        r"translation.en, translation.fr"):
        load_dataset_samples("wmt14-de-en", offline=True, root=tmp_path)


def test_parquet_export_layout(tmp_path):
    """IWSLT's hub branch holds a loading script; its parquet export (refs/convert/parquet,
    ``<config>/<split>/NNNN.parquet``, no card) is what a local copy holds."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [json.loads(line) for line in
            (FIXTURES / "IWSLT/iwslt2017/iwslt2017-de-en/test.jsonl").read_text().splitlines()]
    out = tmp_path / "IWSLT/iwslt2017/iwslt2017-de-en/test"
    out.mkdir(parents=True)
    pq.write_table(pa.table({"translation": [r["translation"] for r in rows]}), out / "0000.parquet")
    s = load_dataset_samples("iwslt2017-de-en", offline=True, root=tmp_path)
    assert [x.turns[0] for x in s] == [r["translation"]["de"] for r in rows]
    assert [x.reference for x in s] == [r["translation"]["en"] for r in rows]


def test_missing_copy_and_split(tmp_path):
    with pytest.raises(UserError, match=r"dataset 'xsum': .*EdinburghNLP/xsum does not exist; copy it there with "
                                        r"huggingface-cli download --repo-type dataset EdinburghNLP/xsum"):
        load_dataset_samples("xsum", offline=True, root=tmp_path)
    with pytest.raises(UserError, match=r"could not load dataset 'xsum' .*split 'train'"):
        load_dataset_samples("xsum", split="train", offline=True, root=FIXTURES)


def test_ppd_prompts_cli_reads_the_fixture_and_fails_in_one_line(tmp_path):
    """The paper profile's Table 1 prompts (rule ppdp_prompts) from the SQuAD fixture; a broken
    copy ends in one ``error:`` line naming the field."""
    env = {"PATH": "/usr/bin:/bin", DATA_ROOT_ENV: str(FIXTURES), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf")}
    out = tmp_path / "squad.jsonl"
    cmd = [sys.executable, "-m", "ppd_pipelined.templates", "--task", "squad", "--dataset", "squad",
           "--template", "ppdp-squad", "--n", "2", "--out", str(out)]
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(recs) == 2 and "Where was Super Bowl 50 played?" in recs[0]["turns"][0] and not recs[0]["stand_in"]
    bad = tmp_path / "bad"
    folder = _copy(bad, "squad")
    f = folder / "plain_text" / "validation.jsonl"
    f.write_text(f.read_text().replace('"context"', '"passage"'))
    r = subprocess.run(cmd, cwd=REPO, env={**env, DATA_ROOT_ENV: str(bad)}, capture_output=True, text=True)
    errors = [line for line in r.stderr.strip().splitlines() if line.startswith("error:")]  # the rest: progress bars
    assert r.returncode != 0 and len(errors) == 1 and r.stderr.strip().endswith(errors[0]), r.stderr
    assert "no field 'context'" in errors[0] and "passage" in errors[0]
