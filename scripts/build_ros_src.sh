#!/usr/bin/env bash
# Builds the upstream ROS 2 packages that have no PyPI wheels -- launch, launch_ros, ros2cli
# (`ros2 launch/lifecycle/param/...`), tf2/tf2_ros and vision_msgs -- from the snapshots in
# ../shared/ros-src into build/<distro>/ros-src/install, on top of the distro's venv, so that
# the real test tier starts the node the way users do and uses the real optional parts.
#   scripts/build_ros_src.sh <distro> [set...]   sets: cli tf2 vision (default: $ROS_SRC_SETS,
#                                                else all three)
# Called by scripts/setup.sh; env-<distro>.sh sources the install when it exists. Each set is
# built once per hash of (its archive, this script, the venv's lock stamp): a re-run costs
# seconds. Where the folder does not exist (a fresh user machine) it says so and does nothing:
# the tests that need these parts skip, each with its reason. Robots have all of them from apt.
set -euo pipefail

DISTRO="${1:?usage: build_ros_src.sh <distro> [cli] [tf2] [vision]}"
shift
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SRC="${COSMOS_REASON_ROS_SRC:-$ROOT/../shared/ros-src}"
VENV="$ROOT/.venv-$DISTRO"
WS="$ROOT/build/$DISTRO/ros-src"
log() { echo "setup[$DISTRO]: ros-src: $*"; }

if [ ! -d "$SRC" ]; then
  log "no $SRC here: ros2 launch/lifecycle, tf2 and vision_msgs tests will skip"
  exit 0
fi
case "$DISTRO" in
  kilted) branch=rolling ;;  # the upstream mirrors have no kilted branch; rolling builds on Kilted
  jazzy) branch=jazzy ;;
  jazzy-py310)
    # That leg proves this package's code on Humble's Python; on a robot these tools come from
    # apt. Building them there costs CPU that the three CI legs share, and the snapshots were
    # never checked on Python 3.10.
    log "not built for the Python 3.10 leg (its launch/tf2 tests skip): the tools come from apt"
    exit 0 ;;
  *) echo "build_ros_src: unknown distro '$DISTRO'" >&2; exit 2 ;;
esac
# shellcheck disable=SC2206
SETS=(${*:-${ROS_SRC_SETS:-cli tf2 vision}})

archive_of() {
  case "$1" in
    cli) echo "$SRC/ros2cli-launch-$branch.tar.gz" ;;
    tf2) if [ "$branch" = rolling ]; then echo "$SRC/geometry2-rolling-0.39.1-tf2.tar.gz"
         else echo "$SRC/geometry2-jazzy-tf2.tar.gz"; fi ;;
    vision) echo "$SRC/vision_msgs-4.1.1.tar.gz" ;;
    *) echo "build_ros_src: unknown set '$1' (cli, tf2, vision)" >&2; return 2 ;;
  esac
}

# Wheels the sets need that the lock files leave out (pinned here: only these builds use them).
# launch imports osrf_pycommon; tf2's CMake finds ament_cmake_gmock through ament_cmake_ros
# even with BUILD_TESTING=OFF, so its CMake wheels go to a prefix of their own.
extra_wheels() {
  case "$1:$DISTRO" in
    cli:*) echo "osrf-pycommon==2.0.2" ;;
    tf2:kilted) echo "ros-ament-cmake-gmock==2.7.3 ros-ament-cmake-gtest==2.7.3" \
                     "ros-ament-cmake-pytest==2.7.3 ros-gmock-vendor==1.15.1" \
                     "ros-gtest-vendor==1.15.1" ;;
    tf2:jazzy) echo "ros-jazzy-ament-cmake-gmock==2.5.4 ros-jazzy-ament-cmake-gtest==2.5.4" \
                    "ros-jazzy-ament-cmake-pytest==2.5.4 ros-jazzy-gmock-vendor==1.14.9000" \
                    "ros-jazzy-gtest-vendor==1.14.9000" ;;
  esac
}

uv_install() {  # uv_install [uv pip install args...]
  local find_links="${PIP_FIND_LINKS:-$("$VENV/bin/pip" config get global.find-links 2>/dev/null \
    || true)}"
  env -u LD_LIBRARY_PATH -u _ROS_WHEELS_BOOTSTRAP_COMPLETE "$VENV/bin/uv" pip install -q \
    --python "$VENV/bin/python" ${find_links:+--find-links "$find_links"} "$@"
}

mkdir -p "$WS/src"
for set in "${SETS[@]}"; do
  archive=$(archive_of "$set")
  [ -f "$archive" ] || { log "$set: no $(basename "$archive"): skipped"; continue; }
  hash=$( { sha256sum "$archive" "$ROOT/scripts/build_ros_src.sh"; cat "$VENV/.deps-stamp"; } \
    | sha256sum | cut -c1-16)
  stamp="$WS/.stamp-$set"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$hash" ]; then
    log "$set up to date"
    continue
  fi
  t0=$(date +%s)
  log "$set: colcon build of $(basename "$archive")"
  rm -rf "${WS:?}/src/$set"
  mkdir -p "$WS/src/$set"
  tar xzf "$archive" -C "$WS/src/$set"
  prefix_path="$VENV"
  wheels=$(extra_wheels "$set")
  if [ "$set" = tf2 ]; then
    rm -rf "$WS/cmake-deps"
    uv_install --no-deps --prefix "$WS/cmake-deps" $wheels
    prefix_path="$WS/cmake-deps:$prefix_path"
  elif [ -n "$wheels" ]; then
    uv_install $wheels
  fi
  (
    # shellcheck disable=SC1091
    . "$VENV/bin/activate"
    export AMENT_PREFIX_PATH="$prefix_path" CMAKE_PREFIX_PATH="$prefix_path"
    # Upstream setup.py files warn a page each (deprecated options): stderr goes to the log.
    env -u LD_LIBRARY_PATH colcon --log-base "$WS/log" build --merge-install \
      --base-paths "$WS/src/$set" --build-base "$WS/build" --install-base "$WS/install" \
      --event-handlers console_direct- console_stderr- summary+ \
      --cmake-args -DBUILD_TESTING=OFF -DPython3_EXECUTABLE="$VIRTUAL_ENV/bin/python"
  ) || { log "$set: build failed (logs: $WS/log/latest_build)"; exit 1; }
  echo "$hash" > "$stamp"
  log "$set built in $(( $(date +%s) - t0 ))s"
done
