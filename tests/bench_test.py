#!/usr/bin/python3
"""
Checks of the benchmark drivers' own logic (no timing is asserted):

  - bench/machine.py: /proc/cpuinfo parsing and the ISA flags on synthetic
    AVX2-only and AVX-512/AMX flag lines; the live header against
    /proc/cpuinfo read here independently; oneDNN's effective ISA asked of
    the libdnnl cllm links, checked against the cap set with
    ONEDNN_MAX_CPU_ISA (a cap of sse41 must read back as sse41) and against
    the "isa:" line oneDNN's own verbose mode prints in a cllm run.
  - bench/train_step.py's OpenBLAS core-type probe: with a stand-in
    interpreter whose SKYLAKEX probe dies by SIGILL (as on an AVX2-only CPU)
    and whose ZEN probe fails, the fastest remaining core type is chosen;
    with every probe failing, the bench stops with a message naming each
    core type and its reason.
  - `cllm --version`'s cpu / isa / kernel lines preferred where it prints
    them (a stand-in binary), ignored where it fails;
  - a cllm bf16 run that fails (a stand-in binary) yields a "skipped" row
    with the reason instead of stopping the bench.
  - train_step.run_child's peak RSS is the command's own: a parent holding
    400 MiB does not lend it to a small child (Linux keeps a forked child's
    pre-exec high-water mark), and a child's signal death reads as -signal.

  /usr/bin/python3 tests/bench_test.py --cllm build/cllm --build build
"""
import argparse
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import contextlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bench"))

import machine  # noqa: E402
import train_step  # noqa: E402

failures = []


def check(cond, what):
    print("%s: %s" % ("ok" if cond else "FAIL", what))
    if not cond:
        failures.append(what)


def write_exec(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)


def test_cpuinfo(tmp):
    path = os.path.join(tmp, "cpuinfo")
    with open(path, "w") as f:
        f.write("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"
                "model name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu sse avx avx2 fma avx512f "
                "avx512_bf16 amx_bf16 amx_tile amx_int8\n\nprocessor\t: 1\nmodel name\t: other\n")
    info = machine.read_cpuinfo(path)
    check(info.get("model name") == "Intel(R) Xeon(R) Platinum 8480+", "first processor's model name")
    check(info.get("cpu family") == "6" and info.get("model") == "143", "family and model numbers")
    check(machine.isa_flags(info["flags"]) == (["avx2", "fma", "avx512f", "avx512_bf16", "amx"], []),
          "AVX-512 + AMX flags all present")
    check(machine.isa_flags("fpu sse avx avx2 fma") == (["avx2", "fma"], ["avx512f", "avx512_bf16", "amx"]),
          "AVX2-only flags: avx512f, avx512_bf16, amx lacking")
    check(machine.isa_flags("avx2 fma amx_tile") == (["avx2", "fma"], ["avx512f", "avx512_bf16", "amx"]),
          "amx needs amx_bf16 as well as amx_tile")
    check(machine.read_cpuinfo(os.path.join(tmp, "missing")) == {}, "unreadable cpuinfo gives no facts")


def test_live_header(cllm):
    with open("/proc/cpuinfo") as f:
        text = f.read()
    m = re.search(r"^model name\s*:\s*(.*)$", text, re.M)
    flags = set(re.search(r"^flags\s*:\s*(.*)$", text, re.M).group(1).split())
    own = machine.header(None)  # this script's own reading, without cllm --version
    print(own)
    check(own.startswith("machine: "), "header line starts with 'machine: '")
    check(m is None or m.group(1).strip() in own, "header names /proc/cpuinfo's model name")
    check("%d logical CPUs" % os.cpu_count() in own, "header gives the logical CPU count")
    isa = re.search(r"isa flags: ([^;]*);", own).group(1)
    have = isa.split("lacking")[0].replace(",", " ").split()
    for flag in ("avx2", "fma", "avx512f", "avx512_bf16"):
        check((flag in flags) == (flag in have), "header's isa part agrees with /proc/cpuinfo on %s" % flag)
    # where cllm --version names the CPU, ISA and kernels, the header carries its values
    h = machine.header(cllm)
    print(h)
    reported = dict(machine.cllm_version(cllm))
    check(all(value in h for key, value in reported.items() if key not in ("cllm", "version", "cpu features")),
          "every line of cllm --version (%d) is in the header" % len(reported))
    if "bf16 gemm" in reported:
        # oneDNN 2.x runs bf16 natively from AVX-512 up; without avx512f cllm must widen to fp32
        want = "onednn" if "avx512f" in flags else "fp32-widened"
        check(("bf16 gemm " + want) in h, "bf16 gemm is %s on a CPU %s avx512f" % (want, "with" if "avx512f" in flags else "without"))


