#!/usr/bin/env bash
# Installs every Debian package cllm needs to build, test and benchmark.
# Idempotent: packages already present are left alone. Runs as root or through sudo.
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config git
  libdnnl-dev          # matmul (fp32, bf16) with AVX-512 / AVX512-BF16 detection
  libjansson-dev       # JSON with line/column errors
  libpcre2-dev         # regexes inside tokenizer.json
  libunistring-dev     # Unicode normal forms (NFC/NFKC...) and lowercasing for tokenizer normalizers
  libmicrohttpd-dev    # HTTP server
  libopenmpi-dev openmpi-bin   # MPI
  iproute2             # ip netns: the two-host launcher test builds hosts as network namespaces
  slurmctld slurmd slurm-client  # Slurm 22.05: tests/slurm_test.py starts a one-node cluster of its own
                       # (private slurm.conf, auth/none); munge comes as a dependency and is not used.
                       # Where services start at install (systemd or sysv, not a container), munge starts;
                       # slurmctld and slurmd do not: their units and init scripts need /etc/slurm/slurm.conf
  python3-torch python3-numpy  # PyTorch references in tests and benchmarks (/usr/bin/python3)
  python3-jinja2       # the chat-template test renders with Jinja2 as transformers does
  libopenblas0-pthread         # the BLAS Debian's torch uses for fp32 matmuls (else the slow reference BLAS)
  librsvg2-bin         # rsvg-convert: the trainer test renders the `cllm plot` SVG when present
  clang-14 libclang-rt-14-dev libomp-14-dev  # clang builds: fuzz targets (scripts/fuzz.sh) and the clang sanitizer pass (scripts/test.sh): libFuzzer + sanitizer runtimes, OpenMP for clang
)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "install-deps.sh: not root and no sudo; install these packages: ${PKGS[*]}" >&2; exit 1
  fi
fi

# Node.js and npm run the tokenizer oracle in the tests (HF's JavaScript
# tokenizer). A machine that already has node and npm keeps its own.
command -v node >/dev/null 2>&1 || PKGS+=(nodejs)
command -v npm >/dev/null 2>&1 || PKGS+=(npm)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps.sh: all packages present"
  exit 0
fi
echo "install-deps.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
