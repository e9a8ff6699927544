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
