"""A `cllm serve` process for tests and benchmarks (tests/serve_test.py,
tests/serve_lora_test.py, tests/tp_infer_test.py, bench/serve_bench.py).

Server(cmd) runs the full command line `cmd` (`[cllm, "serve", ...]`, or an
mpirun line around it) and returns once the server prints
`listening on http://HOST:PORT` on stderr (the port is then `.port`); its
stderr keeps being collected in `.log`. A server that exits or stays silent
for `start_timeout` seconds raises SystemExit with what it printed.
"""
import http.client
import json
import os
import re
import signal
import subprocess
import threading
import time


class Server:
    def __init__(self, cmd, env=None, start_timeout=120, new_session=False, stdout=subprocess.DEVNULL):
        self.p = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=stdout, env=env, start_new_session=new_session)
        self.new_session = new_session
        self.log = []
        self.port = None
        deadline = time.time() + start_timeout
        while time.time() < deadline:
            line = self.p.stderr.readline().decode(errors="replace")
            if not line:
                break
            self.log.append(line)
            m = re.search(r"listening on http://(?:[0-9.]+|\[[0-9a-fA-F:]+\]):(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        if self.port is None:
            self.kill()
            raise SystemExit("server did not start:\n" + "".join(self.log) + self.p.stderr.read().decode(errors="replace"))
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        for line in self.p.stderr:
            self.log.append(line.decode(errors="replace"))

    def status_kib(self, key="VmRSS"):
        """A /proc/PID/status field in KiB (VmRSS, VmHWM), 0 if absent."""
        try:
            with open(f"/proc/{self.p.pid}/status") as f:
                for line in f:
                    if line.startswith(key + ":"):
                        return int(line.split()[1])
        except OSError:
            pass
        return 0

    def rss_kib(self):
        return self.status_kib("VmRSS")

    def kill(self):
        """SIGKILL (to the whole process group when started in a new session)."""
        try:
            if self.new_session:
                os.killpg(self.p.pid, signal.SIGKILL)
            else:
                self.p.kill()
        except ProcessLookupError:
            pass
        self.p.wait()

    def wait(self, timeout):
        """The exit code, or None after killing a server still running at the timeout."""
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def stop(self, sig=signal.SIGTERM, timeout=60):
        """Sends sig (SIGTERM: drain and exit 0) and returns the exit code (None if it had to be killed)."""
        if self.p.poll() is None:
            self.p.send_signal(sig)
        return self.wait(timeout)


def req(port, method, path, body=None, headers=None, timeout=120, raw=None):
    """One HTTP request: (status, parsed JSON or None, raw bytes, response)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    c.request(method, path, body=data, headers=h)
    r = c.getresponse()
    out = r.read()
    c.close()
    try:
        js = json.loads(out) if out else None
    except ValueError:
        js = None
    return r.status, js, out, r
