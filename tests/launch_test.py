#!/usr/bin/env python3
"""`cllm launch` and failure behaviour of data-parallel runs (labels: launch, mpi).

cli:   the mpirun command lines `cllm launch --dry-run` prints (per-host
       application contexts, OMP_NUM_THREADS = cores / ranks on the host,
       .cllm_env variables, --timeout), and its usage errors.
fail:  a rank that hangs before a step's collective ends the job within the
       collective timeout, with a message naming that rank and the operation
       (rank 1 hanging: named by rank 0; rank 0 hanging: named by rank 1);
       a rank killed mid-run ends the job, the last stage-0 checkpoint is
       intact and `--resume auto` finishes with the one-process run's weights.
netns: two "hosts" built as network namespaces joined by a veth pair
       (10.77.0.1/24, 10.77.0.2/24); mpirun runs in the first, reaches the
       second through a plm_rsh_agent script that runs OpenMPI's daemon under
       `ip netns exec`, and the ranks talk over TCP on the veth. The run
       trains to the one-process losses and weights (1e-5 relative), and the
       veth's byte counters show the gradients crossed it. Then ZeRO-3 in
       bf16 over the two hosts, plain and with ZeRO++ (zero_quantized_weights
       and zero_quantized_gradients): losses within 2% of each other, and the
       veth carries at most half the plain run's bytes (int8 collectives:
       about a quarter of the payload, plus TCP and OpenMPI's own traffic).
       Without root or CAP_NET_ADMIN the case prints why and exits 77
       (ctest's skip).

partition: the same two hosts, 2 ranks training with a heartbeat limit of 3 s
       (x the sanitizer time scale) and a checkpoint every 2 steps; after
       checkpoint-4 both ends of the veth go down (packets dropped: no
       reset reaches either side). The job must end non-zero within the
       limit + a margin with a heartbeat message naming the rank across the
       cut, and `--resume auto` continues from the last checkpoint.

Usage: launch_test.py --cllm BIN --build DIR --case {cli,fail,netns,partition}
"""
import argparse, json, os, re, shutil, signal, subprocess, sys, time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dist_test import SCALE, Env, metrics, rel, tensors  # noqa: E402

FAILS = []
SKIP = 77


def check(cond, msg):
    if not cond:
        FAILS.append(msg)
        print("FAIL:", msg, file=sys.stderr)


# the environment of real runs (dry runs get only what they name, so that the
# printed command is known exactly: the launcher forwards CLLM_* and OMP_*)
RUN = {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}


def run(cmd, cwd=None, env=None, timeout=120):
    # Slurm's variables too: inside an allocation the launcher takes its hosts from them
    e = {k: v for k, v in os.environ.items() if not k.startswith(("CLLM_", "OMP_", "SLURM_"))}
    e.update(env or {})
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=e, timeout=timeout)
    p.seconds = time.monotonic() - t0
    return p


def compare_weights(tag, out, ref_out):
    w, ref_w = tensors(os.path.join(out, "model.safetensors")), tensors(os.path.join(ref_out, "model.safetensors"))
    check(w.keys() == ref_w.keys(), f"{tag}: tensor names differ")
    worst = max((float(np.max(np.abs(w[k] - ref_w[k]))) / max(float(np.max(np.abs(ref_w[k]))), 1e-30), k)
                for k in ref_w if k in w)
    check(worst[0] <= 1e-5, f"{tag}: final weights differ from the one-process run, worst {worst[1]} rel {worst[0]:.2e}")
    return worst


