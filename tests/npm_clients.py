"""Installs the pinned npm test clients (tests/npm: package.json + lockfile:
openai, @huggingface/inference, @huggingface/jinja) into BUILD/npm-clients
with `npm ci --ignore-scripts`, once per lockfile (a stamp holds its hash;
a file lock serialises tests that run in parallel). Returns the folder, or
None when node/npm are not installed."""
import fcntl
import hashlib
import os
import shutil
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))


def install(build):
    if shutil.which("npm") is None or shutil.which("node") is None:
        return None
    src = os.path.join(HERE, "npm")
    dst = os.path.join(build, "npm-clients")
    os.makedirs(dst, exist_ok=True)
    with open(os.path.join(src, "package-lock.json"), "rb") as f:
        want = hashlib.sha256(f.read()).hexdigest()
    with open(os.path.join(build, "npm-clients.lock"), "w") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        stamp = os.path.join(dst, ".installed")
        if os.path.exists(stamp) and open(stamp).read() == want and os.path.isdir(os.path.join(dst, "node_modules")):
            return dst
        for name in ("package.json", "package-lock.json"):
            shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))
        r = subprocess.run(["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund"], cwd=dst,
                           capture_output=True)
        if r.returncode != 0:
            raise SystemExit("npm ci failed:\n" + r.stdout.decode(errors="replace") + r.stderr.decode(errors="replace"))
        with open(stamp, "w") as f:
            f.write(want)
    return dst
