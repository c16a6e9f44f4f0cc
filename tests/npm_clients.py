"""Installs pinned npm test packages (a folder of tests/ with package.json +
lockfile; by default tests/npm: openai, @huggingface/inference,
@huggingface/jinja) into BUILD/<dest> (default npm-clients) with `npm ci
--ignore-scripts`, once per lockfile (a stamp holds its hash; a file lock
serialises tests that run in parallel). Returns the folder, or None when
node/npm are not installed. A failing `npm ci` raises SystemExit, or with
soft=True returns None and leaves npm's output in `last_error`. With
locked_install=True a refused `npm ci` is followed by `npm install --no-save`
from the same lockfile."""
import fcntl
import hashlib
import os
import shutil
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))


last_error = ""


def install(build, folder="npm", dest="npm-clients", soft=False, locked_install=False):
    global last_error
    last_error = ""
    if shutil.which("npm") is None or shutil.which("node") is None:
        last_error = "node/npm are not installed"
        return None
    src = os.path.join(HERE, folder)
    dst = os.path.join(build, dest)
    os.makedirs(dst, exist_ok=True)
    with open(os.path.join(src, "package-lock.json"), "rb") as f:
        want = hashlib.sha256(f.read()).hexdigest()
    with open(os.path.join(build, dest + ".lock"), "w") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        stamp = os.path.join(dst, ".installed")
        if os.path.exists(stamp) and open(stamp).read() == want and os.path.isdir(os.path.join(dst, "node_modules")):
            return dst
        for name in ("package.json", "package-lock.json"):
            shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))
        r = subprocess.run(["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund"], cwd=dst,
                           capture_output=True)
        if r.returncode != 0 and locked_install:
            # npm ci refuses a lockfile that lacks optional packages of other
            # platforms (which a registry without them cannot record); npm
            # install --no-save installs the same locked versions and hashes
            # without rewriting the lockfile.
            r = subprocess.run(["npm", "install", "--no-save", "--ignore-scripts", "--no-audit", "--no-fund"],
                               cwd=dst, capture_output=True)
        if r.returncode != 0:
            last_error = "npm ci failed:\n" + r.stdout.decode(errors="replace") + r.stderr.decode(errors="replace")
            if soft:
                return None
            raise SystemExit(last_error)
        with open(stamp, "w") as f:
            f.write(want)
    return dst
