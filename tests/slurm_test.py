#!/usr/bin/env python3
"""`cllm launch` and `cllm train` under Slurm (labels: launch, mpi).

cli:     `cllm launch --dry-run` with a Slurm allocation's variables set by
         hand (no Slurm needed): the mpirun command takes its hosts from
         SLURM_JOB_NODELIST (`node[01-02]`), their ranks from
         SLURM_TASKS_PER_NODE (`2(x2)`) cut to SLURM_NTASKS, OMP_NUM_THREADS
         from SLURM_JOB_CPUS_PER_NODE / ranks (or SLURM_CPUS_PER_TASK);
         --hostfile and -n override; malformed variables are named.
cluster: a real one-node Slurm (Debian's slurmctld + slurmd, started here
         with a private slurm.conf: auth/none, no munge, no accounting, on
         free ports), then
           salloc -n 2 cllm launch -- train   (2 ranks through mpirun),
           sbatch with `srun --mpi=pmix cllm train` (2 ranks started by srun)
             and then `cllm launch -- train` (from the batch step),
         each against the one-process run (losses and grad norms per step,
         final weights: 1e-5 relative), and `srun -n 2 cllm train` without
         PMIx (--mpi=none, --mpi=pmi2) refused by every task with the fix
         named. The daemons are stopped in all cases and no process started
         under this slurm.conf may remain. Needs root (slurmd starts jobs as
         their users) and the Slurm binaries: skipped (exit 77) with the
         reason otherwise.

Usage: slurm_test.py --cllm BIN --build DIR --case {cli,cluster}
"""
import argparse, os, shutil, signal, socket, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dist_test import SCALE, Env, metrics, rel, tensors  # noqa: E402

import numpy as np  # noqa: E402

FAILS = []
SKIP = 77
RUN = {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}


def check(cond, msg):
    if not cond:
        FAILS.append(msg)
        print("FAIL:", msg, file=sys.stderr)


def clean_env(extra=None):
    """This environment without cllm's, OpenMP's and Slurm's variables (the
    test may itself run inside a Slurm job), plus `extra`."""
    e = {k: v for k, v in os.environ.items() if not k.startswith(("CLLM_", "OMP_", "SLURM_", "PMIX_", "PMI_"))}
    e.update(extra or {})
    return e


def run(cmd, env=None, timeout=120, cwd=None):
    return subprocess.run(cmd, capture_output=True, text=True, env=clean_env(env), timeout=timeout * SCALE, cwd=cwd)


