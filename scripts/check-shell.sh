#!/usr/bin/env bash
# Lints with shellcheck every shell script of the project (tracked *.sh files and the CI jobs in
# .ci/), with the project's .shellcheckrc. Exits non-zero on any finding.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v shellcheck >/dev/null || {
  echo "check-shell: shellcheck is not installed (Debian package shellcheck)" >&2
  exit 1
}
mapfile -t files < <(git ls-files '*.sh' '.ci/*' | grep -v '^\.ci/.*\.md$')
shellcheck -x "${files[@]}"
echo "check-shell: ${#files[@]} scripts, no finding"