def cli(env):
    cllm = env.cllm
    d = env.dir
    cores = os.cpu_count()
    p = run([cllm, "launch", "-n", "2", "--dry-run", "--", "train", "--config", "x.json"], cwd=d)
    check(p.returncode == 0, f"dry run: rc {p.returncode}: {p.stderr}")
    want = (f"mpirun{' --allow-run-as-root' if os.geteuid() == 0 else ''} --bind-to none -np 2 --host localhost:2 "
            f"-x OMP_NUM_THREADS={max(cores // 2, 1)} {os.path.realpath(cllm)} train --config x.json")
    check(p.stdout.strip() == want, f"dry run: got\n{p.stdout}\nwant\n{want}")

    hf = os.path.join(d, "hostfile")
    with open(hf, "w") as f:
        f.write("# cluster\nnode-a slots=4\n\nnode-b slots=2  # small one\nnode-c slots=1\n")
    with open(os.path.join(d, ".cllm_env"), "w") as f:
        f.write("# passed to every rank\nNCCL_LIKE_SETTING=a b\nOMP_NUM_THREADS=3\n")
    p = run([cllm, "launch", "--hostfile", hf, "--include", "node-a:1,3@node-c", "--timeout", "30",
             "--launcher-args", "--mca btl tcp,self", "--dry-run", "--", "train", "--out", "o x"], cwd=d,
            env={"CLLM_TRAIN_POISON_STEPS": "5"})
    check(p.returncode == 0, f"include: rc {p.returncode}: {p.stderr}")
    ctx = ("-x CLLM_TRAIN_POISON_STEPS=5 -x 'NCCL_LIKE_SETTING=a b' -x OMP_NUM_THREADS=3 -x CLLM_DIST_TIMEOUT=30 "
           f"{os.path.realpath(cllm)} train --out 'o x'")
    want = (f"mpirun{' --allow-run-as-root' if os.geteuid() == 0 else ''} --bind-to none --mca btl tcp,self "
            f"-np 2 --host node-a:2 {ctx} : -np 1 --host node-c:1 {ctx}")
    check(p.stdout.strip() == want, f"include: got\n{p.stdout}\nwant\n{want}")
    check("environment from .cllm_env" in p.stderr, f"include: env file not reported: {p.stderr}")
    os.remove(os.path.join(d, ".cllm_env"))

    p = run([cllm, "launch", "--hostfile", hf, "--exclude", "node-a@node-b:0", "-n", "2", "--dry-run", "--", "train"], cwd=d)
    want_tail = f"-np 1 --host node-b:1 -x OMP_NUM_THREADS={cores} {os.path.realpath(cllm)} train : -np 1 --host node-c:1"
    check(p.returncode == 0 and want_tail in p.stdout, f"exclude: got\n{p.stdout}{p.stderr}")

    def usage(args, needle, rc=2, files=None):
        for name, text in (files or {}).items():
            with open(os.path.join(d, name), "w") as f:
                f.write(text)
        q = run([cllm, "launch"] + args, cwd=d)
        check(q.returncode == rc, f"{args}: rc {q.returncode}, expected {rc}")
        check(needle in q.stderr, f"{args}: '{needle}' not in stderr: {q.stderr}")
        for name in files or {}:
            os.remove(os.path.join(d, name))

    usage(["--hostfile", hf, "--include", "node-a", "--exclude", "node-b", "--", "train"], "mutually exclusive")
    usage(["--hostfile", hf, "--include", "node-z", "--", "train"], "host 'node-z' is not in the hostfile")
    usage(["--hostfile", hf, "--include", "node-b:2", "--", "train"], "host 'node-b' has no slot 2")
    usage(["--hostfile", hf, "-n", "9", "--", "train"], "9 ranks requested, but the hosts offer 7 slots")
    usage(["--hostfile", "bad", "--", "train"], "bad:2: expected 'HOST slots=N', got 'node-b slots 2'", rc=1,
          files={"bad": "node-a slots=1\nnode-b slots 2\n"})
    usage(["--hostfile", "missing", "--", "train"], "missing", rc=1)
    usage(["-n", "2", "--", "train"], ".cllm_env:2: expected KEY=VALUE", rc=1, files={".cllm_env": "A=1\nB\n"})
    usage(["-n", "2", "train"], "no command: put it after '--'")
    usage(["--include", "a", "--", "train"], "--include/--exclude need a --hostfile")
    usage(["-n", "x", "--", "train"], "--np")
    usage(["--bogus", "--", "train"], "bogus")

    # a real run through the launcher (2 local ranks) matches one process
    model = env.init("llama")
    ref = env.path("ref")
    p = run([cllm, "train", "--config", env.config("c.json", model), "--out", ref], env=RUN)
    check(p.returncode == 0, f"reference run failed: {p.stderr[-2000:]}")
    out = env.path("launched")
    p = run([cllm, "launch", "-n", "2", "--", "train", "--config", env.config("c.json", model), "--out", out],
            env=RUN)
    check(p.returncode == 0 and "cllm launch: 2 ranks on 1 host\nmpirun " in p.stderr,
          f"launched run: rc {p.returncode}: {p.stderr[-2000:]}")
    if p.returncode == 0:
        compare_weights("launched run", out, ref)


