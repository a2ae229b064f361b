#!/usr/bin/env bash
# Build cosmos_reason_interfaces (ament_cmake + rosidl) with plain CMake against the ROS kit
# prefix, for the Python that runs it (cp312 on the device). No colcon needed.
#
#   PY=python3 ROS_PREFIX=/tmp/ros312 WS=/tmp/ros_ws bash scripts/gpu/build_interfaces.sh [SRC]
#
# Result: $WS/install (lib/, share/, lib/python3.12/site-packages/cosmos_reason_interfaces).
# Also rewrites the wheel build machine's paths (/opt/python/cp312-cp312/...) in the kit's
# CMake files to this Python's include dir and numpy's (idempotent).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
SRC=${1:-$HERE/../../cosmos_reason_interfaces}
SRC="$(cd "$SRC" && pwd)"
PY=${PY:-python3}
PY=$(command -v "$PY")
ROS_PREFIX=${ROS_PREFIX:-/tmp/ros312}
WS=${WS:-/tmp/ros_ws}
SITE="$ROS_PREFIX/lib/python3.12/site-packages"
t0=$(date +%s.%N)
fail() { echo "build_interfaces: $*" >&2; exit 1; }
[ -d "$SITE/rosidl_generator_py" ] || fail "no ROS kit at $ROS_PREFIX (missing $SITE/rosidl_generator_py)"

PYINC=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
NPINC=$("$PY" -c 'import numpy; print(numpy.get_include())') \
  || fail "numpy is not importable by $PY (rosidl_generator_py needs its headers)"
[ -f "$PYINC/Python.h" ] || fail "no Python.h in $PYINC (Python headers of $PY are missing)"
[ -f "$NPINC/numpy/arrayobject.h" ] || fail "no numpy headers in $NPINC"

# 1. repair the kit's exported CMake targets (they name the wheel build machine's paths)
{ grep -rlZ '/opt/python/cp3' "$ROS_PREFIX/share" --include='*.cmake' || true; } | xargs -0 -r sed -i \
  -e "s#/opt/python/cp3[0-9]*-cp3[0-9]*/lib/python3\.[0-9]*/site-packages/numpy/_core/include#${NPINC}#g" \
  -e "s#/opt/python/cp3[0-9]*-cp3[0-9]*/include/python3\.[0-9]*#${PYINC}#g"
left=$( { grep -rl '/opt/python' "$ROS_PREFIX/share" --include='*.cmake' || true; } | wc -l)
[ "$left" = 0 ] || fail "$left CMake files still name /opt/python after the rewrite"

# 2. tools: cmake and ninja from PATH, else from the Python packages of the same name
CMAKE=$(command -v cmake || "$PY" -c 'import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, "cmake"))' 2>/dev/null) \
  || fail "cmake not found (neither on PATH nor as the Python package)"
NINJA=$(command -v ninja || "$PY" -c 'import ninja, os; print(os.path.join(ninja.BIN_DIR, "ninja"))' 2>/dev/null || true)
if [ -n "$NINJA" ] && [ -x "$NINJA" ]; then GEN=(-G Ninja -DCMAKE_MAKE_PROGRAM="$NINJA"); else GEN=(-G "Unix Makefiles"); fi

# 3. configure + build + install (the generators run with the kit's Python packages)
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
export AMENT_PREFIX_PATH="$ROS_PREFIX" CMAKE_PREFIX_PATH="$ROS_PREFIX"
export LD_LIBRARY_PATH="$ROS_PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
rm -rf "$WS/build" "$WS/install"
mkdir -p "$WS"
"$CMAKE" -S "$SRC" -B "$WS/build" "${GEN[@]}" -Wno-dev \
  -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF \
  -DCMAKE_INSTALL_PREFIX="$WS/install" \
  -DPython3_EXECUTABLE="$PY" -DPython3_FIND_STRATEGY=LOCATION \
  > "$WS/configure.log" 2>&1 || { tail -40 "$WS/configure.log" >&2; fail "cmake configure failed (log: $WS/configure.log)"; }
"$CMAKE" --build "$WS/build" --target install -j "$(nproc)" > "$WS/build.log" 2>&1 \
  || { grep -E -m20 'error|Error' "$WS/build.log" >&2; tail -20 "$WS/build.log" >&2; fail "build failed (log: $WS/build.log)"; }
PKG=$(find "$WS/install" -type d -name cosmos_reason_interfaces -path '*-packages/*' | head -1)
[ -n "$PKG" ] || fail "no Python package cosmos_reason_interfaces under $WS/install"
echo "$(dirname "$PKG")" > "$WS/install/pythonpath.txt"
printf 'build_interfaces: OK %s in %s s (python %s, numpy include %s)\n' "$WS/install" \
  "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')" "$("$PY" -c 'import platform; print(platform.python_version())')" "$NPINC"