def dnnl_verbose_isa(cllm, tmp, env):
    """The ISA oneDNN's verbose mode names in a real cllm run (one training step of a tiny model)."""
    model = os.path.join(tmp, "tiny")
    if not os.path.exists(model):
        subprocess.run([cllm, "init", "--arch", "gpt2", "--preset", "tiny", "--seed", "1", "--out", model],
                       check=True, capture_output=True)
        with open(os.path.join(tmp, "d.jsonl"), "w") as f:
            for i in range(4):
                f.write(json.dumps({"input_ids": [(7 * i + j) % 50 + 1 for j in range(16)]}) + "\n")
    p = subprocess.run([cllm, "train", "--model", model, "--data", os.path.join(tmp, "d.jsonl"), "--out",
                        os.path.join(tmp, "out"), "--steps", "1", "--batch-size", "2", "--seq-len", "16"],
                       capture_output=True, text=True, env=dict(env, ONEDNN_VERBOSE="1", OMP_NUM_THREADS="1"))
    m = re.search(r"^(?:onednn|dnnl)_verbose,info,cpu,isa:(.*)$", p.stdout + p.stderr, re.M)
    return m.group(1).strip() if m else None


def test_onednn_isa(cllm, tmp):
    _, isa = machine.dnnl_isa(cllm)
    check(isa is not None, "oneDNN's effective ISA is read from the libdnnl cllm links (%s)" % isa)
    # what oneDNN itself prints for each ISA name in its verbose info line
    words = {"sse41": "SSE4.1", "avx": "AVX", "avx2": "AVX2", "avx2_vnni": "AVX2 with",
             "avx512_core": "AVX-512", "avx512_core_vnni": "Deep Learning Boost",
             "avx512_core_bf16": "bfloat16", "avx512_core_amx": "AMX"}
    verbose = dnnl_verbose_isa(cllm, tmp, os.environ)
    print("oneDNN verbose isa: %s" % verbose)
    check(verbose is not None and isa in words and words[isa] in verbose,
          "machine.py's oneDNN ISA (%s) matches oneDNN's verbose line (%s)" % (isa, verbose))
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="SSE41")
    p = subprocess.run([sys.executable, os.path.join(HERE, "..", "bench", "machine.py"), "--cllm", cllm, "--json"],
                       capture_output=True, text=True, env=env)
    f = json.loads(p.stdout)
    check(f["onednn"].endswith("isa sse41"), "ONEDNN_MAX_CPU_ISA=SSE41 reads back as sse41 (%s)" % f["onednn"])
    if f["source"] != "cllm --version":  # else cllm names its kernels itself
        check("bf16 gemm none" in f["kernels"],
              "below avx512_core no oneDNN bf16 matmul is claimed (%s)" % f["kernels"])


def test_version_preferred(tmp):
    fake = os.path.join(tmp, "fake_version.sh")
    write_exec(fake, '#!/bin/sh\n[ "$1" = --version ] || exit 2\n'
                     'printf "cllm 9.9\\ncpu: Example CPU 7 (4 logical CPUs)\\ncpu features: avx2 fma f16c\\n'
                     'isa: avx2\\nonednn: 9.1.0, isa avx2\\nbf16 gemm: fp32-widened\\nkernels: avx2\\n"\n')
    f = machine.facts(fake)
    check(f["cpu"].startswith("Example CPU 7 (4 logical CPUs)"), "cllm --version's cpu line names the CPU (%s)" % f["cpu"])
    check(f["onednn"] == "oneDNN 9.1.0, isa avx2", "and its onednn line the oneDNN part (%s)" % f["onednn"])
    check(f["kernels"] == "isa avx2, bf16 gemm fp32-widened, kernels avx2" and f["source"] == "cllm --version",
          "its other lines are the kernels reported (%s)" % f["kernels"])
    check("lacking" in f["isa"] or "avx512f" in f["isa"], "the ISA flags still come from /proc/cpuinfo (%s)" % f["isa"])
    bad = os.path.join(tmp, "no_version.sh")
    write_exec(bad, "#!/bin/sh\necho \"cllm: unknown command '$1'\" >&2\nexit 2\n")
    check(machine.facts(bad)["source"] != "cllm --version", "a cllm without --version is not believed")