def fail(env):
    cllm = env.cllm
    model = env.init("llama")
    timeout = 5
    cfg = env.config("c.json", model, train_iters=10, save_interval=2)
    for hung, reporter in ((1, 0), (0, 1)):
        tag = f"rank {hung} hangs"
        p = run([cllm, "launch", "-n", "2", "--timeout", str(timeout), "--", "train", "--config", cfg,
                 "--out", env.path(f"hang{hung}")],
                env={**RUN, "CLLM_DIST_TEST_HANG": f"{hung}:3"}, timeout=timeout + 60)
        check(p.returncode != 0, f"{tag}: exit 0")
        msg = (rf"cllm dist: rank {reporter}: allreduce of 1 int64s \(collective #\d+, step 3\): rank {hung} did not "
               rf"arrive within {timeout} s")
        check(re.search(msg, p.stderr), f"{tag}: '{msg}' not in stderr:\n{p.stderr[-3000:]}")
        print(f"{tag}: ended after {p.seconds:.1f} s (timeout {timeout} s), rc {p.returncode}")
    p = run([cllm, "launch", "-n", "2", "--", "train", "--config", cfg, "--out", env.path("badenv")],
            env={**RUN, "CLLM_DIST_TIMEOUT": "soon"}, timeout=60)
    check(p.returncode != 0 and "CLLM_DIST_TIMEOUT='soon': expected seconds" in p.stderr,
          f"bad CLLM_DIST_TIMEOUT: rc {p.returncode}: {p.stderr[-2000:]}")

    # killed at step 8: checkpoints 2, 4, 6 were written by rank 0
    ref = env.path("ref")
    p = run([cllm, "train", "--config", cfg, "--out", ref], env=RUN)
    check(p.returncode == 0, f"reference run failed: {p.stderr[-2000:]}")
    out = env.path("killed")
    p = run([cllm, "launch", "-n", "2", "--", "train", "--config", cfg, "--out", out],
            env={**RUN, "CLLM_DIST_TEST_DIE": "1:8"}, timeout=90)
    check(p.returncode != 0 and "killing this rank before" in p.stderr, f"killed: rc {p.returncode}: {p.stderr[-2000:]}")
    check(not os.path.exists(os.path.join(out, "model.safetensors")), "killed: the final model was written")
    latest = open(os.path.join(out, "latest")).read().strip() if os.path.exists(os.path.join(out, "latest")) else ""
    check(latest.startswith("checkpoint-") and int(latest.split("-")[1]) >= 4, f"killed: latest is '{latest}'")
    print(f"killed at step 8: ended after {p.seconds:.1f} s, rc {p.returncode}, latest {latest}")
    p = run([cllm, "launch", "-n", "2", "--", "train", "--config", cfg, "--out", out, "--resume", "auto"],
            env=RUN, timeout=90)
    check(p.returncode == 0 and "(resumed)" in p.stderr, f"resume: rc {p.returncode}: {p.stderr[-2000:]}")
    if p.returncode == 0:
        m, rm = metrics(os.path.join(out, "metrics.jsonl")), metrics(os.path.join(ref, "metrics.jsonl"))
        last = {r["step"]: r for r in m if "loss" in r and "step" in r}
        for r in rm:
            if r["step"] in last:
                check(rel(last[r["step"]]["loss"], r["loss"]) <= 1e-5,
                      f"resume: step {r['step']} loss {last[r['step']]['loss']} vs {r['loss']}")
        check(10 in last, "resume: no step 10 record")
        w = compare_weights("killed and resumed", out, ref)
        print(f"killed and resumed: ok (worst weight rel diff {w[0]:.1e})")


