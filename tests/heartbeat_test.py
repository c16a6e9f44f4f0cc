#!/usr/bin/env python3
"""The heartbeat: a stopped rank ends the job, a slow one does not (labels: launch, mpi).

stop2:    2 ranks through `cllm launch` with a heartbeat limit of 3 s (x the
          sanitizer time scale), checkpoints every 4 steps; once `latest`
          names step 4, rank 1 gets SIGSTOP. The job must end non-zero within the
          limit + a margin, rank 0 naming rank 1 with its host and pid, the
          stopped process must be gone, `latest` must name a complete
          checkpoint, and `cllm launch -n 2 -- train --resume auto` continues
          from it to the end.
stop4:    the same with 4 ranks and rank 0 stopped (it may be writing a
          checkpoint): ranks 1-3 name it; the run resumes in one process.
slow:     2 ranks, rank 1 sleeping 2 x limit + 1 s inside step 3
          (CLLM_TEST_SLOW_STEP, a test hook): the job completes normally,
          with the one-process run's final weights.
settings: the key, flags and variable: heartbeat_timeout in --print-config
          (default 30, the config's value, --heartbeat-timeout over it), a
          negative value refused naming the key, a bad CLLM_HEARTBEAT_TIMEOUT
          refused at start-up, `cllm launch --heartbeat-timeout` forwarding it.

Usage: heartbeat_test.py --cllm BIN --build DIR --case {stop2,stop4,slow,settings}
"""
import argparse, json, os, re, shutil, signal, subprocess, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dist_test import SCALE, Env, metrics  # noqa: E402
from launch_test import RUN, check, compare_weights, latest_step, run, FAILS  # noqa: E402

LIMIT = 3 * SCALE         # heartbeat limit of these runs, seconds
MARGIN = 6 + 2 * SCALE    # detection takes up to limit + limit / 8; mpirun then needs a moment to end the ranks


