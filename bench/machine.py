#!/usr/bin/python3
"""
The machine a benchmark runs on, as one header line for its report, so
that every figure carries the CPU and instruction set it was measured on.

  /usr/bin/python3 bench/machine.py [--cllm build/cllm] [--json]

prints, for example,

  machine: AMD EPYC (2 logical CPUs) [AuthenticAMD family 25 model 1]; 2
  logical CPUs, 2 usable; isa flags: avx2 fma, lacking avx512f avx512_bf16
  amx; oneDNN 2.6.3, isa avx2; cllm: isa avx2, fp32 gemm onednn, bf16 gemm
  fp32-widened, kernels avx2; load 1.52

(on one line). The parts:
  - the CPU model from /proc/cpuinfo ("model name"; vendor, family and
    model numbers too, since a virtual machine may show only "AMD EPYC");
  - logical CPUs in the machine and those this process may run on;
  - which of the flags that decide the GEMM kernels the CPU has: avx2, fma,
    avx512f, avx512_bf16, amx (amx_bf16 + amx_tile);
  - oneDNN's effective ISA, asked of the libdnnl that cllm is linked with
    (dnnl_get_effective_cpu_isa, which honours ONEDNN_MAX_CPU_ISA);
  - the kernels cllm chose (from `cllm --version`; for a binary without it,
    inferred: fp32 GEMM on oneDNN, bf16 GEMM on oneDNN from avx512_core up);
  - the 1-minute load average (this machine may be shared).

Where `cllm --version` succeeds and prints "key: value" lines, cllm's own
account is preferred to this script's inference: its "cpu" line names the
CPU (the vendor, family and model numbers are kept beside it), its "onednn"
line replaces the oneDNN part, and its other lines ("isa: avx2", "fp32 gemm:
onednn", "bf16 gemm: onednn|fp32-widened", "kernels: avx2", ...) are the
kernel choices reported; the ISA flags always come from /proc/cpuinfo
(cllm's "cpu features" line lists more than the five that matter here).

Python benchmarks call header(cllm); shell benchmarks run this file.
Nothing here fails: a fact that cannot be read is reported as unknown.
"""

import argparse
import ctypes
import ctypes.util
import json
import os
import re
import subprocess

# flags that decide which GEMM kernels can run; "amx" stands for amx_tile + amx_bf16
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx")

# dnnl_cpu_isa_t of oneDNN 2.x (oneapi/dnnl/dnnl_types.h)
DNNL_ISA = {0x0: "all", 0x1: "sse41", 0x3: "avx", 0x7: "avx2", 0xf: "avx512_mic", 0x1f: "avx512_mic_4ops",
            0x27: "avx512_core", 0x67: "avx512_core_vnni", 0xe7: "avx512_core_bf16",
            0x3e7: "avx512_core_amx", 0x407: "avx2_vnni"}
# ISAs on which oneDNN 2.x implements the bf16 matmul primitive
DNNL_BF16_ISAS = ("avx512_core", "avx512_core_vnni", "avx512_core_bf16", "avx512_core_amx")


def read_cpuinfo(path="/proc/cpuinfo"):
    """The first processor's fields (name -> value) of /proc/cpuinfo, {} if unreadable."""
    info = {}
    try:
        with open(path) as f:
            for line in f:
                if not line.strip():
                    if info:
                        break
                    continue
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return info


def isa_flags(flags):
    """Which of ISA_FLAGS are present in a /proc/cpuinfo flags string: (have, lack)."""
    got = set(flags.split())
    have, lack = [], []
    for f in ISA_FLAGS:
        ok = {"amx_tile", "amx_bf16"} <= got if f == "amx" else f in got
        (have if ok else lack).append(f)
    return have, lack


def dnnl_library(cllm):
    """Path of the libdnnl that cllm loads (from ldd), else the system's."""
    if cllm:
        try:
            out = subprocess.run(["ldd", cllm], capture_output=True, text=True, timeout=10).stdout
            m = re.search(r"libdnnl\S*\s+=>\s+(\S+)", out)
            if m:
                return m.group(1)
        except (OSError, subprocess.SubprocessError):
            pass
    return ctypes.util.find_library("dnnl")