class TwoHosts:
    """Two "hosts": network namespaces joined by a veth pair, with an
    OpenMPI rsh agent that starts daemons inside them and a hostfile.
    `skip` is set (with a reason) when this machine cannot build them."""

    def __init__(self, env):
        self.env, self.skip, self.ok = env, None, False
        tag = f"c{os.getpid() % 100000}"
        self.ns = [f"{tag}a", f"{tag}b"]
        self.veth = [f"{tag}va", f"{tag}vb"]
        self.addrs = ["10.77.0.1", "10.77.0.2"]

    @staticmethod
    def ip(*args):
        return subprocess.run(["ip"] + list(args), capture_output=True, text=True)

    def __enter__(self):
        if os.geteuid() != 0:
            self.skip = "network namespaces need root (or CAP_NET_ADMIN); not running as root"
            return self
        if not shutil.which("ip"):
            self.skip = "the ip command (iproute2) is not installed"
            return self
        ns, veth, addrs, env = self.ns, self.veth, self.addrs, self.env
        p = self.ip("netns", "add", ns[0])
        if p.returncode != 0:
            self.skip = f"cannot create a network namespace: {p.stderr.strip()}"
            return self
        steps = [("netns", "add", ns[1]), ("link", "add", veth[0], "type", "veth", "peer", "name", veth[1])]
        for i in (0, 1):
            steps += [("link", "set", veth[i], "netns", ns[i]),
                      ("-n", ns[i], "addr", "add", addrs[i] + "/24", "dev", veth[i]),
                      ("-n", ns[i], "link", "set", "lo", "up"), ("-n", ns[i], "link", "set", veth[i], "up")]
        for s in steps:
            p = self.ip(*s)
            if p.returncode != 0:
                check(False, f"ip {' '.join(s)}: {p.stderr.strip()}")
                return self
        agent = env.path("netns_agent.sh")
        with open(agent, "w") as f:
            f.write("#!/bin/sh\n# OpenMPI's rsh agent for hosts that are network namespaces: $1 is the host,\n"
                    "# the rest is the daemon's command line.\nhost=$1; shift\ncase \"$host\" in\n")
            for a, n in zip(addrs, ns):
                f.write(f"  {a}) ns={n} ;;\n")
            f.write("  *) echo \"netns agent: unknown host $host\" >&2; exit 1 ;;\nesac\n"
                    f"echo \"netns agent: $host -> $ns\" >> {env.path('agent.log')}\n"
                    "exec ip netns exec \"$ns\" sh -c \"$*\"\n")
        os.chmod(agent, 0o755)
        self.hostfile = env.path("hostfile")
        with open(self.hostfile, "w") as f:
            f.write("# two hosts: network namespaces joined by a veth pair\n")
            for a in addrs:
                f.write(f"{a} slots=1\n")
        self.launcher_args = ("--mca plm_rsh_agent " + agent + " --mca btl tcp,self --mca btl_tcp_if_include "
                              "10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24")
        self.ok = True
        return self

    def launch(self, *args, heartbeat=None):
        """The command that runs `cllm launch ARGS` from the first host."""
        hb = ["--heartbeat-timeout", str(heartbeat)] if heartbeat is not None else []
        return (["ip", "netns", "exec", self.ns[0], self.env.cllm, "launch", "--hostfile", self.hostfile,
                 "--timeout", "60"] + hb + ["--launcher-args", self.launcher_args, "--"] + list(args))

    def agent_log(self):
        p = self.env.path("agent.log")
        return open(p).read() if os.path.exists(p) else ""

    def leftovers(self):
        """Processes still running inside the namespaces (pids)."""
        pids = []
        for n in self.ns:
            pids += [int(x) for x in self.ip("netns", "pids", n).stdout.split()]
        return pids

    def __exit__(self, *exc):
        for pid in self.leftovers():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for n in self.ns:
            self.ip("netns", "del", n)
        self.ip("link", "del", self.veth[0])  # gone with its namespace unless creation stopped half-way
        return False


