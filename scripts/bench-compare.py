#!/usr/bin/env python3
"""One table of two runs of scripts/bench.sh: each row's median now and before, their ratio,
and each run's own figure against its baseline (measured in that run).

usage: bench-compare.py [--before-name NAME] BEFORE.json NOW.json

Rows are matched by their text; a row only one run has is listed with a dash for the other.
"""
import json
import sys


def load(path):
    with open(path) as f:
        value = json.load(f)
    rows = value["rows"] if isinstance(value, dict) else value
    return {row["what"]: row for row in rows}


def figure(row):
    if row is None or row.get("median") is None:
        return "-"
    return "%.2f %s" % (row["median"], row.get("unit", ""))


def versus(row):
    if row is None:
        return "-"
    return row.get("versus") or "-"


def ratio(now, before):
    try:
        a, b = now["median"], before["median"]
    except (TypeError, KeyError):
        return "-"
    if a is None or b is None or b == 0:
        return "-"
    return "%.2fx" % (a / b)


def main(argv):
    name = "before"
    if len(argv) >= 2 and argv[0] == "--before-name":
        name, argv = argv[1], argv[2:]
    if len(argv) != 2:
        sys.stderr.write(__doc__)
        return 2
    before, now = load(argv[0]), load(argv[1])
    order = list(now) + [what for what in before if what not in now]
    print("| measurement | now | %s | now / before | now vs its baseline | before vs its baseline | goal |" % name)
    print("|---|---:|---:|---:|---:|---:|---|")
    for what in order:
        a, b = now.get(what), before.get(what)
        goal = (a or b or {}).get("goal") or "-"
        print("| %s | %s | %s | %s | %s | %s | %s |" % (
            what, figure(a), figure(b), ratio(a, b), versus(a), versus(b), goal))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
