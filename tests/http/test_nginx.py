#!/usr/bin/env python3
"""test_nginx.py — two `clef serve` replicas behind nginx with deploy/nginx/clef.conf, one of them
stopped (SIGTERM) and restarted under load; counts what was lost (issue 21, part 3).

Starts replicas A and B (tiny fixture, --api-key, --max-connections-per-client 0 as the config
asks, forwards stretched by CLEF_SERVE_TEST_FORWARD_DELAY_MS so that requests are in flight when A
is stopped; see A_ENV below) on free loopback ports, and Debian's nginx as an instance of this user (`nginx -p TMP -c TMP/conf/nginx.conf -e ...
-g 'daemon off; pid ...; error_log ...;'`, every temp path inside TMP) running the shipped
deploy/nginx/clef.conf with its two replica ports, its listen port and its log path substituted
(each exactly once: a reshaped config fails here instead of being tested half).  Then:
  - through nginx: /healthz 200; a decision without the key 401 (not retried, the Authorization
    header passed through otherwise); the client's X-Request-Id echoed; a body over 32 MiB 413 in
    clef's error format;
  - a steady load of decisions (4 keep-alive clients, 3 different requests, each with its own
    X-Request-Id) through nginx while A gets SIGTERM (with one decision sent to A directly just
    before: it must get its 200) and, once it has exited (status 0, within its
    --drain-timeout-s), is restarted on the same port, loading slowly; the load goes on until the
    new A has answered requests through nginx again (the passive health check let it back), and
    nginx must have retried at least one of its 503 "loading" answers on B;
  - every request must end 200 with exactly the bytes a replica answers directly; a client
    retries only on 503 (Retry-After honoured, at most 1 s), and those retries are counted, as are
    the retries nginx made itself (access log: upstream_status "503, 200" or a refused first try);
    lost = requests that ended otherwise: must be 0;
  - both replicas stopped: nginx answers 503 JSON with Retry-After (its own 502 mapped).

usage: test_nginx.py --clef BINARY --fixtures DIR --source DIR   (exit 77 = skipped: no nginx;
install it with scripts/deps.sh --test)
"""
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clefserve import Server, arg, request, skip  # noqa: E402

KEY = "nginx-test-key"
CLIENTS = 4
DRAIN_S = 10
REPLICA_ARGS = ["--api-key", KEY, "--max-connections-per-client", "0", "--drain-timeout-s", str(DRAIN_S)]
# Forwards stretched (CLEF_SERVE_TEST_FORWARD_DELAY_MS) so that requests are in flight on A when it
# is stopped: 600 ms on the first A, which then drains for about a second.  The restarted A loads
# for 4 s more (CLEF_SERVE_TEST_LOAD_DELAY_MS, longer than the config's 3 s fail_timeout) with its
# listener open, so nginx sends it requests while it answers 503 "loading"; they must be retried by
# nginx on B, which needs http_503 and non_idempotent in proxy_next_upstream (without
# non_idempotent the clients see those 503s and this test fails).
B_ENV = {"CLEF_SERVE_TEST_FORWARD_DELAY_MS": "100"}
A_ENV = {"CLEF_SERVE_TEST_FORWARD_DELAY_MS": "600"}
A_RESTART_ENV = {"CLEF_SERVE_TEST_FORWARD_DELAY_MS": "100", "CLEF_SERVE_TEST_LOAD_DELAY_MS": "4000"}
REQUESTS = [
    {"model": "clef-omni", "state": "Our checkout started returning errors and orders are blocked.",
     "questions": {"department": {"type": "choice", "instructions": "Which team should handle the message?",
                                  "criteria": {"billing": "Payments or invoices", "technical": "Bugs or outages"}},
                   "urgency": {"type": "score", "criteria": ["Can wait", "This week", "Today"]}}},
    {"model": "clef-omni", "state": {"ticket": 4711, "text": "I was charged twice for one order."},
     "questions": {"refund": {"type": "noul", "instructions": "Should we refund?"}}},
    {"model": "clef-omni", "state": "The app crashes when I open settings.",
     "questions": {"severity": {"type": "score", "criteria": ["low", "medium", "high", "critical"]},
                   "area": {"type": "choice", "criteria": {"ui": "Screens", "sync": "Data sync", "auth": "Login"}}}},
]


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def substitute(text, old, new):
    if text.count(old) != 1:
        fail("deploy/nginx/clef.conf: expected %r exactly once, found it %d times" % (old, text.count(old)))
    return text.replace(old, new)


