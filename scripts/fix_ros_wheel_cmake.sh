#!/usr/bin/env bash
# The ros-* wheels' exported CMake targets name the wheel build machine's include directories
# (/opt/python/cp3XX-cp3XX/...). Rewrite them to this venv's Python and numpy include
# directories so that rosidl_generate_interfaces configures. Idempotent.
#   scripts/fix_ros_wheel_cmake.sh VENV
set -eu  # no pipefail: grep finding nothing is the goal, not an error
PREFIX="${1:?usage: fix_ros_wheel_cmake.sh VENV}"
PY="$PREFIX/bin/python"
PYINC=$(env -u LD_LIBRARY_PATH "$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
NPINC=$(env -u LD_LIBRARY_PATH "$PY" -c 'import numpy; print(numpy.get_include())')
grep -rlZ '/opt/python/cp3' "$PREFIX/share" --include='*.cmake' 2>/dev/null | xargs -0 -r sed -i \
  -e "s#/opt/python/cp3[0-9]*-cp3[0-9]*/lib/python3\.[0-9]*/site-packages/numpy/_core/include#${NPINC}#g" \
  -e "s#/opt/python/cp3[0-9]*-cp3[0-9]*/include/python3\.[0-9]*#${PYINC}#g"
left=$(grep -rl '/opt/python' "$PREFIX/share" --include='*.cmake' 2>/dev/null | wc -l)
[ "$left" -eq 0 ] || { echo "fix_ros_wheel_cmake: $left CMake files still name /opt/python" >&2; exit 1; }
