#!/usr/bin/env bash
# Run the test suite in the distro's environment (after scripts/setup.sh):
#   scripts/run_tests.sh [kilted|jazzy] [pytest args...]
# Writes a JUnit report to build/<distro>/junit.xml; "no tests collected" counts as failure.
set -uo pipefail
DISTRO="${1:-kilted}"; shift || true
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck disable=SC1090
. "$ROOT/env-$DISTRO.sh"
cd "$ROOT"
mkdir -p "build/$DISTRO"
python -m pytest -p no:cacheprovider --timeout=600 --junitxml="build/$DISTRO/junit.xml" "$@"
rc=$?
# pytest exits 5 when it collected nothing: a suite that ran nothing has not passed.
[ "$rc" -eq 5 ] && { echo "run_tests: no tests were collected" >&2; exit 1; }
exit "$rc"
