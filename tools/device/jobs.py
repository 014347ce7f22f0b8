"""Write ``.dev/jobs.sh``: the workflow's own commands for TARGETs, to run on the lent GPU.

Trainings that feed accuracy tables only (no timing) may run on a GPU (docs/operations.md). This
asks Snakemake for the plan that makes the targets here (``snakemake -n -p -f``), takes each job's
shell command as the rule wrote it, with ``--device cuda`` for ``--device cpu`` and the image's
``python3`` for this venv's, and writes a script that the second device call runs
(``. tools/device/model.sh`` first: the model and ShareGPT rebuilt there). The jobs run side by
side, ``JOBS`` at once (default 8); each job's outputs and its log then come back in one tar
split into 16 MiB pieces (``$OUT/back.tar.0``, ...: a call brings back at most 8 files of at most
16 MiB, 64 MiB together, no more than 2 folders down), which ``--unpack`` drops into this tree with
their paths. A whole model (a ``model/`` folder: the distilled draft, BiLD's small models; 162 MiB
of weights) comes back as ``tools/keep_components.py keep`` keeps it, its delta against the base model
in parts (54 MiB for the draft), and ``tools/keep_components.py restore cross`` rebuilds it here byte
for byte.

    python tools/device/jobs.py results/firp/raw/train_k1l14_stats.json ... --rules firp_train
    python tools/device/jobs.py --unpack <the call's files_at>      # afterwards, here

A plan in which one job reads another's output is refused (side by side they would race) unless
``--chain`` runs its jobs one after another in one call (the teacher pass, then the draft trained
on it: the pass's cache, gigabytes, stays on the machine); otherwise run the first job's call,
bring its files back, then plan the rest. So is a job that needs a file the
call does not carry (a component folder under ``.cache``): the inputs it lists under ``results/``
must stay in the tree when ``results/`` is moved aside for the call.
"""
from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SNAKEMAKE = ROOT / ".venv" / "bin" / "snakemake"
PIECE_MIB = 16   # a device call brings back files of at most 16 MiB ...
BACK_MIB = 64    # ... 64 MiB together
BACK = "back.tar."
# a whole model's rule output: its folder's config.json (the weights beside it are far over a piece)
WHOLE_MODEL = re.compile(r"^\.cache/components/(?P<profile>[^/]+)/(?P<comp>.+)/model/config\.json$")


def parse_plan(text: str) -> list[dict]:
    """The jobs of a ``snakemake -n -p`` printout: ``{"rule", "inputs", "outputs", "log", "shell"}``
    each, in the printout's order."""
    jobs: list[dict] = []
    cur: dict | None = None
    for line in text.splitlines():
        head = re.match(r"^(?:local)?rule (\w+):\s*$", line)
        if head:
            cur = {"rule": head.group(1), "inputs": [], "outputs": [], "log": None, "shell": None}
            jobs.append(cur)
            continue
        if cur is None:
            continue
        field = re.match(r"^\s+(input|output|log): (.*)$", line)
        if field:
            paths = [p.strip() for p in field.group(2).split(",") if p.strip()]
            if field.group(1) == "log":
                cur["log"] = paths[0] if paths else None
            else:
                cur[field.group(1) + "s"] = paths
        elif line.startswith("Shell command: ") and cur["shell"] is None:
            cur["shell"] = line.removeprefix("Shell command: ").strip()
    return jobs


VENV_PYTHON = re.compile(r"\S*/\.venv/bin/python3?(?=\s)")


def device_command(shell: str) -> str:
    """``shell`` for the GPU machine: the image's ``python3`` for a venv's, CUDA for the CPU."""
    cmd = VENV_PYTHON.sub("python3", shell)
    if "--device cpu" not in cmd:
        raise ValueError(f"a job without --device cpu cannot move to the GPU: {shell[:200]}")
    return cmd.replace("--device cpu", "--device cuda")


def in_order(jobs: list[dict]) -> list[dict]:
    """``jobs`` with each one after the jobs that write its inputs (a dry run's printout is in no
    such order); a cycle is a ``ValueError``."""
    maker = {p: i for i, j in enumerate(jobs) for p in j["outputs"]}
    done, order = set(), []

    def visit(i, path=()):
        if i in path:
            raise ValueError(f"rules {', '.join(jobs[k]['rule'] for k in path)} read each other's outputs in a cycle")
        if i in done:
            return
        for p in jobs[i]["inputs"]:
            if p in maker:
                visit(maker[p], (*path, i))
        done.add(i)
        order.append(jobs[i])

    for i in range(len(jobs)):
        visit(i)
    return order


