#!/usr/bin/env bash
# A real SLURM test: a single-node cluster on this machine runs the smoke profile through
# profiles/slurm (snakemake-executor-plugin-slurm), and its tables must equal a local run's.
#
#   sudo bash tools/test_slurm.sh                   # runs the local smoke DAG too, then the SLURM one
#   sudo bash tools/test_slurm.sh LOCAL_RESULTS     # compare with a finished local smoke run instead
#                                                   # (e.g. .cache/smoke/results after pytest)
#
# Needs root (apt-get; the daemons run as root) and Debian/Ubuntu. It installs slurm-wlm and
# munge when missing (with services kept from starting), then starts its own munged, slurmctld
# and slurmd on 127.0.0.1 with non-default ports, every file under a throwaway state folder
# (nothing in /etc is read or written: clients find the config through SLURM_CONF), runs the
# workflow in a throwaway copy of this checkout (the .venv and the converted model are shared),
# and stops exactly the daemons it started, also when it fails. KEEP=1 keeps the state folder.
# Checks: every job of the run was submitted with sbatch, sacct lists each one COMPLETED with
# the rule in its comment, the SLURM job logs sit under .cache/logs/slurm/, and every table
# equals the local run's except the columns that measure time or memory or name a choice made
# from such a measurement (the hardware-aware tree size, the fastest gamma).
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
LOCAL_RESULTS=${1:+$(cd "$1" && pwd)}
t0=$(date +%s)
say() { echo "test_slurm: $*"; }
die() { echo "error: test_slurm: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (apt-get, and the daemons run as root)"
[ -x "$SRC/.venv/bin/python" ] || die "no $SRC/.venv: run tools/setup.sh first"

# ---------------------------------------------------------------- packages (once)
# slurmdbd and MariaDB's server binaries: sacct needs the accounting database (without it,
# "Slurm accounting storage is disabled"), and the plugin follows its jobs with sacct.
PKGS=(slurm-wlm munge slurmdbd mariadb-server-core mariadb-client-core)
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null \
        || ! command -v munged >/dev/null || ! command -v slurmdbd >/dev/null || ! command -v mariadbd >/dev/null \
        || ! command -v mariadb-install-db >/dev/null; then
    say "installing ${PKGS[*]}"
    made_policy=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then  # keep apt from starting system-wide services
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && made_policy=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${PKGS[@]}" >/dev/null \
        || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${PKGS[@]}" >/dev/null; }
    [ "$made_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
fi

# ---------------------------------------------------------------- a throwaway cluster
STATE=$(mktemp -d /tmp/repro-slurm.XXXXXX)
PIDS=()
cleanup() {
    local rc=$?
    local i pid
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do  # last started first; SIGKILL after 20 s
        pid=${PIDS[i]}
        kill "$pid" 2>/dev/null || continue
        for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill -9 "$pid" 2>/dev/null || true
    done
    if [ "${KEEP:-0}" = 1 ] || [ "$rc" != 0 ]; then say "state kept in $STATE"; else rm -rf "$STATE"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$STATE"/{munge,ctld,spool,log,bin}
chmod 700 "$STATE/munge"
dd if=/dev/urandom of="$STATE/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$STATE/munge/munge.key"
/usr/sbin/munged --force --key-file="$STATE/munge/munge.key" --socket="$STATE/munge/munge.sock" \
    --pid-file="$STATE/munge/munged.pid" --log-file="$STATE/log/munged.log" --seed-file="$STATE/munge/seed" \
    --foreground > "$STATE/log/munged.out" 2>&1 &
PIDS+=($!)

# The accounting database: MariaDB on 127.0.0.1 (its own port and data folder), then slurmdbd.
mariadb-install-db --no-defaults --datadir="$STATE/db" --user=root --skip-test-db > "$STATE/log/mariadb-install.log" 2>&1
/usr/sbin/mariadbd --no-defaults --datadir="$STATE/db" --socket="$STATE/db.sock" --port=26306 \
    --bind-address=127.0.0.1 --skip-name-resolve --user=root --pid-file="$STATE/mariadb.pid" \
    --log-error="$STATE/log/mariadb.log" > "$STATE/log/mariadb.out" 2>&1 &
PIDS+=($!)
for i in $(seq 60); do
    mariadb --no-defaults -S "$STATE/db.sock" -u root -e "select 1" >/dev/null 2>&1 && break
    [ "$i" = 60 ] && { tail -n5 "$STATE/log/mariadb.log"; die "MariaDB did not start"; }
    sleep 0.5
done
DBPASS=$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
mariadb --no-defaults -S "$STATE/db.sock" -u root -e "create database slurm_acct_db;
    create user 'slurm'@'127.0.0.1' identified by '$DBPASS';
    grant all on slurm_acct_db.* to 'slurm'@'127.0.0.1';"

NODE=localhost
CPUS=$(nproc)
MEM=$(( $(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo) * 9 / 10 ))
cat > "$STATE/slurm.conf" <<EOF
ClusterName=repro-test
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=26817
SlurmdPort=26818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$STATE/munge/munge.sock
CredType=cred/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
PlugStackConfig=$STATE/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=26819
AccountingStoragePass=$STATE/munge/munge.sock
AccountingStoreFlags=job_comment
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
MpiDefault=none
ReturnToService=2
MinJobAge=3600
SchedulerType=sched/backfill
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
: > "$STATE/plugstack.conf"
cat > "$STATE/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$STATE/munge/munge.sock
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=26819
SlurmUser=root
PidFile=$STATE/slurmdbd.pid
LogFile=$STATE/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=26306
StorageUser=slurm
StoragePass=$DBPASS
StorageLoc=slurm_acct_db
EOF
chmod 600 "$STATE/slurmdbd.conf"
export SLURM_CONF="$STATE/slurm.conf"  # slurmdbd reads slurmdbd.conf beside it
# The plugin's job step drops SLURM_* variables before its inner srun; this srun brings SLURM_CONF back.
printf '#!/bin/sh\nSLURM_CONF=%s exec /usr/bin/srun "$@"\n' "$SLURM_CONF" > "$STATE/bin/srun"
chmod +x "$STATE/bin/srun"
export PATH="$STATE/bin:$PATH"

/usr/sbin/slurmdbd -D > "$STATE/log/slurmdbd.out" 2>&1 &
PIDS+=($!)
for i in $(seq 60); do
    sacctmgr -n list cluster > "$STATE/log/sacctmgr.out" 2>&1 && break
    [ "$i" = 60 ] && { tail -n5 "$STATE/log/slurmdbd.log" "$STATE/log/sacctmgr.out"; die "slurmdbd did not start"; }
    sleep 0.5
done
/usr/sbin/slurmctld -D -f "$SLURM_CONF" -i > "$STATE/log/slurmctld.out" 2>&1 &
PIDS+=($!)
/usr/sbin/slurmd -D -f "$SLURM_CONF" -N "$NODE" > "$STATE/log/slurmd.out" 2>&1 &
PIDS+=($!)
for i in $(seq 60); do
    state=$(sinfo -h -n "$NODE" -o %T 2>/dev/null || true)
    [ "$state" = idle ] && break
    [ "$i" = 60 ] && { tail -n5 "$STATE"/log/*; die "the node did not come up (state: '$state')"; }
    sleep 1
done
say "cluster up: $CPUS CPUs, ${MEM} MB on node $NODE (state in $STATE)"
if [ "${SLURM_ONLY:-0}" = 1 ]; then  # for debugging: a cluster and a shell, nothing else
    say "SLURM_CONF=$SLURM_CONF PATH=$STATE/bin:\$PATH; exit the shell to stop the daemons"
    bash -i
    exit 0
fi

# ---------------------------------------------------------------- the smoke DAG, locally and on SLURM
# A throwaway copy of the checkout (tracked and untracked, not ignored files) keeps this run's
# .cache, .snakemake and results away from the developer's; the converted model is shared.
WORK="$STATE/repo"
mkdir -p "$WORK"
git -C "$SRC" ls-files -z --cached --others --exclude-standard \
    | (cd "$SRC" && tar --null -T - --ignore-failed-read -cf - 2>/dev/null) | tar -xf - -C "$WORK"
ln -sfn "$(readlink -f "$SRC/.venv")" "$WORK/.venv"
export REPRO_CACHE_DIR=${REPRO_CACHE_DIR:-$SRC/.cache}
SMK=("$WORK/.venv/bin/python" -m snakemake)
cd "$WORK"

if [ -z "$LOCAL_RESULTS" ]; then
    say "local smoke run (log: $STATE/log/local.log)"
    t=$(date +%s)
    "${SMK[@]}" -j"$CPUS" all --config profile=smoke rerun=true > "$STATE/log/local.log" 2>&1 \
        || { tail -n 30 "$STATE/log/local.log"; die "the local smoke run failed"; }
    say "local smoke run: $(( $(date +%s) - t )) s"
    mv .cache/smoke/results "$STATE/local-results"
    LOCAL_RESULTS="$STATE/local-results"
    rm -rf .cache .snakemake
fi

say "smoke run through profiles/slurm (log: $STATE/log/slurm.log)"
t=$(date +%s)
since=$(date +%Y-%m-%dT%H:%M:%S)
# Status checks every few seconds (the plugin waits 40 s by default, right for a busy cluster).
"${SMK[@]}" --profile profiles/slurm all --config profile=smoke rerun=true \
    --slurm-init-seconds-before-status-checks 2 > "$STATE/log/slurm.log" 2>&1 \
    || { tail -n 40 "$STATE/log/slurm.log"; die "the smoke run through SLURM failed"; }
say "smoke run through SLURM: $(( $(date +%s) - t )) s"

# ---------------------------------------------------------------- checks
sacct -X -n -P -S "$since" --format=JobID,State,Start,End,Comment > "$STATE/sacct.txt"
"$WORK/.venv/bin/python" - "$STATE/log/slurm.log" "$STATE/sacct.txt" "$LOCAL_RESULTS" .cache/smoke/results <<'PY'
"""The jobs went through sbatch and sacct; timing rules ran alone; tables equal the local run's."""
import re
import sys
from datetime import datetime
from pathlib import Path

import pandas as pd

log, sacct, local, remote = sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
fail = []
submitted = dict(re.findall(r"Job (\d+) has been submitted with SLURM jobid (\d+)", Path(log).read_text()))
rows = [l.split("|", 4) for l in Path(sacct).read_text().splitlines() if l.strip()]
jobs = {r[0]: r for r in rows}
rule_of = {jid: (re.match(r"rule_(\w+?)(_wildcards_|$)", r[4]) or [None, "?"])[1] for jid, r in jobs.items()}
if len(submitted) < 20:
    fail.append(f"only {len(submitted)} jobs submitted with sbatch")
for jid in submitted.values():
    if jid not in jobs:
        fail.append(f"SLURM job {jid} missing from sacct")
    elif jobs[jid][1] != "COMPLETED":
        fail.append(f"SLURM job {jid} ({rule_of[jid]}) is {jobs[jid][1]}")
rules = sorted(set(rule_of[j] for j in submitted.values() if j in jobs))
for needed in ("selfdistill_corpus", "train_medusa", "distill_draft", "bench_cross", "cost_curve",
               "ppdp_train_heads", "ppdp_bench", "cross_table"):
    if needed not in rules:
        fail.append(f"no SLURM job of rule {needed}")
logs = list(Path(".cache/logs/slurm").rglob("*.log"))
if len(logs) < len(submitted):
    fail.append(f"{len(logs)} SLURM job logs under .cache/logs/slurm for {len(submitted)} jobs")
# timing rules never share the node: no other job's run overlaps theirs
span = {j: (datetime.fromisoformat(jobs[j][2]), datetime.fromisoformat(jobs[j][3])) for j in submitted.values()
        if j in jobs and jobs[j][1] == "COMPLETED"}
for j, (a, b) in span.items():
    if re.search(r"bench|sweep|^cost_curve$", rule_of[j]):  # every rule that times decoding
        for k, (c, d) in span.items():
            if k != j and c < b and d > a:
                fail.append(f"timing job {j} ({rule_of[j]}) overlapped job {k} ({rule_of[k]})")
# tables: equal to the local run's, except columns that measure time or memory (or derive from
# such: the cost curve's step costs and objective, normalised latencies, training minutes)
measured = re.compile(r"(^|_)(ms|min|cost|objective)($|_)|ratio|per_s|tok_s|speedup|latency|mem_mib|wall|limit")
measured_row = re.compile(r"(?i)wall time")  # a row that reports a measured time (ppdp.table4)
# columns that name what a measurement chose, so they may differ between two honest runs
chosen = {"prompt_decoding/tables/pd.table1.csv": ["hardware_choice"],  # the size maximizing tau / measured T(n)
          "prompt_decoding/tables/pd.fig1.csv": ["decoder"],           # the same choice, by name
          "prompt_decoding/tables/pd.fig4.csv": ["decoder"],
          "prompt_decoding/tables/pd.fig5.csv": ["prompt_decoding"],
          "prompt_decoding/tables/pd.spec.csv": ["best"],              # the fastest gamma of each decoder
          "bild/tables/bild.fig7.csv": ["quality_a", "gap"]}           # early exit's best quality at no more latency
names = sorted(str(p.relative_to(local)) for p in local.glob("*/tables/*.csv"))
if names != sorted(str(p.relative_to(remote)) for p in remote.glob("*/tables/*.csv")) or not names:
    fail.append(f"different table files: {names}")
compared = 0
for name in names:
    a, b = pd.read_csv(local / name), pd.read_csv(remote / name)
    if len(a) == len(b):
        rows = ~a.iloc[:, 0].astype(str).str.contains(measured_row)
        a, b = a[rows].reset_index(drop=True), b[rows].reset_index(drop=True)
    keep = [c for c in a.columns if not measured.search(c) and c not in chosen.get(name, [])]
    if list(a.columns) == list(b.columns):  # rows ordered by a measured value (fastest first): compare as sets
        a, b = (t[keep].astype(str).sort_values(keep).reset_index(drop=True) for t in (a, b))
    if list(a.columns) != list(b.columns) or not a[keep].equals(b[keep]):
        fail.append(f"{name} differs from the local run's:\n{a[keep].compare(b[keep]) if list(a.columns) == list(b.columns) else list(b.columns)}")
    compared += a[keep].size
print(f"test_slurm: {len(submitted)} jobs submitted with sbatch, all COMPLETED in sacct ({len(rules)} rules: "
      f"{', '.join(rules)}); {len(logs)} SLURM job logs; {len(names)} tables compared with the local run's "
      f"({compared} values; columns of measured time and memory, and choices made from them, left out)")
for f in fail:
    print(f"error: test_slurm: {f}", file=sys.stderr)
sys.exit(1 if fail else 0)
PY
say "passed in $(( $(date +%s) - t0 )) s"
