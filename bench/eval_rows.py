#!/usr/bin/env python3
"""Rows in the Decision Index kit's format for timing `clef eval` against `clef bench`.

usage: eval_rows.py N TOKENS [SEED] > rows.jsonl

Each row is `clef bench`'s request shape (a 2-option choice and a noul question) with a
state of TOKENS + 16 words (support-ticket words and pseudo-words of 1-3 syllables, as
bench's), so `clef eval --truncate-state --max-length TOKENS` makes every record exactly
TOKENS tokens, the records `clef bench --tokens TOKENS` times.  `_evaluation` holds a
run_id and the row's number.  Deterministic for (N, TOKENS, SEED); standard library only.
"""
import json
import random
import sys

COMMON = ("the order payment server error customer checkout login invoice refund is not working since today "
          "please help account page timeout").split()
CONS, VOW = "bcdfghjklmnprstvwz", "aeiou"


def word(rng):
    if rng.random() < 1 / 3:
        return rng.choice(COMMON)
    return "".join(rng.choice(CONS) + rng.choice(VOW) for _ in range(rng.randint(1, 3)))


def main():
    n, tokens = int(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
    for i in range(n):
        row = {"state": " ".join(word(rng) for _ in range(tokens + 16)),
               "questions": {"department": {"type": "choice", "instructions": "Which team?",
                                            "criteria": {"billing": "Payments", "technical": "Bugs"}},
                             "outage": {"type": "noul", "instructions": "Is a service down?"}},
               "_evaluation": {"run_id": "bench-%06d" % i, "row": i}}
        sys.stdout.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