def ranks_of(tag):
    """{rank: pid} of the processes whose environment carries CLLM_TEST_TAG=tag."""
    found = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if f"CLLM_TEST_TAG={tag}".encode() not in env:
            continue
        for kv in env:
            if kv.startswith(b"OMPI_COMM_WORLD_RANK="):
                found[int(kv.split(b"=")[1])] = int(d)
    return found


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def stop(env, n, victim, resume_ranks):
    tag_ = f"stop{n}"
    model = env.init("llama")
    cfg = env.config("c.json", model, train_iters=100000, save_interval=2, save_total_limit=2)
    out = env.path("out")
    tag = f"hb{os.getpid()}"
    e = {k: v for k, v in os.environ.items() if not k.startswith(("CLLM_", "OMP_"))}
    e.update(RUN, CLLM_TEST_TAG=tag)
    p = subprocess.Popen([env.cllm, "launch", "-n", str(n), "--heartbeat-timeout", str(LIMIT), "--", "train",
                          "--config", cfg, "--out", out], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    pids = {}
    try:
        t0 = time.monotonic()
        # mid-run: after the second checkpoint
        while latest_step(out) < 4 and p.poll() is None and time.monotonic() - t0 < 120 * SCALE:
            time.sleep(0.05)
        pids = ranks_of(tag)
        print(f"{tag_}: checkpoint-{latest_step(out)} after {time.monotonic() - t0:.1f} s")
        check(sorted(pids) == list(range(n)), f"{tag_}: ranks found {sorted(pids)}")
        check(p.poll() is None and victim in pids, f"{tag_}: the run ended before the stop (rc {p.poll()})")
        if p.poll() is not None or victim not in pids:
            print(p.communicate()[1][-3000:], file=sys.stderr)
            return
        os.kill(pids[victim], signal.SIGSTOP)
        t_stop = time.monotonic()
        try:
            _, err = p.communicate(timeout=LIMIT + MARGIN + 60)
        except subprocess.TimeoutExpired:
            check(False, f"{tag_}: the job still runs {LIMIT + MARGIN + 60} s after rank {victim} was stopped")
            return
        took = time.monotonic() - t_stop
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        for pid in pids.values():  # whatever the job left behind (it should have left nothing)
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    check(p.returncode != 0, f"{tag_}: exit 0 after rank {victim} was stopped")
    check(took <= LIMIT + MARGIN, f"{tag_}: the job ended {took:.1f} s after the stop (limit {LIMIT} s + {MARGIN} s)")
    host = os.uname().nodename
    msg = (rf"cllm dist: rank (\d+) \(host [^,]+, pid \d+\): no heartbeat from rank {victim} "
           rf"\(host {re.escape(host)}, pid {pids[victim]}\) for [\d.]+ s at step \d+")
    reporters = sorted({int(m.group(1)) for m in re.finditer(msg, err)})
    want = [0] if victim != 0 else []
    check(reporters and (reporters[0] == 0 if victim != 0 else 0 not in reporters),
          f"{tag_}: no heartbeat message naming rank {victim} from {want or 'the other ranks'}:\n{err[-3000:]}")
    time.sleep(0.5)
    check(not alive(pids[victim]), f"{tag_}: the stopped rank (pid {pids[victim]}) is still there")
    print(f"{tag_}: rank {victim} stopped; job ended after {took:.1f} s (limit {LIMIT} s), rc {p.returncode}, "
          f"named by rank(s) {reporters}")

    # the last checkpoint is complete, and the run resumes from it
    step = latest_step(out)
    check(step >= 4 and step % 2 == 0, f"{tag_}: latest names step {step}")
    if step <= 0:
        return
    end = step + 2
    cmd = ["train", "--config", cfg, "--out", out, "--resume", "auto", "--steps", str(end)]
    if resume_ranks > 1:
        cmd = ["launch", "-n", str(resume_ranks), "--"] + cmd
    q = run([env.cllm] + cmd, env=RUN, timeout=120 * SCALE)
    check(q.returncode == 0 and "(resumed)" in q.stderr, f"{tag_}: resume: rc {q.returncode}: {q.stderr[-2000:]}")
    if q.returncode == 0:
        steps = [r["step"] for r in metrics(os.path.join(out, "metrics.jsonl")) if "loss" in r and "step" in r]
        check(steps[-2:] == [step + 1, end], f"{tag_}: resumed steps end with {steps[-2:]}, expected {[step + 1, end]}")
        check(os.path.exists(os.path.join(out, "model.safetensors")), f"{tag_}: resume wrote no model")
        print(f"{tag_}: resumed from checkpoint-{step} on {resume_ranks} rank(s) to step {end}: ok")


def slow(env):
    model = env.init("llama")
    cfg = env.config("c.json", model, train_iters=6, save_interval=2)
    ref = env.path("ref")
    p = run([env.cllm, "train", "--config", cfg, "--out", ref], env=RUN)
    check(p.returncode == 0, f"reference run failed: {p.stderr[-2000:]}")
    out = env.path("slow")
    nap = 2 * LIMIT + 1
    p = run([env.cllm, "launch", "-n", "2", "--heartbeat-timeout", str(LIMIT), "--", "train", "--config", cfg,
             "--out", out], env={**RUN, "CLLM_TEST_SLOW_STEP": f"1:{nap}:3"}, timeout=120 * SCALE + nap)
    check(p.returncode == 0, f"slow rank: rc {p.returncode}: {p.stderr[-3000:]}")
    check(f"rank 1: CLLM_TEST_SLOW_STEP: sleeping {nap} s inside step 3" in p.stderr,
          f"slow rank: the hook did not run: {p.stderr[-2000:]}")
    check("no heartbeat" not in p.stderr, f"slow rank: taken for a hung one: {p.stderr[-2000:]}")
    check(p.seconds >= nap, f"slow rank: the run took {p.seconds:.1f} s, less than the {nap} s sleep")
    if p.returncode == 0:
        w = compare_weights("slow rank", out, ref)
        print(f"slow rank: slept {nap} s (limit {LIMIT} s) inside step 3; run completed in {p.seconds:.1f} s, "
              f"worst weight rel diff {w[0]:.1e}")


def settings(env):
    model = env.init("llama")

    def printed(cfg, *flags):
        p = run([env.cllm, "train", "--config", cfg, "--print-config"] + list(flags))
        check(p.returncode == 0, f"print-config {flags}: rc {p.returncode}: {p.stderr}")
        return json.loads(p.stdout).get("heartbeat_timeout") if p.returncode == 0 else None

    check(printed(env.config("a.json", model)) == 30, "heartbeat_timeout: default is not 30")
    cfg = env.config("b.json", model, heartbeat_timeout=12.5)
    check(printed(cfg) == 12.5, "heartbeat_timeout: the config's value was not kept")
    check(printed(cfg, "--heartbeat-timeout", "0") == 0, "--heartbeat-timeout 0 did not override the config")
    p = run([env.cllm, "train", "--config", env.config("c.json", model, heartbeat_timeout=-1), "--print-config"])
    check(p.returncode == 2 and "heartbeat_timeout: -1 is out of range (minimum 0)" in p.stderr,
          f"negative heartbeat_timeout: rc {p.returncode}: {p.stderr}")
    p = run([env.cllm, "train", "--config", cfg, "--print-config", "--heartbeat-timeout", "soon"])
    check(p.returncode == 2 and "--heartbeat-timeout: 'soon' is not a non-negative number" in p.stderr,
          f"--heartbeat-timeout soon: rc {p.returncode}: {p.stderr}")
    p = run([env.cllm, "launch", "-n", "2", "--heartbeat-timeout", "7", "--dry-run", "--", "train"])
    check(p.returncode == 0 and "-x CLLM_HEARTBEAT_TIMEOUT=7 " in p.stdout, f"launch dry run: {p.stdout}{p.stderr}")
    p = run([env.cllm, "launch", "-n", "2", "--heartbeat-timeout", "-3", "--dry-run", "--", "train"])
    check(p.returncode == 2 and "--heartbeat-timeout: -3 is negative" in p.stderr, f"launch -3: {p.stderr}")
    p = run([env.cllm, "launch", "-n", "2", "--dry-run", "--", "train"])
    check("HEARTBEAT" not in p.stdout, f"launch without the flag forwards a heartbeat setting: {p.stdout}")
    if shutil.which("mpirun"):
        p = run([env.cllm, "launch", "-n", "2", "--", "train", "--config", cfg, "--out", env.path("bad")],
                env={**RUN, "CLLM_HEARTBEAT_TIMEOUT": "soon"}, timeout=60 * SCALE)
        check(p.returncode != 0 and "CLLM_HEARTBEAT_TIMEOUT='soon': expected seconds, a number >= 0" in p.stderr,
              f"bad CLLM_HEARTBEAT_TIMEOUT: rc {p.returncode}: {p.stderr[-2000:]}")
    print("settings: ok")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--case", required=True, choices=["stop2", "stop4", "slow", "settings"])
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    env = Env(os.path.abspath(a.cllm), os.path.abspath(a.build), "heartbeat_" + a.case)
    try:
        {"stop2": lambda: stop(env, 2, 1, 2), "stop4": lambda: stop(env, 4, 0, 1), "slow": lambda: slow(env),
         "settings": lambda: settings(env)}[a.case]()
    finally:
        if not a.keep and not FAILS:
            shutil.rmtree(env.dir, ignore_errors=True)
    print(f"{a.case}: {len(FAILS)} failure(s)" + (f" (files kept in {env.dir})" if FAILS else ""))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
