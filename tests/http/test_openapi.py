#!/usr/bin/env python3
"""test_openapi.py — the live server's answers against its own OpenAPI document.

Starts `clef serve` on the tiny fixture (with an API key, a pinned model name and a 1 MiB body
limit; a second one loading slowly with --no-ui), fetches GET /openapi.json, checks it is the
document in src/server/openapi.json and that every schema in it is valid JSON Schema 2020-12,
then provokes every status it can (200, 400 x2, 401, 404 x3, 405 x2, 413, 415, 422 x2, 501,
503 x2) on every route and checks each answer against the document: the status is declared for
that route and method (an unknown path: components.responses.NotFound; a method the path does
not list: components.responses.MethodNotAllowed), the Content-Type is one the response
declares, the body validates against its schema (python3-jsonschema), and every required
header (X-Request-Id, x-typesafe-request-id, Retry-After, WWW-Authenticate, Allow) is there and
valid.

usage: test_openapi.py --clef BINARY --fixtures DIR --source DIR   (exit 77 = skipped)
"""
import json
import os
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clefserve import Server, arg, skip  # noqa: E402

try:
    import jsonschema
except ImportError:
    skip("python3-jsonschema is not installed (apt-get install python3-jsonschema; scripts/deps.sh --test)")

KEY = "openapi-test-key"
failures = []
passed = 0


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


def resolve(doc, node):
    while isinstance(node, dict) and "$ref" in node:
        ref = node["$ref"]
        assert ref.startswith("#/"), ref
        node = doc
        for part in ref[2:].split("/"):
            node = node[part]
    return node


