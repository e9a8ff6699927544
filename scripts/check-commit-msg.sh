#!/usr/bin/env bash
# Checks commit messages: a subject line of at most 72 characters, then a blank line (or none).
#
#   scripts/check-commit-msg.sh MSG_FILE       as a git commit-msg hook; install it with
#                                               ln -s ../../scripts/check-commit-msg.sh .git/hooks/commit-msg
#   scripts/check-commit-msg.sh --range A..B   every commit in the range (for CI)
#
# In a hook, the lines git strips (comments, and everything under the scissors line of
# `commit -v`) are not counted. Exits 1 naming each rule a message breaks, 2 on a usage error.
set -euo pipefail

MAX=72

# Reads a message on stdin; prints one line per broken rule, prefixed by $1. With $2 = strip,
# drops the lines git would strip from an edited message first.
problems() {
    python3 -c '
import sys
label, strip, limit = sys.argv[1], sys.argv[2] == "strip", int(sys.argv[3])
lines = []
for line in sys.stdin.read().splitlines():
    if strip and line.startswith("# ------------------------ >8 ------------------------"):
        break
    if not (strip and line.startswith("#")):
        lines.append(line.rstrip())
while lines and not lines[0].strip():
    lines.pop(0)
if not lines:
    print(f"{label}: the message is empty")
    sys.exit()
subject = lines[0]
if len(subject) > limit:
    print(f"{label}: the subject line is {len(subject)} characters, over {limit}: {subject}")
if len(lines) > 1 and lines[1].strip():
    print(f"{label}: the second line is not blank (a blank line separates the subject from the body)")
' "$1" "${2:-keep}" "$MAX"
}

if [ "${1:-}" = "--range" ]; then
    [ $# -eq 2 ] || { echo "usage: $0 --range A..B" >&2; exit 2; }
    commits=$(git rev-list --reverse "$2") || { echo "$0: not a range: $2" >&2; exit 2; }
    bad=0
    count=0
    for commit in $commits; do
        count=$((count + 1))
        found=$(git log -1 --format=%B "$commit" | problems "$(git log -1 --format='%h' "$commit")")
        if [ -n "$found" ]; then
            echo "$found"
            bad=$((bad + 1))
        fi
    done
    echo "check-commit-msg: $count commits in $2, $bad with a bad message"
    [ "$bad" -eq 0 ] || exit 1
    exit 0
fi

if [ $# -ne 1 ] || [ ! -f "$1" ]; then
    echo "usage: $0 MSG_FILE | --range A..B" >&2
    exit 2
fi
found=$(problems "commit message" strip < "$1")
if [ -n "$found" ]; then
    echo "$found" >&2
    echo "(the message is kept in $1)" >&2
    exit 1
fi
