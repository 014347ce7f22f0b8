"""Write ``.dev/jobs.sh``: the workflow's own commands for TARGETs, to run on the lent GPU.

Trainings that feed accuracy tables only (no timing) may run on a GPU (docs/operations.md). This
asks Snakemake for the plan that makes the targets here (``snakemake -n -p -f``), takes each job's
shell command as the rule wrote it, with ``--device cuda`` for ``--device cpu`` and the image's
``python3`` for this venv's, and writes a script that the second device call runs
(``. tools/device/model.sh`` first: the model and ShareGPT rebuilt there). The jobs run side by
side, ``JOBS`` at once (default 8); each job's outputs and its log then go to
``$OUT`` with their paths, so the files that come back drop into this tree as they are.

    python tools/device/jobs.py results/firp/raw/train_k1l14_stats.json ... --rules firp_train

A plan in which one job reads another's output is refused (side by side they would race): run
the first job's call, bring its files back, then plan the rest. So is a job that needs a file the
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


def script(jobs: list[dict], header: str) -> str:
    """The second call's script: the model rebuilt, the jobs side by side, their files to $OUT."""
    made = {p for j in jobs for p in j["outputs"]}
    for j in jobs:
        if j["shell"] is None:
            raise ValueError(f"rule {j['rule']} printed no shell command (a run: block cannot travel)")
        raced = sorted(set(j["inputs"]) & made)
        if raced:
            raise ValueError(f"rule {j['rule']} reads {', '.join(raced)}, which another job of the plan writes: "
                             "plan and run the first job alone, bring its files back, then the rest")
        missing = sorted(p for p in j["inputs"] if p.startswith(".cache/") and not (ROOT / p).exists())
        if missing:
            raise ValueError(f"rule {j['rule']} needs {', '.join(missing)}, which is not built here")
    lines = [header, "set -o pipefail", ". tools/device/model.sh", 'J=${JOBS:-8}', 'mkdir -p "$OUT/logs"']
    for i, j in enumerate(jobs):
        dirs = sorted({str(Path(p).parent) for p in [*j["outputs"], *([j["log"]] if j["log"] else [])]})
        lines.append(f"mkdir -p {' '.join(shlex.quote(d) for d in dirs)}")
        lines.append('while [ "$(jobs -rp | wc -l)" -ge "$J" ]; do sleep 2; done')
        lines.append(f"( {device_command(j['shell'])} ) > \"$OUT/logs/{i:02d}_{j['rule']}.out\" 2>&1 &")
    lines.append("wait")
    # every output and log (a checkpoint too: the plan here then finds its rule's outputs whole);
    # the call's return drops a file over its size limit and says so
    back = [p for j in jobs for p in [*j["outputs"], *([j["log"]] if j["log"] else [])]]
    lines.append("for p in " + " ".join(shlex.quote(p) for p in back) + "; do")
    lines.append('  [ -f "$p" ] && mkdir -p "$OUT/$(dirname "$p")" && cp "$p" "$OUT/$p"')
    lines.append("done")
    lines.append('ls -laR "$OUT"')
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("targets", nargs="+", help="files the workflow makes (forced, like snakemake -f)")
    ap.add_argument("--rules", nargs="+", required=True, help="the rules allowed to run (snakemake --allowed-rules)")
    ap.add_argument("--profile", default="embedded")
    ap.add_argument("--out", type=Path, default=ROOT / ".dev" / "jobs.sh")
    a = ap.parse_args(argv)
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
        text = script(jobs, f"# tools/device/jobs.py {' '.join(a.targets)} (rules {' '.join(a.rules)}; tree at {version})")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(text)
    reads = sorted({p for j in jobs for p in j["inputs"] if p.startswith("results/")})
    cached = sorted({p for j in jobs for p in j["inputs"] if p.startswith(".cache/")})
    print(f"{len(jobs)} jobs ({', '.join(sorted({j['rule'] for j in jobs}))}) -> {a.out}")
    print("keep in the tree when results/ moves aside:", " ".join(reads) or "nothing")
    print("carry (git-ignored, the call leaves them behind otherwise):", " ".join(cached) or "nothing")
    print(f"second call: CODE_VERSION={version} bash {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