def validator(doc, schema):
    return jsonschema.Draft202012Validator(schema, resolver=jsonschema.RefResolver.from_schema(doc),
                                           format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


def check(doc, what, method, path, status, headers, body, want_status):
    """One answer against the document."""
    global passed
    label = "%s: %s %s -> %d" % (what, method, path, status)
    if status != want_status:
        return fail("%s, expected %d: %s" % (label, want_status, body[:300]))
    item = doc["paths"].get(path)
    op = None
    if item is not None:
        op = item.get(method.lower()) or (item.get("get") if method == "HEAD" else None)
    if item is None:
        spec, where = doc["components"]["responses"]["NotFound"], "components.responses.NotFound"
        if status != 404:
            return fail("%s: an undocumented path answered %d, not 404" % (label, status))
    elif op is None:
        spec, where = doc["components"]["responses"]["MethodNotAllowed"], "components.responses.MethodNotAllowed"
        if status != 405:
            return fail("%s: an undocumented method answered %d, not 405" % (label, status))
    else:
        spec, where = op["responses"].get(str(status)), "paths.%s.%s.responses.%d" % (path, method.lower(), status)
        if spec is None:
            return fail("%s: status %d is not declared for %s %s (declared: %s)"
                        % (label, status, method, path, ", ".join(sorted(op["responses"]))))
    spec = resolve(doc, spec)
    for name, h in spec.get("headers", {}).items():
        h = resolve(doc, h)
        v = headers.get(name.lower())
        if v is None:
            if h.get("required"):
                fail("%s: required header %s missing (%s)" % (label, name, where))
            continue
        errs = list(validator(doc, h.get("schema", {})).iter_errors(v))
        if errs:
            fail("%s: header %s: %s: %s" % (label, name, v, errs[0].message))
    ctype = headers.get("content-type")
    content = spec.get("content", {})
    if ctype not in content:
        return fail("%s: Content-Type %r is not one of %s (%s)" % (label, ctype, sorted(content), where))
    schema = content[ctype]["schema"]
    if method == "HEAD":
        value = None
    elif ctype.startswith("application/json"):
        try:
            value = json.loads(body)
        except ValueError as e:
            return fail("%s: body is not JSON: %s" % (label, e))
    else:
        value = body.decode("utf-8")
    if value is not None:
        errs = sorted(validator(doc, schema).iter_errors(value), key=lambda e: list(e.path))
        if errs:
            return fail("%s: body does not match %s: %s at %s" % (label, where, errs[0].message, list(errs[0].path)))
    passed += 1
    print("  ok %-28s %-5s %-15s %d %s" % (what, method, path, status, ctype))


def raw_request(port, data):
    """Send raw bytes, return (status, headers, body) of the answer."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    buf = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    s.close()
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, headers, body


def main():
    clef, fixtures, source = arg("--clef"), arg("--fixtures"), arg("--source")
    if not clef or not fixtures or not source:
        sys.exit("usage: test_openapi.py --clef BINARY --fixtures DIR --source DIR")
    auth = {"Authorization": "Bearer " + KEY}
    a = Server(clef, fixtures, ["--api-key", KEY, "--served-model-name", "clef-omni", "--max-body-mb", "1"])
    try:
        st, h, body = a.request("GET", "/openapi.json", headers=auth)
        assert st == 200, (st, body[:200])
        doc = json.loads(body)
        with open(os.path.join(source, "src/server/openapi.json"), "rb") as f:
            if json.loads(f.read()) != doc:
                fail("GET /openapi.json is not src/server/openapi.json (a stale build?)")
        if doc.get("openapi") != "3.1.0":
            fail("openapi is %r, not 3.1.0" % doc.get("openapi"))
        for name, schema in doc["components"]["schemas"].items():
            try:
                jsonschema.Draft202012Validator.check_schema(schema)
            except jsonschema.SchemaError as e:
                fail("components.schemas.%s is not valid JSON Schema: %s" % (name, e.message))
        routes = {"/v1/systemone", "/v1/models", "/healthz", "/metrics", "/", "/openapi.json"}
        if set(doc["paths"]) != routes:
            fail("paths %s, the server has %s" % (sorted(doc["paths"]), sorted(routes)))

        def c(what, method, path, want, body=None, headers=None):
            stt, hh, bb = a.request(method, path, body, headers)
            check(doc, what, method, path, stt, hh, bb, want)
            return stt, hh, bb

        good = {"model": "clef-omni", "state": "The checkout fails.",
                "questions": {"d": {"type": "choice", "criteria": {"billing": "Payments", "technical": "Bugs"}},
                              "u": {"type": "score", "criteria": ["low", "mid", "high"]},
                              "o": {"type": "noul", "instructions": "Is it down?"}}}
        js = dict(auth, **{"Content-Type": "application/json"})
        c("health", "GET", "/healthz", 200)
        c("health head", "HEAD", "/healthz", 200)
        c("models without key", "GET", "/v1/models", 401)
        c("models", "GET", "/v1/models", 200, headers=auth)
        c("models head", "HEAD", "/v1/models", 200, headers=auth)
        c("metrics", "GET", "/metrics", 200, headers=auth)
        c("metrics without key", "GET", "/metrics", 401)
        c("playground (no key needed)", "GET", "/", 200)
        c("openapi without key", "GET", "/openapi.json", 401)
        c("openapi", "GET", "/openapi.json", 200, headers=auth)
        st, hh, bb = c("decision", "POST", "/v1/systemone", 200, json.dumps(good).encode(),
                       dict(js, **{"X-Request-Id": "my-trace-1"}))
        if hh.get("x-request-id") != "my-trace-1" or hh.get("x-typesafe-request-id") != "my-trace-1":
            fail("the client's X-Request-Id was not echoed in both headers: %s" % hh)
        c("decision without key", "POST", "/v1/systemone", 401, json.dumps(good).encode(),
          {"Content-Type": "application/json"})
        c("invalid JSON", "POST", "/v1/systemone", 400, b'{"model": "clef-omni", "state": ', js)
        c("body not an object", "POST", "/v1/systemone", 400, b"[1, 2]", js)
        c("no questions", "POST", "/v1/systemone", 422, json.dumps(dict(good, questions={})).encode(), js)
        many = dict(good, questions={"q": {"type": "choice", "criteria": {"o%d" % i: "d" for i in range(256)}}})
        st, hh, bb = c("256 options", "POST", "/v1/systemone", 422, json.dumps(many).encode(), js)
        if json.loads(bb)["error"]["type"] != "capacity_exceeded":
            fail("256 options: not capacity_exceeded: %s" % bb)
        c("unpinned model", "POST", "/v1/systemone", 404, json.dumps(dict(good, model="other")).encode(), js)
        c("text/plain", "POST", "/v1/systemone", 415, json.dumps(good).encode(), dict(auth, **{"Content-Type": "text/plain"}))
        c("2 MiB body", "POST", "/v1/systemone", 413, b" " * (2 << 20), js)
        c("GET on a POST route", "GET", "/v1/systemone", 405, headers=auth)
        c("POST on a GET route", "POST", "/healthz", 405, b"{}", {"Content-Type": "application/json"})
        c("unknown path", "GET", "/v2/nowhere", 404, headers=auth)
        st, hh, bb = raw_request(a.port, b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
                                 + b"\r\nContent-Type: application/json\r\nTransfer-Encoding: gzip, chunked\r\n\r\n")
        check(doc, "Transfer-Encoding gzip", "POST", "/v1/systemone", st, hh, bb, 501)
    finally:
        rc = a.stop()
        if rc != 0:
            fail("clef serve exited %s after SIGTERM" % rc)

    b = Server(clef, fixtures, ["--no-ui"], env={"CLEF_SERVE_TEST_LOAD_DELAY_MS": "4000"}, wait_ready=False)
    try:
        def cb(what, method, path, want, body=None, headers=None):
            stt, hh, bb = b.request(method, path, body, headers)
            check(doc, what, method, path, stt, hh, bb, want)
            return bb

        cb("health while loading", "GET", "/healthz", 503)
        cb("decision while loading", "POST", "/v1/systemone", 503, json.dumps(good).encode(),
           {"Content-Type": "application/json"})
        body = cb("no playground (--no-ui)", "GET", "/", 404)
        if b"GET /openapi.json" not in body or b", GET /\"" in body:
            fail("--no-ui 404 should list the routes without GET /: %s" % body)
        b.wait_ready()
        cb("health when ready", "GET", "/healthz", 200)
        cb("no playground when ready", "GET", "/", 404)
    finally:
        rc = b.stop()
        if rc != 0:
            fail("clef serve (--no-ui) exited %s after SIGTERM" % rc)
    print("%d passed, %d failed" % (passed, len(failures)))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