def netns(env):
    with TwoHosts(env) as h:
        if h.skip:
            print("skip: " + h.skip)
            return SKIP
        if not h.ok:
            return 1
        model = env.init("llama")
        ref = env.path("ref")
        cfg = env.config("c.json", model)
        p = run([env.cllm, "train", "--config", cfg, "--out", ref], env=RUN)
        check(p.returncode == 0, f"reference run failed: {p.stderr[-2000:]}")
        out = env.path("two_hosts")
        p = run(h.launch("train", "--config", cfg, "--out", out), env=RUN, timeout=120)
        check(p.returncode == 0, f"two hosts: rc {p.returncode}:\n{p.stdout[-2000:]}{p.stderr[-3000:]}")
        check(f"{h.addrs[1]} -> {h.ns[1]}" in h.agent_log(),
              f"two hosts: the agent did not start a daemon in {h.ns[1]}: {h.agent_log()}")
        if p.returncode != 0:
            return 1
        m, rm = metrics(os.path.join(out, "metrics.jsonl")), metrics(os.path.join(ref, "metrics.jsonl"))
        check(len(m) == len(rm) == 10, f"two hosts: {len(m)} records vs {len(rm)}")
        for a, b in zip(m, rm):
            check(rel(a["loss"], b["loss"]) <= 1e-5, f"two hosts step {b['step']}: loss {a['loss']} vs {b['loss']}")
            check(rel(a["grad_norm"], b["grad_norm"]) <= 1e-5,
                  f"two hosts step {b['step']}: grad norm {a['grad_norm']} vs {b['grad_norm']}")
        w = compare_weights("two hosts", out, ref)
        # stage 0 all-reduces every gradient each step: at least the gradient
        # bytes of 10 steps went through the veth (each way)
        stats = json.loads(h.ip("-j", "-s", "-n", h.ns[1], "link", "show", h.veth[1]).stdout)[0]["stats64"]
        grad_bytes = 10 * 4 * sum(v.size for v in tensors(os.path.join(out, "model.safetensors")).values())
        check(stats["tx"]["bytes"] >= grad_bytes / 2 and stats["rx"]["bytes"] >= grad_bytes / 2,
              f"two hosts: veth moved tx {stats['tx']['bytes']} rx {stats['rx']['bytes']} bytes, "
              f"expected >= {grad_bytes / 2:.0f}")
        print(f"two hosts over TCP: ok (worst weight rel diff {w[0]:.1e}; veth tx {stats['tx']['bytes']} "
              f"rx {stats['rx']['bytes']} bytes)")
        zero3_pp(env, h, model)
        return 0


def zero3_pp(env, h, model):
    """ZeRO-3 in bf16 over the two hosts, plain and with ZeRO++: the bytes
    that crossed the veth (its counters before and after each run)."""
    def veth_bytes():
        st = json.loads(h.ip("-j", "-s", "-n", h.ns[1], "link", "show", h.veth[1]).stdout)[0]["stats64"]
        return st["tx"]["bytes"] + st["rx"]["bytes"]

    z = {"stage": 3, "stage3_param_persistence_threshold": 0}
    res = {}
    for tag, extra in (("plain", {}), ("zpp", {"zero_quantized_weights": True, "zero_quantized_gradients": True})):
        cfg = env.config(f"z3_{tag}.json", model, bf16={"enabled": True}, zero_optimization=dict(z, **extra))
        out = env.path(f"z3_{tag}")
        before = veth_bytes()
        p = run(h.launch("train", "--config", cfg, "--out", out), env=RUN, timeout=120)
        check(p.returncode == 0, f"two hosts ZeRO-3 {tag}: rc {p.returncode}:\n{p.stderr[-3000:]}")
        if p.returncode != 0:
            return
        res[tag] = (veth_bytes() - before, metrics(os.path.join(out, "metrics.jsonl")))
    (bp, mp), (bq, mq) = res["plain"], res["zpp"]
    worst = max(rel(a["loss"], b["loss"]) for a, b in zip(mq, mp))
    check(len(mq) == len(mp) == 10 and worst <= 2e-2, f"two hosts ZeRO++: losses differ by {worst:.2e} from ZeRO-3")
    check(bq <= 0.5 * bp, f"two hosts ZeRO++: the veth carried {bq} bytes, plain ZeRO-3 {bp}")
    print(f"two hosts ZeRO-3 bf16: veth {bp} bytes plain, {bq} with ZeRO++ ({bq / bp:.3f}); losses within {worst:.1e}")


