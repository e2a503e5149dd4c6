#!/usr/bin/env python3
"""Generate N varied SystemOne requests (one JSON object per line) for parity
and batch-invariance runs: support-ticket-like states of 3..30 words: the CPU f32 reference of the `small` preset must stay affordable (~30k tokens),
1 question (30%: 2) of choice (2..5 options), score (2..6 levels) or noul.

usage: gen_requests.py N SEED > requests.jsonl
Deterministic for a given (N, SEED); standard library only.
"""
import json
import random
import sys

WORDS = ("the order payment server error customer checkout login invoice refund is not working since today "
         "please help account page timeout shipping delayed package missing charged twice card declined app crashes "
         "on startup password reset email never arrived subscription cancel upgrade plan pricing question api rate "
         "limit exceeded dashboard slow export csv broken mobile android iphone update region outage database "
         "latency spike urgent asap angry disappointed thanks great").split()
TEAMS = {"billing": "Payments, invoices, refunds", "technical": "Bugs, outages, errors",
         "account": "Logins, passwords, profiles", "sales": "Plans, pricing, upgrades",
         "shipping": "Deliveries and packages", "legal": "Contracts and privacy", "abuse": "Spam and fraud",
         "other": "Anything else"}
LEVELS = ["Can wait", "This week", "Today", "Within hours", "Immediately", "Low", "Medium", "High", "Critical",
          "Blocker", "Catastrophic"]


def state(rng):
    n = rng.randint(3, 30)
    words = [rng.choice(WORDS) for _ in range(n)]
    if rng.random() < 0.3:
        words.insert(rng.randrange(len(words)), "order #%d" % rng.randint(1000, 99999))
    return " ".join(words).capitalize() + "."


def question(rng, kind):
    if kind == "choice":
        keys = rng.sample(sorted(TEAMS), rng.randint(2, 5))
        q = {"type": "choice", "criteria": {k: TEAMS[k] for k in keys}}
        if rng.random() < 0.8:
            q["instructions"] = rng.choice(["Which team should handle the message?", "Route this ticket.",
                                            "Pick the department."])
        return q
    if kind == "score":
        n = rng.randint(2, 6)
        return {"type": "score", "instructions": "How urgent is it?", "criteria": LEVELS[:n]}
    return {"type": "noul", "instructions": rng.choice(["Is a service down?", "Is the customer angry?",
                                                         "Does this mention money?", "Is it spam?"])}


def request(rng):
    qs = {}
    for i in range(1 if rng.random() < 0.7 else 2):
        qs["q%d_%s" % (i, rng.choice(["a", "b", "c"]))] = question(rng, rng.choice(["choice", "score", "noul"]))
    return {"model": "clef-omni", "state": state(rng), "questions": qs}


def main():
    n, seed = int(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(seed)
    for i in range(n):
        print(json.dumps({"name": "gen_%04d" % i, "request": request(rng)}))


if __name__ == "__main__":
    main()