class Nginx:
    """Debian's nginx running the shipped config, as this user, everything under a temp prefix."""

    def __init__(self, binary, source, port, replica_ports):
        self.prefix = tempfile.mkdtemp(prefix="clef-nginx-")
        os.chmod(self.prefix, 0o755)  # run as root, nginx's workers are nobody: they enter the prefix
        for d in ("conf", "logs", "tmp"):
            os.mkdir(os.path.join(self.prefix, d))
            os.chmod(os.path.join(self.prefix, d), 0o777 if d == "tmp" else 0o755)
        with open(os.path.join(source, "deploy/nginx/clef.conf")) as f:
            conf = f.read()
        conf = substitute(conf, "server 127.0.0.1:8001 ", "server 127.0.0.1:%d " % replica_ports[0])
        conf = substitute(conf, "server 127.0.0.1:8002 ", "server 127.0.0.1:%d " % replica_ports[1])
        conf = substitute(conf, "listen 8080;", "listen 127.0.0.1:%d;" % port)
        self.access_log = os.path.join(self.prefix, "logs/access.log")
        conf = substitute(conf, "/var/log/nginx/clef-access.log", self.access_log)
        with open(os.path.join(self.prefix, "conf/clef.conf"), "w") as f:
            f.write(conf)
        tmp = os.path.join(self.prefix, "tmp")
        # The main file a Debian install has around conf.d/*.conf, reduced to what nginx needs:
        # one worker, the temp paths inside the prefix (Debian's are under /var/lib/nginx).
        main = ("worker_processes 1;\nevents { worker_connections 1024; }\nhttp {\n"
                "    client_body_temp_path %s/body;\n    proxy_temp_path %s/proxy;\n"
                "    fastcgi_temp_path %s/fastcgi;\n    uwsgi_temp_path %s/uwsgi;\n    scgi_temp_path %s/scgi;\n"
                "    include %s/conf/clef.conf;\n}\n" % (tmp, tmp, tmp, tmp, tmp, self.prefix))
        with open(os.path.join(self.prefix, "conf/nginx.conf"), "w") as f:
            f.write(main)
        self.error_log = os.path.join(self.prefix, "logs/error.log")
        self.cmd = [binary, "-p", self.prefix + "/", "-c", os.path.join(self.prefix, "conf/nginx.conf"),
                    "-e", self.error_log,
                    "-g", "daemon off; pid %s/logs/nginx.pid; error_log %s warn;" % (self.prefix, self.error_log)]
        t = subprocess.run(self.cmd + ["-t"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30)
        if t.returncode != 0:
            fail("nginx -t refuses the config:\n" + t.stdout.decode(errors="replace"))
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        self.port = port
        deadline = time.time() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.time() > deadline:
                    log = self.read(self.error_log)
                    self.stop()
                    fail("nginx did not start:\n" + log)
                time.sleep(0.05)

    @staticmethod
    def read(path):
        try:
            with open(path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)  # nginx's graceful stop
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.prefix, ignore_errors=True)


call = request  # clefserve.request: one request to a port (a replica's or nginx's)


def auth_json(extra=None):
    h = {"Content-Type": "application/json", "Authorization": "Bearer " + KEY}
    h.update(extra or {})
    return h


class Load:
    """CLIENTS threads, each on its own keep-alive connection to nginx, posting decisions back to
    back until stopped.  Per request: 200 with the expected bytes = ok; 503 = wait Retry-After (at
    most 1 s) and send it again (counted); anything else = lost (recorded)."""

    def __init__(self, port, bodies, expected):
        self.port, self.bodies, self.expected = port, bodies, expected
        self.lock = threading.Lock()
        self.sent = self.ok = self.retries_503 = 0
        self.lost = []
        self.done_at = []  # completion times of the ok ones
        self.stop_flag = threading.Event()
        # daemon threads: a failed check (sys.exit) must not wait for them
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True) for i in range(CLIENTS)]

    def start(self):
        for t in self.threads:
            t.start()

    def stop(self):
        self.stop_flag.set()
        for t in self.threads:
            t.join(120)

    def run(self, who):
        conn = None
        n = 0
        while not self.stop_flag.is_set():
            k = (who + n) % len(self.bodies)
            rid = "load-%d-%d" % (who, n)
            n += 1
            with self.lock:
                self.sent += 1
            outcome = None
            for attempt in range(30):
                try:
                    if conn is None:
                        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                    conn.request("POST", "/v1/systemone", body=self.bodies[k], headers=auth_json({"X-Request-Id": rid}))
                    r = conn.getresponse()
                    body = r.read()
                    status, hdr = r.status, {a.lower(): b for a, b in r.getheaders()}
                    if hdr.get("connection", "").lower() == "close":
                        conn.close()
                        conn = None
                except (OSError, http.client.HTTPException) as e:
                    outcome = "transport error %r" % e
                    if conn:
                        conn.close()
                    conn = None
                    break
                if status == 503:
                    with self.lock:
                        self.retries_503 += 1
                    try:
                        wait = min(float(hdr.get("retry-after", "1")), 1.0)
                    except ValueError:
                        wait = 1.0
                    time.sleep(wait)
                    continue
                if status != 200:
                    outcome = "status %d: %r" % (status, body[:200])
                elif body != self.expected[k]:
                    outcome = "200 with other bytes: %r" % body[:200]
                elif hdr.get("x-request-id") != rid:
                    outcome = "X-Request-Id %r, sent %r" % (hdr.get("x-request-id"), rid)
                else:
                    outcome = "ok"
                break
            with self.lock:
                if outcome == "ok":
                    self.ok += 1
                    self.done_at.append(time.time())
                else:
                    self.lost.append((rid, outcome or "still 503 after 30 tries"))
        if conn:
            conn.close()


