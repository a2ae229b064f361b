#!/usr/bin/env bash
# Run the test suite in the distro's environment (after scripts/setup.sh):
#   scripts/run_tests.sh [kilted|jazzy] [pytest args...]
# Leaves the drills out (make drills runs them). Writes a JUnit report to
# build/<distro>/junit.xml; "no tests collected" counts as failure.
set -uo pipefail
DISTRO="${1:-kilted}"; shift || true
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck disable=SC1090
. "$ROOT/env-$DISTRO.sh"
cd "$ROOT"
mkdir -p "build/$DISTRO"
# The drills (test/drills/) measure timings and run alone (make drills), never in a loaded
# suite: whatever marker expression the caller passes (.ci/run's legs pass their own), it is
# narrowed to leave them out.
marks="not drill"
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    -m) marks="($2) and not drill"; shift 2 ;;
    -m?*) marks="(${1#-m}) and not drill"; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
python -m pytest -p no:cacheprovider --timeout=600 --junitxml="build/$DISTRO/junit.xml" \
  -m "$marks" "${args[@]}"
rc=$?
# pytest exits 5 when it collected nothing: a suite that ran nothing has not passed.
[ "$rc" -eq 5 ] && { echo "run_tests: no tests were collected" >&2; exit 1; }
exit "$rc"
