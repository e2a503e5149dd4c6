#!/usr/bin/env python3
"""Connection-level probes of a running `clef serve` (the figures of docs/RELIABILITY.md).

  conn_probe.py idle PORT PID N [--trickle S] [--hold S]
      open N connections from 127.0.0.1 that send "G" and then one more header byte every S
      seconds (default: never); after 3 s print the server's VmRSS and thread count (from
      /proc/PID/status), then the status and time of GET /healthz and of one POST /v1/systemone
      from 127.0.0.2 (its socket bound there before connect); keep the connections --hold seconds
      (default 0) and print how many the server closed and when.
  conn_probe.py burst PORT N
      N connections from 127.0.0.1 connect at once and each writes one whole POST /v1/systemone
      (the README's triage request) without waiting, then read: print how many got each status,
      how many were reset or closed without a status, and the slowest answer.

Raises its own open-file limit to the hard limit.  Standard library only; every wait is bounded.
"""
import json
import resource
import select
import socket
import sys
import time

TRIAGE = json.dumps({
    "model": "clef-omni",
    "state": "Our checkout started returning errors and orders are blocked.",
    "questions": {
        "department": {"type": "choice", "instructions": "Which team should handle the message?",
                       "criteria": {"billing": "Payments or invoices", "technical": "Bugs or outages"}},
        "urgency": {"type": "score", "criteria": ["Can wait", "This week", "Today"]},
        "outage": {"type": "noul", "instructions": "Is a service down?"}}}).encode()


def post(extra=b""):
    return (b"POST /v1/systemone HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + extra +
            b"Content-Length: %d\r\n\r\n" % len(TRIAGE) + TRIAGE)


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def status_of(pid):
    out = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "Threads", "VmHWM"):
                out[k] = int(v.split()[0])
    return out


def connect(port, src="127.0.0.1", timeout=5.0):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((src, 0))
    s.settimeout(timeout)
    s.connect(("127.0.0.1", port))
    return s


def roundtrip(port, src, req, timeout=10.0):
    """(status or None, seconds, first line or error)."""
    t0 = time.monotonic()
    try:
        s = connect(port, src, timeout)
        s.sendall(req)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        s.close()
    except OSError as e:
        return None, time.monotonic() - t0, repr(e)
    line = data.split(b"\r\n", 1)[0].decode(errors="replace")
    parts = line.split()
    st = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
    return st, time.monotonic() - t0, line


def idle(port, pid, n, trickle=None, hold=0.0):
    raise_nofile()
    before = status_of(pid)
    socks, t0 = [], time.monotonic()
    for _ in range(n):
        try:
            s = connect(port)
            s.send(b"G")
            socks.append(s)
        except OSError as e:
            print("connect %d failed: %r" % (len(socks), e))
            break
    print("opened %d connections in %.2f s" % (len(socks), time.monotonic() - t0))
    time.sleep(3)
    after = status_of(pid)
    print("server before: RSS %d KiB, %d threads; with %d slow connections: RSS %d KiB (+%.1f MiB), %d threads" %
          (before["VmRSS"], before["Threads"], len(socks), after["VmRSS"],
           (after["VmRSS"] - before["VmRSS"]) / 1024.0, after["Threads"]))
    st, t, line = roundtrip(port, "127.0.0.2", b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    print("GET /healthz from 127.0.0.2: %s in %.3f s (%s)" % (st, t, line))
    st, t, line = roundtrip(port, "127.0.0.2", post(b"Connection: close\r\n"))
    print("POST /v1/systemone from 127.0.0.2: %s in %.3f s (%s)" % (st, t, line))
    end, closed, first_close = time.monotonic() + hold, set(), None
    pattern = b"ET / HTTP/1.1\r\nX-a: b\r\n"
    sent = 1
    next_byte = time.monotonic() + (trickle or 1e9)
    while time.monotonic() < end and len(closed) < len(socks):
        now = time.monotonic()
        if trickle and now >= next_byte:
            for i, s in enumerate(socks):
                if i in closed:
                    continue
                try:
                    s.send(pattern[(sent - 1) % len(pattern):][:1])
                except OSError:
                    closed.add(i)
            sent += 1
            next_byte = now + trickle
        p = select.poll()
        for i, s in enumerate(socks):
            if i not in closed:
                p.register(s, select.POLLIN)
        index = {s.fileno(): i for i, s in enumerate(socks)}
        for fd, _ in p.poll(100):
            try:
                if socks[index[fd]].recv(1, socket.MSG_PEEK) == b"":
                    raise OSError("eof")
            except OSError:
                closed.add(index[fd])
                if first_close is None:
                    first_close = time.monotonic() - t0
    if hold:
        print("after %.1f s: %d of %d closed by the server (first at %s s)" %
              (hold, len(closed), len(socks), "%.1f" % first_close if first_close else "-"))
    for s in socks:
        s.close()


def burst(port, n):
    raise_nofile()
    req = post(b"Connection: close\r\n")
    socks, t0 = [], time.monotonic()
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        socks.append(s)
    pending = {s: b"" for s in socks}
    out = {s: req for s in socks}
    result, slowest = {}, 0.0
    deadline = t0 + 120
    while pending and time.monotonic() < deadline:
        p = select.poll()
        byfd = {}
        for s in pending:
            p.register(s, select.POLLIN | (select.POLLOUT if out[s] else 0))
            byfd[s.fileno()] = s
        ev = p.poll(200)
        rr = [byfd[fd] for fd, e in ev if e & (select.POLLIN | select.POLLHUP | select.POLLERR)]
        ww = [byfd[fd] for fd, e in ev if e & select.POLLOUT]
        for s in ww:
            try:
                k = s.send(out[s])
                out[s] = out[s][k:]
            except BlockingIOError:
                pass
            except OSError as e:
                out[s] = b""
        for s in rr:
            try:
                chunk = s.recv(65536)
            except BlockingIOError:
                continue
            except OSError as e:
                result[s] = "reset"
                del pending[s]
                continue
            if chunk:
                pending[s] += chunk
                if b"\r\n\r\n" not in pending[s]:
                    continue
            line = pending[s].split(b"\r\n", 1)[0].split()
            result[s] = line[1].decode() if len(line) > 1 else "closed without a status"
            slowest = max(slowest, time.monotonic() - t0)
            del pending[s]
    for s in pending:
        result[s] = "no answer in 120 s"
    counts = {}
    for v in result.values():
        counts[v] = counts.get(v, 0) + 1
    print("%d concurrent POSTs: %s; slowest answer %.2f s" %
          (n, ", ".join("%s: %d" % (k, v) for k, v in sorted(counts.items())), slowest))
    for s in socks:
        s.close()


def main(argv):
    if len(argv) >= 4 and argv[1] == "idle":
        trickle = float(argv[argv.index("--trickle") + 1]) if "--trickle" in argv else None
        hold = float(argv[argv.index("--hold") + 1]) if "--hold" in argv else 0.0
        idle(int(argv[2]), int(argv[3]), int(argv[4]), trickle, hold)
    elif len(argv) >= 4 and argv[1] == "burst":
        burst(int(argv[2]), int(argv[3]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
