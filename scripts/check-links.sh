#!/usr/bin/env bash
# Fails when a relative link or an anchor in the repository's Markdown files does not resolve:
# a file or directory that is not there, or a `#fragment` that names no heading of its target
# (headings turned into anchors as GitHub does). Links with a scheme (https:, mailto:) are not
# checked: CI has no network, and their targets are not ours to keep.
set -euo pipefail
cd "$(dirname "$0")/.."
git ls-files -z '*.md' | python3 -c '
import os, re, sys

def slug(heading):
    text = heading.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")

def anchors(path, cache={}):
    if path not in cache:
        found, seen, fence = set(), {}, False
        for line in open(path, encoding="utf-8"):
            if line.lstrip().startswith("```"):
                fence = not fence
                continue
            m = None if fence else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m:
                s = slug(m.group(1))
                n = seen.get(s, 0)
                seen[s] = n + 1
                found.add(s if n == 0 else f"{s}-{n}")
        cache[path] = found
    return cache[path]

link = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")
bad = 0
files = [f for f in sys.stdin.read().split("\0") if f]
for md in files:
    fence = False
    for number, line in enumerate(open(md, encoding="utf-8"), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if fence:
            continue
        line = re.sub(r"`[^`]*`", "", line)
        for m in link.finditer(line):
            target = m.group(1) or m.group(2)
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
                continue
            path, _, fragment = target.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(md), path)) if path else md
            if not os.path.exists(resolved):
                print(f"{md}:{number}: {target}: no such file {resolved}")
                bad += 1
                continue
            if fragment and resolved.endswith(".md") and fragment not in anchors(resolved):
                print(f"{md}:{number}: {target}: no heading makes the anchor #{fragment} in {resolved}")
                bad += 1
print(f"check-links: {len(files)} Markdown files, {bad} broken links")
sys.exit(1 if bad else 0)
'

# The paths the code's comments name (`egress/src/host_watch.rs`, `docs/networking.md`): each
# under one of this repository's top-level directories must exist, relative to the repository,
# the commenting file's directory or its crate (a file that was moved or split leaves a stale
# pointer otherwise). Paths of other projects' trees (`cli/...`) are not ours to check.
git ls-files -z '*.rs' '*.sh' '*.py' '.ci/*' | python3 -c '
import os, re, sys
tops = {entry for entry in os.listdir(".") if os.path.isdir(entry) and not entry.startswith(".")}
tops.discard("target")
ref = re.compile(r"(?<![\w$/.{-])((?:[A-Za-z0-9_.-]+/)+[A-Za-z0-9_-]+\.(?:rs|md|sh|py))\b")
bad, checked = 0, 0
files = [f for f in sys.stdin.read().split("\0") if f]
for f in files:
    crate = f.split("/")[0]
    crate = crate if os.path.exists(os.path.join(crate, "Cargo.toml")) else ""
    for number, line in enumerate(open(f, encoding="utf-8", errors="replace"), 1):
        text = line.strip()
        if not text.startswith("//" if f.endswith(".rs") else "#"):
            continue
        for m in ref.finditer(text):
            path = m.group(1)
            first = path.split("/")[0]
            if first == "..":
                continue  # relative to where it is used (a hook in .git/hooks), not here
            candidates = [path, os.path.join(os.path.dirname(f), path)]
            if crate:
                candidates.append(os.path.join(crate, path))
            ours = first in tops or (crate and os.path.isdir(os.path.join(crate, first))) \
                or os.path.isdir(os.path.join(os.path.dirname(f), first))
            if not ours:
                continue
            checked += 1
            if not any(os.path.exists(c) for c in candidates):
                print(f"{f}:{number}: {path}: no such file")
                bad += 1
print(f"check-links: {checked} paths named in comments, {bad} missing")
sys.exit(1 if bad else 0)
'