def script(jobs: list[dict], header: str, chain: bool = False) -> str:
    """The second call's script: the model rebuilt, the jobs side by side (``chain``: one after
    another, each after the jobs it reads from, stopping at the first failure), their files to
    $OUT. What a job writes only for another job of the plan (under ``.cache/``: the teacher pass
    a chained draft reads) stays there; the records, the components and the logs come back."""
    made = {p for j in jobs for p in j["outputs"]}
    read = {p for j in jobs for p in j["inputs"]}
    for j in jobs:
        if j["shell"] is None:
            raise ValueError(f"rule {j['rule']} printed no shell command (a run: block cannot travel)")
        raced = sorted(set(j["inputs"]) & made)
        if raced and not chain:
            raise ValueError(f"rule {j['rule']} reads {', '.join(raced)}, which another job of the plan writes: "
                             "--chain them, or plan and run the first job alone, bring its files back, then the rest")
        missing = sorted(p for p in j["inputs"] if p.startswith(".cache/") and p not in made and not (ROOT / p).exists())
        if missing:
            raise ValueError(f"rule {j['rule']} needs {', '.join(missing)}, which is not built here")
    jobs = in_order(jobs) if chain else jobs
    lines = [header, "set -o pipefail", ". tools/device/model.sh", 'J=${JOBS:-8}', "mkdir -p .dev/out", "ok=1"]
    outs = []
    for i, j in enumerate(jobs):
        dirs = sorted({str(Path(p).parent) for p in [*j["outputs"], *([j["log"]] if j["log"] else [])]})
        lines.append(f"mkdir -p {' '.join(shlex.quote(d) for d in dirs)}")
        outs.append(f".dev/out/{i:02d}_{j['rule']}.out")
        run = f"( {device_command(j['shell'])} ) > {outs[-1]} 2>&1"
        if chain:
            lines.append(f'[ $ok = 1 ] && {{ {run} || {{ ok=0; echo "error: rule {j["rule"]} failed: {outs[-1]}"; }}; }}')
        else:
            lines.append('while [ "$(jobs -rp | wc -l)" -ge "$J" ]; do sleep 2; done')
            lines.append(f"{run} &")
    lines.append("wait")
    # every output and log (a checkpoint too: the plan here then finds its rule's outputs whole),
    # but a cache file another job of the plan read (it stays on the machine)
    back = [p for j in jobs for p in [*j["outputs"], *([j["log"]] if j["log"] else [])]
            if not (p in read and p.startswith(".cache/components/"))]
    lines += return_lines([*back, *outs])
    lines.append('ls -la "$OUT"')
    return "\n".join(lines) + "\n"


# a folder a command reads whole, beside the one file its rule declares (the corpus's shards beside stats.json)
DIR_FLAG = re.compile(r"--[\w-]*dir\s+(results/\S+)")


def results_read(jobs: list[dict]) -> list[str]:
    """What the jobs read under ``results/`` (to keep in the tree when ``results/`` moves aside for
    a call): their declared inputs, and the folders their commands name with a ``--…-dir`` flag
    (``--corpus-dir results/corpus/embedded``: every shard, not only the declared stats.json)."""
    made = {p for j in jobs for p in j["outputs"]}
    files = {p for j in jobs for p in j["inputs"] if p.startswith("results/") and p not in made}
    folders = {m.rstrip("/") + "/" for j in jobs for m in DIR_FLAG.findall(j["shell"] or "")}
    return sorted(folders | {p for p in files if not any(p.startswith(f) for f in folders)})


def return_lines(back: list[str], piece_mib: float = PIECE_MIB) -> list[str]:
    """Shell lines that bring the files ``back`` (paths in the tree; a missing one is skipped)
    home through ``$OUT``: each whole model kept first (:data:`WHOLE_MODEL`; its ``model/`` folder
    stays behind, its kept delta in parts goes instead), then all of them in one tar split into
    pieces of ``piece_mib`` MiB; a return over what a call brings back is one ``error:`` line."""
    models = [m for m in map(WHOLE_MODEL.match, back) if m]
    folders = [m.group(0).removesuffix("config.json") for m in models]
    files = [p for p in back if not any(p.startswith(f) for f in folders)]
    lines = []
    for m in models:
        lines.append(f"${{PY:-python3}} tools/keep_components.py keep cross {shlex.quote(m['comp'])} --profile {m['profile']}"
                     f" --part-mib {piece_mib} || echo 'error: {m['comp']} was not kept: its weights cannot come back'")
        files.append(f"results/cross/checkpoints/{m['profile']}/{m['comp']}")
    lines.append("back=(); for p in " + " ".join(shlex.quote(p) for p in files) + '; do [ -e "$p" ] && back+=("$p"); done')
    lines.append(f'tar -cf - "${{back[@]}}" | split -b {int(piece_mib * 2**20)} -d -a 1 - "$OUT/{BACK}"')
    lines.append(f'n=$(cat "$OUT"/{BACK}* | wc -c); [ "$n" -le {BACK_MIB * 2**20} ] || echo "error: $n bytes to bring back, '
                 f'over the {BACK_MIB} MiB a call returns; valid: fewer jobs a call"')
    return lines


