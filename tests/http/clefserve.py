"""Helpers of the Python HTTP tests (tests/http/test_*.py): start a real `clef serve` on
127.0.0.1 (port 0, read back from its log), talk to it with the standard library, stop it
with SIGTERM.  Every wait is bounded.  Standard library only."""
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

SKIP = 77  # ctest SKIP_RETURN_CODE


def skip(why):
    print("SKIPPED: " + why)
    sys.exit(SKIP)


class Server:
    """`clef serve --model <tiny fixture> --port 0 --threads 1 <args>`."""

    def __init__(self, clef, fixtures, args=(), env=None, wait_ready=True):
        self.log = tempfile.NamedTemporaryFile(prefix="clef-serve-", suffix=".log", delete=False)
        e = dict(os.environ)
        e.pop("CLEF_API_KEY", None)
        e.update(env or {})
        cmd = [clef, "serve", "--model", os.path.join(fixtures, "tiny-clef-omni"), "--port", "0", "--threads", "1",
               *args]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.log, env=e)
        self.port = None
        deadline = time.time() + 30
        while time.time() < deadline and self.port is None:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", self.read_log())
            if m:
                self.port = int(m.group(1))
            elif self.proc.poll() is not None:
                raise RuntimeError("clef serve exited %s:\n%s" % (self.proc.returncode, self.read_log()))
            else:
                time.sleep(0.05)
        if self.port is None:
            self.stop()
            raise RuntimeError("clef serve did not start listening:\n" + self.read_log())
        self.base = "http://127.0.0.1:%d" % self.port
        if wait_ready:
            self.wait_ready()

    def read_log(self):
        with open(self.log.name, "r", errors="replace") as f:
            return f.read()

    def wait_ready(self, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.request("GET", "/healthz")[0] == 200:
                return
            time.sleep(0.05)
        raise RuntimeError("the model did not load:\n" + self.read_log())

    def request(self, method, path, body=None, headers=None, timeout=60):
        """(status, headers as a dict with lower-case names, body bytes)."""
        return request(self.port, method, path, body, headers, timeout)

    def post_json(self, obj, key=None, headers=None):
        h = {"Content-Type": "application/json"}
        if key:
            h["Authorization"] = "Bearer " + key
        h.update(headers or {})
        return self.request("POST", "/v1/systemone", json.dumps(obj).encode(), h)

    def stop(self, timeout=60):
        """SIGTERM, wait; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        os.unlink(self.log.name)
        return self.proc.returncode


def request(port, method, path, body=None, headers=None, timeout=60):
    """One request to 127.0.0.1:port on a fresh connection: (status, headers as a dict with
    lower-case names, body bytes)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def arg(name, default=None):
    """--name VALUE of sys.argv."""
    if name in sys.argv:
        return sys.argv[sys.argv.index(name) + 1]
    return default