def posts_200(server):
    return len(re.findall(r'"POST /v1/systemone" 200', server.read_log()))


def main():
    clef, fixtures, source = arg("--clef"), arg("--fixtures"), arg("--source")
    if not clef or not fixtures or not source:
        sys.exit("usage: test_nginx.py --clef BINARY --fixtures DIR --source DIR")
    binary = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
    if not binary:
        skip("nginx is not installed (apt-get install nginx; scripts/deps.sh --test)")
    port_a, port_b, port_lb = free_port(), free_port(), free_port()
    while len({port_a, port_b, port_lb}) < 3:
        port_b, port_lb = free_port(), free_port()
    a = b = lb = load = None
    try:
        a = Server(clef, fixtures, REPLICA_ARGS + ["--port", str(port_a)], env=A_ENV)
        b = Server(clef, fixtures, REPLICA_ARGS + ["--port", str(port_b)], env=B_ENV)
        lb = Nginx(binary, source, port_lb, (port_a, port_b))
        bodies = [json.dumps(r).encode() for r in REQUESTS]
        expected = []
        for body in bodies:
            st, _, ans = b.request("POST", "/v1/systemone", body, auth_json())
            if st != 200:
                fail("direct decision on B: %d %r" % (st, ans[:200]))
            st, _, ans_a = a.request("POST", "/v1/systemone", body, auth_json())
            if st != 200 or ans_a != ans:
                fail("A and B answer differently: %r / %r" % (ans_a[:200], ans[:200]))
            expected.append(ans)

        # The config's plain behaviour through nginx.
        st, _, body = call(port_lb, "GET", "/healthz")
        if st != 200 or body != b'{"status":"ok"}':
            fail("GET /healthz through nginx: %d %r" % (st, body))
        st, h, body = call(port_lb, "POST", "/v1/systemone", bodies[0], {"Content-Type": "application/json"})
        if st != 401 or "missing or invalid API key" not in json.loads(body)["error"]["message"]:
            fail("a decision without the key through nginx: %d %r (want clef's 401)" % (st, body[:200]))
        st, h, body = call(port_lb, "POST", "/v1/systemone", bodies[0], auth_json({"X-Request-Id": "trace-7"}))
        if st != 200 or body != expected[0] or h.get("x-request-id") != "trace-7":
            fail("a decision through nginx: %d %r %s" % (st, body[:200], h))
        st, h, body = call(port_lb, "POST", "/v1/systemone", bodies[0], auth_json({"X-Typesafe-Request-Id": "sdk-9"}))
        if st != 200 or h.get("x-typesafe-request-id") != "sdk-9" or h.get("x-request-id") != "sdk-9":
            fail("x-typesafe-request-id through nginx: %d %s" % (st, h))
        st, h, body = call(port_lb, "POST", "/v1/systemone", bodies[0], auth_json())
        if st != 200 or not re.fullmatch(r"[0-9a-f]{32}", h.get("x-request-id", "")):
            fail("a request without an id should get nginx's $request_id: %d %s" % (st, h))
        s = socket.create_connection(("127.0.0.1", port_lb), timeout=10)
        s.sendall(b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 40000000\r\nConnection: close\r\n\r\n")
        raw = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            raw += chunk
        s.close()
        head, _, body = raw.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 413") or json.loads(body)["error"]["type"] != "payload_too_large":
            fail("a 40 MB body through nginx: %r" % raw[:400])

        # Load while A is stopped and restarted.
        served_b_before = posts_200(b)
        load = Load(port_lb, bodies, expected)
        t_load = time.time()
        load.start()
        time.sleep(2.0)
        direct = {}

        def direct_call():
            try:
                direct["r"] = a.request("POST", "/v1/systemone", bodies[1], auth_json())
            except OSError as e:
                direct["r"] = (0, {}, repr(e).encode())

        dt = threading.Thread(target=direct_call)
        dt.start()
        time.sleep(0.05)
        t_term = time.time()
        a.proc.send_signal(signal.SIGTERM)
        try:
            rc = a.proc.wait(DRAIN_S + 5)
        except subprocess.TimeoutExpired:
            fail("A did not exit within %d s of SIGTERM" % (DRAIN_S + 5))
        t_exit = time.time()
        dt.join(30)
        log_a = a.read_log()
        if rc != 0:
            fail("A exited %s after SIGTERM:\n%s" % (rc, log_a[-2000:]))
        if t_exit - t_term > DRAIN_S:
            fail("A took %.2f s to stop, more than --drain-timeout-s %d" % (t_exit - t_term, DRAIN_S))
        st, _, body = direct["r"]
        if st != 200 or body != expected[1]:
            fail("the decision sent to A just before SIGTERM: %d %r" % (st, body[:200]))
        drained = len(re.findall(r'"POST /v1/systemone" 200', log_a[log_a.index("SIGTERM received"):]))
        time.sleep(1.5)  # B alone
        ok_before_restart = load.ok
        t_restart = time.time()
        os.unlink(a.log.name)  # the stopped A's (its text is in log_a)
        a = Server(clef, fixtures, REPLICA_ARGS + ["--port", str(port_a)], env=A_RESTART_ENV)
        t_ready = time.time()
        deadline = time.time() + 30
        while posts_200(a) < 5 and time.time() < deadline:
            time.sleep(0.1)
        served_a_after = posts_200(a)
        t_back = time.time()
        time.sleep(0.5)
        load.stop()
        t_load = time.time() - t_load
        if any(t.is_alive() for t in load.threads):
            fail("a load client is still waiting after 120 s")
        served_b = posts_200(b) - served_b_before
        access = Nginx.read(lb.access_log)
        lines = [ln for ln in access.splitlines() if '"POST /v1/systemone' in ln and "load-" in ln]
        # $upstream_status of a retried request: "503, 200" (a replica's 503), "502, 200" (refused)
        retried = [re.search(r"upstream_status=(.*?) upstream_time", ln).group(1) for ln in lines]
        retried = [u for u in retried if "," in u]
        retried_503 = sum(1 for u in retried if "503" in u)
        nginx_retries = len(retried)
        stopping_503 = log_a[log_a.index("SIGTERM received"):].count('"POST /v1/systemone" 503')
        loading_503 = a.read_log().count('"POST /v1/systemone" 503')
        down_s = t_ready - t_term
        print("load through nginx: %d requests sent, %d answered 200 with the expected bytes, %d client retries "
              "on 503, %d retried by nginx on the other replica (%d after a 503: A answered %d 503 "
              "\"shutting down\" while draining and %d 503 \"loading\" after its restart), lost %d; "
              "A stopped %.2f s after SIGTERM (%d decisions answered during its drain), restarted %.2f s "
              "later, ready %.2f s after SIGTERM (down %.2f s); B answered %d, the restarted A %d (its 5th "
              "%.2f s after it was ready); the load ran %.1f s" %
              (load.sent, load.ok, load.retries_503, nginx_retries, retried_503, stopping_503, loading_503,
               len(load.lost), t_exit - t_term, drained, t_restart - t_exit, down_s, down_s, served_b,
               served_a_after, t_back - t_ready, t_load))
        if load.lost:
            fail("%d requests lost, e.g. %s" % (len(load.lost), load.lost[:5]))
        if load.ok != load.sent:
            fail("sent %d, ok %d" % (load.sent, load.ok))
        if served_a_after < 5:
            fail("the restarted A answered %d requests through nginx in 30 s (passive health check "
                 "never let it back)" % served_a_after)
        during = [t for t in load.done_at if t_term < t < t_ready]
        if not during:
            fail("no request was answered while A was down: the load did not run through the stop")
        if loading_503 == 0 or retried_503 == 0:
            fail("no 503 from the loading A was retried by nginx: the test did not reach the http_503 path")
        if ok_before_restart == 0 or load.ok < 20:
            fail("too little load to tell anything: %d ok" % load.ok)

        # Neither replica: nginx's own 502 becomes clef's 503 with Retry-After.
        for srv in (a, b):
            if srv.stop() != 0:
                fail("a replica exited non-zero at the end")
        a = b = None
        st, h, body = call(port_lb, "POST", "/v1/systemone", bodies[0], auth_json({"X-Request-Id": "none-up"}))
        if st != 503 or h.get("retry-after") != "1" or h.get("x-request-id") != "none-up" or \
                json.loads(body) != {"error": {"message": "no clef replica is available; retry later",
                                               "type": "overloaded", "param": None}}:
            fail("no replica up: %d %s %r" % (st, h, body[:300]))
        print("ok")
    finally:
        if load:
            load.stop_flag.set()
        for srv in (a, b):
            if srv:
                srv.stop()
        if lb:
            lb.stop()


if __name__ == "__main__":
    main()