def unpack(folder: Path, root: Path = ROOT) -> list[str]:
    """Extract the pieces ``folder/back.tar.0``, ... (a call's returned files) into ``root``;
    returns the files extracted. A gap in the pieces' numbering or a truncated tar is one
    ``ValueError``, before anything is written; a member outside the tree is refused (tarfile's
    ``data`` filter)."""
    import io
    import tarfile

    pieces = sorted(Path(folder).glob(BACK + "[0-9]*"), key=lambda p: int(p.name.removeprefix(BACK)))
    if not pieces:
        raise ValueError(f"{folder} holds no {BACK}N pieces; valid: the folder a call's files came back in")
    numbers = [int(p.name.removeprefix(BACK)) for p in pieces]
    if numbers != list(range(len(pieces))):
        raise ValueError(f"the pieces in {folder} are {numbers}, not 0..{len(pieces) - 1}: a piece did not come back")
    data = io.BytesIO(b"".join(p.read_bytes() for p in pieces))
    try:
        with tarfile.open(fileobj=data, mode="r:") as tar:
            members = tar.getmembers()  # reads the whole archive: a truncated one fails here, before any write
            tar.extractall(root, members=members, filter="data")
    except (tarfile.TarError, EOFError) as e:
        raise ValueError(f"the pieces in {folder} are not a whole tar ({e}); valid: every piece the call wrote") from None
    return [m.name for m in members if m.isfile()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("targets", nargs="*", help="files the workflow makes (forced, like snakemake -f)")
    ap.add_argument("--rules", nargs="+", help="the rules allowed to run (snakemake --allowed-rules)")
    ap.add_argument("--profile", default="embedded")
    ap.add_argument("--out", type=Path, default=ROOT / ".dev" / "jobs.sh")
    ap.add_argument("--chain", action="store_true", help="run the jobs one after another, each after those it "
                    "reads from (the teacher pass, then the draft trained on it), in one call")
    ap.add_argument("--unpack", type=Path, default=None, help="instead: extract a call's returned pieces "
                    "(its files_at folder) into this tree")
    a = ap.parse_args(argv)
    if a.unpack is not None:
        try:
            names = unpack(a.unpack)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print("\n".join(names))
        if any(n.startswith("results/cross/checkpoints/") for n in names):
            print("whole models came back kept: python tools/keep_components.py restore cross")
        return 0
    if not a.targets or not a.rules:
        print("error: targets and --rules are needed to write a call's script; valid: TARGET... --rules RULE..., "
              "or --unpack FOLDER", file=sys.stderr)
        return 2
    cmd = [str(SNAKEMAKE), "-n", "-p", "-f", *a.targets, "-j1", "--rerun-triggers", "mtime",
           "--allowed-rules", *a.rules, "--config", f"profile={a.profile}", "rerun=true"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        print(f"error: the plan failed: {tail[0]}", file=sys.stderr)
        return 2
    jobs = parse_plan(done.stdout)
    if not jobs:
        print("error: the plan has no job; valid targets are files the workflow makes", file=sys.stderr)
        return 2
    version = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    try:
        text = script(jobs, f"# tools/device/jobs.py {' '.join(a.targets)} (rules {' '.join(a.rules)}; tree at {version})",
                      chain=a.chain)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(text)
    reads = results_read(jobs)
    made = {p for j in jobs for p in j["outputs"]}
    cached = sorted({p for j in jobs for p in j["inputs"] if p.startswith(".cache/") and p not in made})
    print(f"{len(jobs)} jobs ({', '.join(sorted({j['rule'] for j in jobs}))}) -> {a.out}")
    print("keep in the tree when results/ moves aside:", " ".join(reads) or "nothing")
    print("carry (git-ignored, the call leaves them behind otherwise):", " ".join(cached) or "nothing")
    print(f"second call: CODE_VERSION={version} bash {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