def partition(env):
    """The network between the two hosts goes away mid-run (every packet on
    the veth dropped): the heartbeat must end the job within its limit,
    naming the rank on the other side, and the last checkpoint must resume."""
    with TwoHosts(env) as h:
        if h.skip:
            print("skip: " + h.skip)
            return SKIP
        if not h.ok:
            return 1
        limit = 3 * SCALE
        model = env.init("llama")
        cfg = env.config("c.json", model, train_iters=100000, save_interval=2, save_total_limit=2)
        out = env.path("out")
        e = {k: v for k, v in os.environ.items() if not k.startswith(("CLLM_", "OMP_"))}
        e.update(RUN)
        # output to files: a daemon left on the far side of the cut would keep
        # pipes open after the job has ended
        logs = [open(env.path("job.out"), "w+"), open(env.path("job.err"), "w+")]
        p = subprocess.Popen(h.launch("train", "--config", cfg, "--out", out, heartbeat=limit), env=e,
                             stdout=logs[0], stderr=logs[1], text=True, start_new_session=True)
        try:
            t0 = time.monotonic()
            while latest_step(out) < 4 and p.poll() is None and time.monotonic() - t0 < 120 * SCALE:
                time.sleep(0.05)
            check(p.poll() is None, f"partition: the run ended before the cut (rc {p.poll()})")
            if p.poll() is not None:
                logs[1].seek(0)
                print(logs[1].read()[-3000:], file=sys.stderr)
                return 1
            ranks = {}
            for pid in h.leftovers():
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        if b"train" in f.read():
                            ranks[pid] = True
                except OSError:
                    pass
            # the cut: both ends of the link stop passing packets (no RST, no
            # FIN: to TCP, the peer simply goes silent, as behind a dead switch)
            for i in (0, 1):
                q = h.ip("-n", h.ns[i], "link", "set", h.veth[i], "down")
                check(q.returncode == 0, f"partition: link down: {q.stderr}")
            t_cut = time.monotonic()
            try:
                p.wait(timeout=limit + 60 * SCALE)
            except subprocess.TimeoutExpired:
                check(False, f"partition: the job still runs {limit + 60 * SCALE} s after the cut")
            took = time.monotonic() - t_cut
            # the ranks themselves must be gone on both sides of the cut
            # (OpenMPI's daemon on the far side may wait for its launcher)
            time.sleep(1)
            left = [pid for pid in ranks if os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read()
                    .split(")")[-1].split()[0] != "Z"]
            check(not left, f"partition: training ranks still running after the job ended: {left}")
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        logs[1].seek(0)
        err = logs[1].read()
        for f in logs:
            f.close()
        check(p.returncode != 0, "partition: exit 0 after the network was cut")
        named = re.search(r"cllm dist: rank (\d+) \(host [^,]+, pid \d+\): no heartbeat from rank (\d+)", err)
        check(named is not None and named.group(1) != named.group(2),
              f"partition: no heartbeat message naming the rank across the cut:\n{err[-3000:]}")
        # detection (limit + limit / 8), then mpirun waits for the daemon across
        # the cut until `cllm launch` stops it (15 s, LAUNCH_GRACE_S)
        check(took <= limit + 15 + 6 + 2 * SCALE,
              f"partition: the job ended {took:.1f} s after the cut (heartbeat limit {limit} s + 15 s)")
        check("cllm launch: mpirun did not end the job within 15 s" in err,
              f"partition: no message from the launcher about stopping mpirun:\n{err[-2000:]}")
        print(f"partition: cut after checkpoint-{latest_step(out)}; job ended {took:.1f} s later (limit {limit} s), "
              f"rc {p.returncode}" + (f", rank {named.group(1)} named rank {named.group(2)}" if named else ""))
        step = latest_step(out)
        check(step >= 4 and step % 2 == 0, f"partition: latest names step {step}")
        if step <= 0:
            return 1
        q = run([env.cllm, "train", "--config", cfg, "--out", out, "--resume", "auto", "--steps", str(step + 2)],
                env=RUN, timeout=120 * SCALE)
        check(q.returncode == 0 and "(resumed)" in q.stderr, f"partition: resume: rc {q.returncode}: {q.stderr[-2000:]}")
        if q.returncode == 0:
            print(f"partition: resumed from checkpoint-{step} in one process to step {step + 2}: ok")
        return 0


def latest_step(out):
    try:
        with open(os.path.join(out, "latest")) as f:
            name = f.read().strip()
    except OSError:
        return 0
    m = re.fullmatch(r"checkpoint-(\d+)", name)
    return int(m.group(1)) if m else -1


def main():
    # ctest's timeout sends SIGTERM: unwind so that namespaces are deleted
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--case", required=True, choices=["cli", "fail", "netns", "partition"])
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    env = Env(os.path.abspath(a.cllm), os.path.abspath(a.build), "launch_" + a.case)
    rc = 0
    try:
        rc = {"cli": cli, "fail": fail, "netns": netns, "partition": partition}[a.case](env) or 0
    finally:
        if not a.keep and not FAILS:
            shutil.rmtree(env.dir, ignore_errors=True)
    if rc == SKIP and not FAILS:
        return SKIP
    print(f"{a.case}: {len(FAILS)} failure(s)" + (f" (files kept in {env.dir})" if FAILS else ""))
    return 1 if FAILS or rc else 0


if __name__ == "__main__":
    sys.exit(main())