class _DnnlVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_int), ("minor", ctypes.c_int), ("patch", ctypes.c_int),
                ("hash", ctypes.c_char_p), ("cpu_runtime", ctypes.c_uint), ("gpu_runtime", ctypes.c_uint)]


def dnnl_isa(cllm):
    """(version string, effective ISA name) of oneDNN, or (None, None)."""
    path = dnnl_library(cllm)
    if not path:
        return None, None
    try:
        lib = ctypes.CDLL(path)
        lib.dnnl_version.restype = ctypes.POINTER(_DnnlVersion)
        lib.dnnl_get_effective_cpu_isa.restype = ctypes.c_int
        v = lib.dnnl_version().contents
        isa = lib.dnnl_get_effective_cpu_isa()
        return "%d.%d.%d" % (v.major, v.minor, v.patch), DNNL_ISA.get(isa, "0x%x" % isa)
    except (OSError, AttributeError, ValueError):
        return None, None


def cllm_version(cllm):
    """The "key: value" lines of `cllm --version` as a list of pairs ([] if it has none)."""
    if not cllm:
        return []
    try:
        p = subprocess.run([cllm, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    if p.returncode != 0:
        return []
    pairs = []
    for line in p.stdout.splitlines():
        m = re.match(r"\s*([A-Za-z][\w .+-]*?)\s*:\s*(.+?)\s*$", line)
        if m:
            pairs.append((m.group(1).lower(), m.group(2)))
    return pairs


def facts(cllm=None):
    """Everything header() reports, as a dict of strings."""
    info = read_cpuinfo()
    have, lack = isa_flags(info.get("flags", ""))
    cpu = info.get("model name", "unknown CPU")
    ident = " ".join(x for x in (info.get("vendor_id"),
                                 "family " + info["cpu family"] if "cpu family" in info else None,
                                 "model " + info["model"] if "model" in info else None) if x)
    if ident:
        cpu += " (%s)" % ident
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 0
    isa = ", ".join(x for x in (" ".join(have), "lacking " + " ".join(lack) if lack else "") if x) or "unknown"
    version, visa = dnnl_isa(cllm)
    onednn = "oneDNN %s, isa %s" % (version, visa) if version else "oneDNN: unknown (libdnnl not found)"
    if visa is None:
        bf16 = "unknown"
    elif visa in DNNL_BF16_ISAS:
        bf16 = "onednn"
    else:
        bf16 = "none (oneDNN has no bf16 matmul below avx512_core)"
    kernels = ["fp32 gemm onednn", "bf16 gemm " + bf16]
    reported = cllm_version(cllm)
    if reported:
        kernels = []
        for key, value in reported:
            if key == "cpu":
                cpu = value + (" [%s]" % ident if ident else "")
            elif key in ("onednn", "dnnl"):
                onednn = "oneDNN " + value
            elif key not in ("cllm", "version", "cpu features"):
                kernels.append("%s %s" % (key, value))
    try:
        load = "%.2f" % os.getloadavg()[0]
    except OSError:
        load = "unknown"
    return {"cpu": cpu, "cpus": "%d logical CPUs, %d usable" % (os.cpu_count() or 0, usable),
            "isa": isa, "onednn": onednn, "kernels": ", ".join(kernels),
            "source": "cllm --version" if reported else "/proc/cpuinfo and libdnnl", "load": load}


def header(cllm=None):
    """One line naming the CPU, its core count and ISA, oneDNN's ISA and cllm's kernels."""
    f = facts(cllm)
    return ("machine: %s; %s; isa flags: %s; %s; cllm: %s; load %s"
            % (f["cpu"], f["cpus"], f["isa"], f["onednn"], f["kernels"] or "(none reported)", f["load"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cllm", help="the cllm binary whose oneDNN and kernels to report (default: none)")
    ap.add_argument("--json", action="store_true", help="print the facts as a JSON object instead")
    a = ap.parse_args()
    cllm = os.path.abspath(a.cllm) if a.cllm else None
    print(json.dumps(facts(cllm)) if a.json else header(cllm))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
