#!/usr/bin/env python3
"""test_playground.py — the playground page (GET / of `clef serve`) in a real browser.

Starts `clef serve --api-key K` on the tiny fixture and Debian's chromium through chromedriver
(headless), and talks the W3C WebDriver protocol to it over HTTP (standard library only).  In
the page: sending without the key shows the server's 401; then the key is typed, the example
questions are cleared, a noul, a choice (3 options, one added with "+ option") and a score
question (3 levels) are written, an image is attached from a file, and the request is sent.
Checks: the request the page shows as a curl command is exactly (keys in order) the request
built here; every rendered probability equals the API's answer to that same request, sent here
directly; so do the token count; the latency is shown.

usage: test_playground.py --clef BINARY --fixtures DIR [--screenshot PNG]   (exit 77 = skipped:
no chromium / chromedriver; install them with scripts/deps.sh --test)
"""
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clefserve import Server, arg, skip  # noqa: E402

KEY = "playground-test-key"
ELEMENT = "element-6066-11e4-a52e-4f735466cecf"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Browser:
    """A WebDriver session on chromedriver (W3C protocol, JSON over HTTP)."""

    def __init__(self, driver, chromium):
        self.port = free_port()
        self.profile = tempfile.mkdtemp(prefix="clef-chromium-")
        self.log = tempfile.NamedTemporaryFile(prefix="chromedriver-", suffix=".log", delete=False)
        self.proc = subprocess.Popen([driver, "--port=%d" % self.port], stdout=self.log, stderr=self.log)
        self.url = "http://127.0.0.1:%d" % self.port
        deadline = time.time() + 30
        while True:
            try:
                if self.call("GET", "/status")["value"].get("ready"):
                    break
            except (OSError, ValueError):
                pass
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError("chromedriver did not start")
            time.sleep(0.1)
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1360,1100", "--user-data-dir=" + self.profile, "--no-first-run"]}}}}
        self.session = self.call("POST", "/session", caps)["value"]["sessionId"]

    def call(self, method, path, body=None, timeout=60):
        data = json.dumps(body).encode() if body is not None else (b"{}" if method == "POST" else None)
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise RuntimeError("WebDriver %s %s: %s" % (method, path, e.read()[:500]))

    def s(self, method, path, body=None):
        return self.call(method, "/session/%s%s" % (self.session, path), body)["value"]

    def go(self, url):
        self.s("POST", "/url", {"url": url})

    def find_all(self, css, root=None):
        where = "/element/%s/elements" % root if root else "/elements"
        return [e[ELEMENT] for e in self.s("POST", where, {"using": "css selector", "value": css})]

    def find(self, css, root=None):
        found = self.find_all(css, root)
        if not found:
            raise AssertionError("no element %s" % css)
        return found[-1]  # the last one: the question or option just added

    def click(self, el):
        self.s("POST", "/element/%s/click" % el)

    def type(self, el, text, clear=True):
        if clear:
            self.s("POST", "/element/%s/clear" % el)
        self.s("POST", "/element/%s/value" % el, {"text": text})

    def text(self, el):
        return self.s("GET", "/element/%s/text" % el)

    def attr(self, el, name):
        return self.s("GET", "/element/%s/attribute/%s" % (el, name))

    def wait(self, css, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            found = self.find_all(css)
            if found:
                return found[-1]
            time.sleep(0.1)
        raise AssertionError("timed out waiting for %s" % css)

    def screenshot(self, path):
        with open(path, "wb") as f:
            f.write(base64.b64decode(self.s("GET", "/screenshot")))

    def close(self):
        try:
            self.call("DELETE", "/session/%s" % self.session)
        except Exception:
            pass
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)
        os.unlink(self.log.name)


def pairs(text):
    """A JSON text with every object as a list of (key, value) pairs: compares key order too."""
    return json.loads(text, object_pairs_hook=lambda p: [list(x) for x in p])