def cli(env):
    cllm, real = env.cllm, os.path.realpath(env.cllm)
    root = " --allow-run-as-root" if os.geteuid() == 0 else ""
    job = {"SLURM_JOB_ID": "41", "SLURM_JOB_NODELIST": "node[01-02]", "SLURM_TASKS_PER_NODE": "2(x2)",
           "SLURM_NTASKS": "3", "SLURM_JOB_CPUS_PER_NODE": "8(x2)"}
    p = run([cllm, "launch", "--dry-run", "--", "train", "--config", "c.json"], env=job)
    want = (f"mpirun{root} --bind-to none -np 2 --host node01:2 -x OMP_NUM_THREADS=4 {real} train --config c.json : "
            f"-np 1 --host node02:1 -x OMP_NUM_THREADS=8 {real} train --config c.json")
    check(p.returncode == 0 and p.stdout.strip() == want, f"allocation: rc {p.returncode}\n{p.stdout}{p.stderr}\nwant\n{want}")
    check("cllm launch: Slurm job 41: hosts from SLURM_JOB_NODELIST=node[01-02] SLURM_TASKS_PER_NODE=2(x2) "
          "SLURM_NTASKS=3" in p.stderr and "3 ranks on 2 hosts" in p.stderr, f"allocation: stderr {p.stderr}")
    # -n overrides SLURM_NTASKS; SLURM_CPUS_PER_TASK sets the threads
    p = run([cllm, "launch", "-n", "4", "--dry-run", "--", "train"], env={**job, "SLURM_CPUS_PER_TASK": "2"})
    want = (f"mpirun{root} --bind-to none -np 2 --host node01:2 -x OMP_NUM_THREADS=2 {real} train : "
            f"-np 2 --host node02:2 -x OMP_NUM_THREADS=2 {real} train")
    check(p.returncode == 0 and p.stdout.strip() == want, f"-n 4: rc {p.returncode}\n{p.stdout}{p.stderr}\nwant\n{want}")
    # include/exclude work on the allocation's hosts
    p = run([cllm, "launch", "--exclude", "node01", "--dry-run", "--", "train"], env=job)
    check(p.returncode == 0 and p.stdout.strip() == f"mpirun{root} --bind-to none -np 2 --host node02:2 -x "
          f"OMP_NUM_THREADS=4 {real} train", f"exclude: rc {p.returncode}\n{p.stdout}{p.stderr}")
    p = run([cllm, "launch", "--include", "node01:1@node02", "--dry-run", "--", "train"], env=job)
    check(p.returncode == 0 and "-np 1 --host node01:1 -x OMP_NUM_THREADS=8" in p.stdout
          and "-np 2 --host node02:2 -x OMP_NUM_THREADS=4" in p.stdout, f"include: rc {p.returncode}\n{p.stdout}{p.stderr}")
    # a hostfile wins over the allocation
    hf = env.path("hosts")
    with open(hf, "w") as f:
        f.write("other slots=1\n")
    p = run([cllm, "launch", "--hostfile", hf, "--dry-run", "--", "train"], env=job)
    check(p.returncode == 0 and "--host other:1" in p.stdout and "Slurm" not in p.stderr,
          f"hostfile over Slurm: rc {p.returncode}\n{p.stdout}{p.stderr}")
    # malformed variables: named, exit 1, nothing run
    for var, val, needle in (
            ("SLURM_JOB_NODELIST", "node[01-02", "SLURM_JOB_NODELIST 'node[01-02': '[' without a matching ']'"),
            ("SLURM_JOB_NODELIST", "node[2-1]", "range '2-1' in 'node[2-1]' runs backwards"),
            ("SLURM_TASKS_PER_NODE", "2(x3)", "SLURM_TASKS_PER_NODE '2(x3)' gives more than the 2 counts"),
            ("SLURM_TASKS_PER_NODE", "2(3)", "SLURM_TASKS_PER_NODE '2(3)': '2(3)' is not a count"),
            ("SLURM_NTASKS", "9", "SLURM_NTASKS=9 but SLURM_TASKS_PER_NODE '2(x2)' places only 4 tasks"),
            ("SLURM_CPUS_PER_TASK", "0", "SLURM_CPUS_PER_TASK '0' is not a CPU count")):
        p = run([cllm, "launch", "--dry-run", "--", "train"], env={**job, var: val})
        check(p.returncode == 1 and f"cllm launch: Slurm job 41: " in p.stderr and needle in p.stderr
              and "mpirun" not in p.stdout, f"{var}={val}: rc {p.returncode}: {p.stderr}")
    p = run([cllm, "launch", "-n", "5", "--dry-run", "--", "train"], env=job)
    check(p.returncode == 2 and "5 ranks requested, but the hosts offer 4 slots" in p.stderr, f"-n 5: {p.stderr}")
    # a build with MPI refuses srun tasks that have no PMIx (checked without
    # Slurm: the variables srun sets for task 1 of 2 with --mpi=none)
    cfg = env.config("c.json", env.init("llama"), train_iters=1)
    p = run([cllm, "train", "--config", cfg, "--out", env.path("never")],
            env={"SLURM_JOB_ID": "41", "SLURM_PROCID": "1", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2"})
    check(p.returncode != 0 and "task 1 of 2 started by srun with no process-management interface" in p.stderr
          and "srun --mpi=pmix" in p.stderr, f"srun without PMIx: rc {p.returncode}: {p.stderr}")
    print("cli: ok" if not FAILS else "cli: failed")


class Slurm:
    """A one-node Slurm cluster in a temporary folder: slurmctld and slurmd
    in the foreground with a private slurm.conf (SLURM_CONF). `skip` says why
    it cannot start here."""

    def __init__(self):
        self.skip, self.procs, self.dir = None, [], None

    @staticmethod
    def free_port():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    def __enter__(self):
        if os.geteuid() != 0:
            self.skip = "slurmd must run as root (it starts jobs as their users); not running as root"
            return self
        missing = [b for b in ("slurmctld", "slurmd", "salloc", "sbatch", "srun", "sinfo", "squeue", "scontrol")
                   if not shutil.which(b)]
        if missing:
            self.skip = (f"Slurm is not installed (no {', '.join(missing)}): scripts/install-deps.sh installs "
                         "slurmctld, slurmd and slurm-client")
            return self
        # short paths: slurmd's step sockets live in the spool folder
        self.dir = tempfile.mkdtemp(prefix="cllm_slurm_")
        d = self.dir
        for sub in ("state", "spool"):
            os.mkdir(os.path.join(d, sub))
        self.node = socket.gethostname().split(".")[0]
        self.conf = os.path.join(d, "slurm.conf")
        with open(self.conf, "w") as f:
            f.write(f"""# one node, this machine; no munge (auth/none), no accounting
ClusterName=cllmtest
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={self.free_port()}
SlurmdPort={self.free_port()}
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
MailProg=/bin/true
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
SlurmdParameters=config_overrides
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={max(2, os.cpu_count() or 1)} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        self.env = {"SLURM_CONF": self.conf}
        e = clean_env(self.env)
        for cmd in (["slurmctld", "-D", "-i"], ["slurmd", "-D", "-N", self.node]):
            log = open(os.path.join(d, cmd[0] + ".out"), "w")
            self.procs.append(subprocess.Popen(cmd, env=e, stdout=log, stderr=subprocess.STDOUT,
                                               start_new_session=True))
            log.close()
        t0 = time.monotonic()
        state = ""
        while time.monotonic() - t0 < 30 * SCALE:
            if any(p.poll() is not None for p in self.procs):
                break
            state = run(["sinfo", "-h", "-n", self.node, "-o", "%T"], env=self.env, timeout=10).stdout.strip()
            if state == "idle":
                return self
            time.sleep(0.2)
        check(False, f"the node did not become idle within {30 * SCALE} s (state '{state}'):\n{self.logs()}")
        return self

    def logs(self):
        out = ""
        for name in ("slurmctld.out", "slurmd.out"):
            p = os.path.join(self.dir, name)
            if os.path.exists(p):
                out += f"--- {name}\n" + open(p).read()[-2000:]
        return out

    def ours(self):
        """Pids of processes that run with this cluster's slurm.conf (the
        daemons, slurmstepd, job steps)."""
        pids, tag = [], f"SLURM_CONF={self.conf}".encode()
        for x in os.listdir("/proc"):
            if not x.isdigit() or int(x) == os.getpid():
                continue
            try:
                with open(f"/proc/{x}/environ", "rb") as f:
                    if tag in f.read().split(b"\0"):
                        pids.append(int(x))
            except OSError:
                pass
        return pids

    SETTLE_S = 10

    def settle(self, keep=()):
        """Waits up to SETTLE_S s (times SCALE) for the processes of this
        cluster other than `keep` to end: a job step's slurmstepd still
        tears down for a moment after srun or sbatch has returned. Returns
        those left."""
        t0 = time.monotonic()
        while True:
            left = [p for p in self.ours() if p not in keep]
            if not left or time.monotonic() - t0 > self.SETTLE_S * SCALE:
                return left
            time.sleep(0.1)

    def __exit__(self, *exc):
        if not self.dir:
            return False
        # the steps first, then the daemons: a stepd ends with its step
        self.settle(keep={p.pid for p in self.procs})
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        left = self.settle()
        names = {}
        for pid in left:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    names[pid] = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                names[pid] = "?"
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        check(not left, f"processes left {self.SETTLE_S * SCALE} s after stopping Slurm: {names}")
        if not FAILS:
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            print(f"slurm files kept in {self.dir}", file=sys.stderr)
        return False


def same_run(tag, out, ref):
    """Per-step losses and grad norms, and final weights, against ref."""
    m, rm = metrics(os.path.join(out, "metrics.jsonl")), metrics(os.path.join(ref, "metrics.jsonl"))
    check(len(m) == len(rm) > 0, f"{tag}: {len(m)} metric records vs {len(rm)}")
    worst = 0.0
    for a, b in zip(m, rm):
        worst = max(worst, rel(a["loss"], b["loss"]))
        check(rel(a["loss"], b["loss"]) <= 1e-5, f"{tag} step {b['step']}: loss {a['loss']} vs {b['loss']}")
        check(rel(a["grad_norm"], b["grad_norm"]) <= 1e-5,
              f"{tag} step {b['step']}: grad norm {a['grad_norm']} vs {b['grad_norm']}")
    w, rw = tensors(os.path.join(out, "model.safetensors")), tensors(os.path.join(ref, "model.safetensors"))
    wworst = max(float(np.max(np.abs(w[k] - rw[k]))) / max(float(np.max(np.abs(rw[k]))), 1e-30) for k in rw)
    check(w.keys() == rw.keys() and wworst <= 1e-5, f"{tag}: final weights differ, worst rel {wworst:.2e}")
    return worst, wworst


def two_ranks(tag, err):
    check("(micro 1 x accumulation 4 x dp 2)" in err and "rank 0/2" in err and "rank 1/2" in err,
          f"{tag}: not 2 data-parallel ranks:\n{err[-3000:]}")


def cluster(env):
    with Slurm() as s:
        if s.skip:
            print("skip: " + s.skip)
            return SKIP
        if FAILS:
            return 1
        model = env.init("llama")
        cfg = env.config("c.json", model, train_iters=4)
        ref = env.path("ref")
        p = run([env.cllm, "train", "--config", cfg, "--out", ref], env=RUN)
        check(p.returncode == 0, f"reference run failed: {p.stderr[-2000:]}")

        # salloc + cllm launch: hosts and ranks from the allocation
        out = env.path("salloc")
        t0 = time.monotonic()
        p = run(["salloc", "-n", "2", env.cllm, "launch", "--", "train", "--config", cfg, "--out", out],
                env={**s.env, **RUN}, timeout=120)
        took = time.monotonic() - t0
        check(p.returncode == 0, f"salloc: rc {p.returncode}:\n{p.stderr[-3000:]}\n{s.logs()}")
        check(f"hosts from SLURM_JOB_NODELIST={s.node} SLURM_TASKS_PER_NODE=2 SLURM_NTASKS=2" in p.stderr
              and f"--host {s.node}:2 " in p.stderr, f"salloc: hosts not from Slurm:\n{p.stderr[-3000:]}")
        two_ranks("salloc", p.stderr)
        if p.returncode == 0:
            l, w = same_run("salloc + cllm launch", out, ref)
            print(f"salloc -n 2 cllm launch: {took:.1f} s, worst loss rel {l:.1e}, weights rel {w:.1e}")

        # sbatch: the script a user writes, its ranks started by srun --mpi=pmix,
        # then by cllm launch from the batch step
        out, out2 = env.path("sbatch"), env.path("sbatch_launch")
        script = env.path("job.sh")
        with open(script, "w") as f:
            f.write(f"#!/bin/sh\n#SBATCH --ntasks=2\n#SBATCH --output={env.path('job.out')}\nset -e\n"
                    f"export OMP_NUM_THREADS=1\nsrun --mpi=pmix {env.cllm} train --config {cfg} --out {out}\n"
                    f"{env.cllm} launch -- train --config {cfg} --out {out2}\n")
        t0 = time.monotonic()
        p = run(["sbatch", "--parsable", script], env=s.env, timeout=30, cwd=env.dir)
        job = p.stdout.strip().split(";")[0]
        check(p.returncode == 0 and job.isdigit(), f"sbatch: rc {p.returncode}: {p.stdout}{p.stderr}")
        while job.isdigit() and time.monotonic() - t0 < 120 * SCALE:
            if not run(["squeue", "-h", "-j", job, "-o", "%T"], env=s.env, timeout=10).stdout.strip():
                break
            time.sleep(0.2)
        took = time.monotonic() - t0
        info = run(["scontrol", "show", "job", job], env=s.env, timeout=10).stdout if job.isdigit() else ""
        log = open(env.path("job.out")).read() if os.path.exists(env.path("job.out")) else ""
        check("JobState=COMPLETED" in info and "ExitCode=0:0" in info,
              f"sbatch + srun --mpi=pmix: job {job} did not complete:\n{info}\n{log[-3000:]}\n{s.logs()}")
        srun_log, launch_log = log.split("cllm launch: Slurm job", 1) if "cllm launch: Slurm job" in log else (log, "")
        two_ranks("sbatch + srun --mpi=pmix", srun_log)
        two_ranks("sbatch + cllm launch", launch_log)
        check(f"--host {s.node}:2 " in launch_log, f"sbatch + cllm launch: hosts not from Slurm:\n{launch_log[-2000:]}")
        if "JobState=COMPLETED" in info:
            l, w = same_run("sbatch + srun --mpi=pmix", out, ref)
            l2, w2 = same_run("sbatch + cllm launch", out2, ref)
            print(f"sbatch (srun --mpi=pmix cllm train, then cllm launch): {took:.1f} s, worst loss rel "
                  f"{max(l, l2):.1e}, weights rel {max(w, w2):.1e}")

        # srun without PMIx: every task refuses instead of training alone
        for mpi, how in (("none", "no process-management interface (srun --mpi=none)"),
                         ("pmi2", "PMI-2 (srun --mpi=pmi2)")):
            out = env.path("srun_" + mpi)
            p = run(["srun", "-n", "2", f"--mpi={mpi}", env.cllm, "train", "--config", cfg, "--out", out],
                    env={**s.env, **RUN}, timeout=60)
            for t in (0, 1):
                check(f"task {t} of 2 started by srun with {how}: OpenMPI finds its ranks only through PMIx" in p.stderr,
                      f"srun --mpi={mpi}: task {t} not refused:\n{p.stderr[-3000:]}")
            check(p.returncode != 0 and not os.path.exists(os.path.join(out, "model.safetensors")),
                  f"srun --mpi={mpi}: rc {p.returncode}")
        print("srun --mpi=none / pmi2: refused by both tasks")
        return 0


def main():
    # ctest's timeout sends SIGTERM: unwind so that the daemons are stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--case", required=True, choices=["cli", "cluster"])
    a = ap.parse_args()
    env = Env(os.path.abspath(a.cllm), os.path.abspath(a.build), "slurm_" + a.case)
    rc = 0
    try:
        rc = {"cli": cli, "cluster": cluster}[a.case](env) or 0
    finally:
        if not FAILS:
            shutil.rmtree(env.dir, ignore_errors=True)
    if rc == SKIP and not FAILS:
        return SKIP
    print(f"{a.case}: {len(FAILS)} failure(s)" + (f" (files kept in {env.dir})" if FAILS else ""))
    return 1 if FAILS or rc else 0


if __name__ == "__main__":
    sys.exit(main())