def test_coretype_probe(tmp):
    some = os.path.join(tmp, "some_fail.sh")
    write_exec(some, '#!/bin/sh\ncase "$OPENBLAS_CORETYPE" in\n'
                     '  SKYLAKEX) kill -ILL $$ ;;\n'
                     '  ZEN) echo "RuntimeError: probe broke" >&2; exit 3 ;;\n'
                     '  *) echo \'{"gflops": 42.5, "blas": ["/usr/lib/libopenblasp-r0.3.21.so"]}\' ;;\nesac\n')
    train_step.PY = some
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        ct, why = train_step.choose_coretype("auto", 1)
    check(ct == "HASWELL", "SIGILL and failing probes are skipped, HASWELL chosen (%s)" % ct)
    check("SKYLAKEX unavailable (killed by SIGILL)" in why and "ZEN unavailable (exit status 3)" in why,
          "the choice says which core types were unavailable and why (%s)" % why)
    check("SIGILL" in err.getvalue() and "RuntimeError: probe broke" in err.getvalue(),
          "each failed probe is reported on stderr with its reason")

    allfail = os.path.join(tmp, "all_fail.sh")
    write_exec(allfail, '#!/bin/sh\n[ "$OPENBLAS_CORETYPE" = SKYLAKEX ] && kill -ILL $$\n'
                        'echo "ModuleNotFoundError: No module named torch" >&2; exit 1\n')
    train_step.PY = allfail
    msg = None
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            train_step.choose_coretype("auto", 1)
        except SystemExit as e:
            msg = str(e.code)
    check(msg is not None, "every probe failing stops the bench")
    msg = msg or ""
    check(all(ct in msg for ct in train_step.CORETYPES), "the message names every core type tried")
    check("killed by SIGILL" in msg and "No module named torch" in msg and "--openblas-coretype" in msg,
          "the message gives each reason and a hint")
    check(train_step.choose_coretype("HASWELL", 1) == ("HASWELL", "given"), "a given core type is used as is")


def test_bf16_skip(tmp):
    fake = os.path.join(tmp, "fake_cllm.sh")
    write_exec(fake, '#!/bin/sh\necho "cllm_matmul_bf16: no bf16 GEMM on this CPU" >&2\nexit 1\n')
    args = argparse.Namespace(cllm=fake, threads=1, steps=2)
    r = train_step.run_cllm(args, tmp, os.path.join(tmp, "none.jsonl"), 1, 8, tmp, "bf16")
    check(r.get("skipped") == "cllm bf16 exit status 1: cllm_matmul_bf16: no bf16 GEMM on this CPU",
          "a failing cllm bf16 run is skipped with its reason (%s)" % r.get("skipped"))
    code = None
    try:
        train_step.run_cllm(args, tmp, os.path.join(tmp, "none.jsonl"), 1, 8, tmp, "fp32")
    except SystemExit as e:
        code = str(e.code)
    check(code is not None and "exit status 1" in code, "a failing fp32 run still stops the bench")


def test_child_rss(tmp):
    """run_child reports the command's own peak RSS, not the resident set
    this (parent) process had when it forked."""
    ballast = bytearray(400 << 20)  # 400 MiB, touched so that it is resident
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1
    rc, _, _, small = train_step.run_child([sys.executable, "-c", "pass"], dict(os.environ))
    check(rc == 0 and small < 100 * 1024, "a small child's peak RSS leaves out the parent's 400 MiB (%d KiB)" % small)
    rc, _, _, big = train_step.run_child([sys.executable, "-c", "b=bytearray(200<<20)\nfor i in range(0,len(b),4096): b[i]=1"],
                                         dict(os.environ))
    check(rc == 0 and 200 * 1024 <= big < 300 * 1024, "a child that touches 200 MiB reports 200-300 MiB (%d KiB)" % big)
    rc, _, err, _ = train_step.run_child([sys.executable, "-c", "import os,signal; os.kill(os.getpid(), signal.SIGILL)"],
                                         dict(os.environ))
    check(rc == -4, "a child killed by SIGILL gives -4 as subprocess would (%d)" % rc)
    del ballast


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cllm", required=True)
    ap.add_argument("--build")
    a = ap.parse_args()
    cllm = os.path.abspath(a.cllm)
    with tempfile.TemporaryDirectory(prefix="cllm_bench_test_") as tmp:
        test_cpuinfo(tmp)
        test_live_header(cllm)
        test_onednn_isa(cllm, tmp)
        test_version_preferred(tmp)
        test_coretype_probe(tmp)
        test_bf16_skip(tmp)
        test_child_rss(tmp)
    if failures:
        print("%d check(s) failed" % len(failures))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