def main():
    clef, fixtures, shot = arg("--clef"), arg("--fixtures"), arg("--screenshot")
    if not clef or not fixtures:
        sys.exit("usage: test_playground.py --clef BINARY --fixtures DIR [--screenshot PNG]")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver") or (os.path.exists("/usr/bin/chromedriver") and "/usr/bin/chromedriver")
    if not chromium or not driver:
        skip("no chromium / chromedriver on PATH (Debian: apt-get install chromium chromium-driver, or "
             "scripts/deps.sh --test)")
    image = os.path.join(os.path.abspath(fixtures), "media", "red_circle.png")
    srv = Server(clef, fixtures, ["--api-key", KEY])
    b = None
    failures = []
    try:
        b = Browser(driver, chromium)
        b.go(srv.base + "/")
        health = b.wait("#health.ok")
        print("  page loaded; health: %s" % b.text(health))

        # 1. without the key: the server's 401 is shown
        b.click(b.find("#send"))
        b.wait("#result[data-state=error]")
        status, error = b.text(b.find("#status")), b.text(b.find("#error"))
        print("  without a key: HTTP %s, %s" % (status, error.splitlines()[0]))
        if status != "401" or "missing or invalid API key" not in error:
            failures.append("without a key: HTTP %s, %r" % (status, error))

        # 2. the key, a state, three questions of each type, an image
        b.type(b.find("#api-key"), KEY)
        state = "The card was charged twice and the app shows a blank page."
        b.type(b.find("#state"), state)
        b.click(b.find("#clear-questions"))
        if b.find_all(".question"):
            failures.append("clear left questions")
        b.click(b.find("#add-noul"))
        q = b.find(".question[data-type=noul]")
        b.type(b.find(".qid", q), "outage")
        b.type(b.find(".instructions", q), "Is a service down?")
        b.click(b.find("#add-choice"))
        q = b.find(".question[data-type=choice]")
        b.type(b.find(".qid", q), "team")
        b.type(b.find(".instructions", q), "Which team should answer?")
        b.click(b.find(".add-option", q))
        options = [("billing", "Payments, refunds"), ("technical", "Bugs, outages"), ("2", "Anything else")]
        for row, (k, d) in zip(b.find_all(".option", q), options):
            b.type(b.find(".okey", row), k)
            b.type(b.find(".odesc", row), d)
        b.click(b.find("#add-score"))
        q = b.find(".question[data-type=score]")
        b.type(b.find(".qid", q), "urgency")
        levels = ["Can wait", "This week", "Today"]
        for row, d in zip(b.find_all(".option", q), levels):
            b.type(b.find(".odesc", row), d)
        b.type(b.find("#files"), image, clear=False)
        b.wait("#attachments li[data-field=images]")
        b.click(b.find("#send"))
        b.wait("#result[data-state=done]")

        # 3. the request the page sent, as its curl command shows it
        with open(image, "rb") as f:
            url = "data:image/png;base64," + base64.b64encode(f.read()).decode()
        request = {"model": "clef-omni", "state": state, "questions": {
            "outage": {"type": "noul", "instructions": "Is a service down?"},
            "team": {"type": "choice", "instructions": "Which team should answer?", "criteria": dict(options)},
            "urgency": {"type": "score", "criteria": levels}}, "images": [url]}
        curl = b.s("POST", "/execute/sync", {"script": "return lastCurl;", "args": []})
        shown = b.text(b.find("#curl"))
        body = curl.split("<<'JSON'\n", 1)[1].rsplit("\nJSON", 1)[0]
        if "Authorization: Bearer $CLEF_API_KEY" not in curl or KEY in shown:
            failures.append("the curl command should name $CLEF_API_KEY, not the key: %s" % shown[:300])
        if pairs(body) != pairs(json.dumps(request)):
            failures.append("the page sent %s, expected %s" % (body[:400], json.dumps(request)[:400]))

        # 4. the API's answer to the same request, and what the page drew
        st, _, raw = srv.post_json(request, key=KEY)
        if st != 200:
            raise AssertionError("the API answered %d: %s" % (st, raw[:300]))
        api = json.loads(raw)
        drawn = {}
        for ans in b.find_all(".answer"):
            qid = b.attr(ans, "data-question")
            drawn[qid] = {b.attr(o, "data-option"): b.text(b.find(".prob", o)) for o in b.find_all(".opt", ans)}
        want = {
            "outage": {"true": api["answers"]["outage"]["noul"], "false": None},
            "team": dict(api["answers"]["team"]["probabilities"]),
            "urgency": dict(api["answers"]["urgency"]["probabilities"]),
        }
        for qid, opts in want.items():
            if set(drawn.get(qid, {})) != set(opts):
                failures.append("%s: drawn options %s, the API has %s" % (qid, sorted(drawn.get(qid, {})), sorted(opts)))
                continue
            for opt, p in opts.items():
                got = drawn[qid][opt]
                if p is None:  # noul's "no" bar: 1 - noul, shown to 4 decimals
                    p = round(1 - api["answers"]["outage"]["noul"], 4)
                if float(got) != p:
                    failures.append("%s.%s: drawn %s, the API says %r" % (qid, opt, got, p))
                print("  %-8s %-10s drawn %-7s API %r" % (qid, opt, got, p))
        tokens = b.text(b.find("#tokens"))
        if int(tokens) != api["usage"]["input_tokens"]:
            failures.append("tokens: drawn %s, the API says %d" % (tokens, api["usage"]["input_tokens"]))
        latency = b.text(b.find("#latency"))
        print("  tokens %s (API %d), latency %s, request id %s" % (tokens, api["usage"]["input_tokens"], latency,
                                                                  b.text(b.find("#request-id"))))
        if not latency.endswith(" ms") or float(latency[:-3]) <= 0:
            failures.append("latency shown as %r" % latency)
        if shot:  # the whole page, from the top
            b.s("POST", "/window/rect", {"width": 1360, "height": 1560})
            b.s("POST", "/execute/sync", {"script": "window.scrollTo(0, 0);", "args": []})
            b.screenshot(shot)
            print("  screenshot: %s" % shot)
    finally:
        if b:
            b.close()
        rc = srv.stop()
        if rc != 0:
            failures.append("clef serve exited %s after SIGTERM" % rc)
    for f in failures:
        print("FAIL: " + f)
    print("%d passed, %d failed" % (0 if failures else 1, len(failures)))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
