#!/usr/bin/env bash
# One-command setup on a machine with no ROS installed (Debian/Ubuntu x86_64, Python 3.11):
#   scripts/setup.sh [kilted|jazzy|jazzy-py310]      (default: $ROS_DISTRO_TARGET, else kilted)
# jazzy-py310 is Jazzy's wheels on Python 3.10 (Humble's Python) without vLLM (scripts/distro.sh).
# Creates .venv-<distro> with the pinned ROS 2 wheels, vLLM (CPU build) and the tools, repairs
# what those wheels get wrong on a CPU-only machine, builds both packages with colcon into
# build/<distro>/, builds the upstream launch/ros2cli/tf2/vision_msgs sources where
# ../shared/ros-src exists (scripts/build_ros_src.sh), writes env-<distro>.sh to source, and
# builds the tiny test models.
# Idempotent: each step is skipped when its inputs have not changed (a re-run takes seconds).
set -euo pipefail

DISTRO="${1:-${ROS_DISTRO_TARGET:-kilted}}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# ROS_BASE (the ROS distro) and PYTHON (the venv's Python) for this target.
# shellcheck source=distro.sh
. "$ROOT/scripts/distro.sh"
VENV="$ROOT/.venv-$DISTRO"
BUILD="$ROOT/build/$DISTRO"
LOCK="$ROOT/requirements/lock-$DISTRO.txt"
ENVFILE="$ROOT/env-$DISTRO.sh"
t0=$(date +%s)
log() { echo "setup[$DISTRO]: $*"; }

# A stamp holds the hash of a step's inputs; the step runs only when the hash changes.
inputs_hash() { cat "$@" | sha256sum | cut -c1-16; }
stamp_ok() { [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]; }

# 1. Python environment with every pinned wheel.
deps_hash=$(inputs_hash "$LOCK" "$ROOT/scripts/setup.sh")
if ! stamp_ok "$VENV/.deps-stamp" "$deps_hash"; then
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  log "installing pinned wheels from $(basename "$LOCK") (first time: ~1 min, ~4 GB; 0.7 GB without vLLM)"
  # The ROS wheels' bootstrapper re-executes Python to set LD_LIBRARY_PATH; a parent venv's
  # settings must not leak into this one.
  # (The grep hides pip's notes about this machine's empty extra index folders.)
  pip_quiet() { env -u LD_LIBRARY_PATH -u _ROS_WHEELS_BOOTSTRAP_COMPLETE "$VENV/bin/pip" "$@" \
    --disable-pip-version-check 2>&1 | { grep -v "^WARNING: Location" || true; }; }
  # uv (from PyPI) installs the closure in parallel and links files from its cache, so the
  # second distro's venv costs seconds; pip took ~3 min per venv. pip is the fallback. No
  # bytecode is compiled here: compiling all 23 600 files took 70 s of CPU per venv, and a run
  # imports ~a fifth of them; the Makefile lets Python write each one's cache at first import
  # (it unexports PYTHONDONTWRITEBYTECODE, without which every process compiled vLLM and
  # torch again: 14 s instead of 5 s to import them).
  find_links="${PIP_FIND_LINKS:-$("$VENV/bin/pip" config get global.find-links 2>/dev/null || true)}"
  pip_quiet install -q uv
  if ! env -u LD_LIBRARY_PATH -u _ROS_WHEELS_BOOTSTRAP_COMPLETE "$VENV/bin/uv" pip install -q \
      --python "$VENV/bin/python" ${find_links:+--find-links "$find_links"} \
      -r "$LOCK"; then
    log "uv could not install the lock file; installing with pip (~3 min)"
    pip_quiet install -q -r "$LOCK"
  fi
  # torchaudio/torchcodec from PyPI are CUDA builds that cannot load next to CPU torch
  # (transformers would import them and crash); image/video VLMs do not need them.
  pip_quiet uninstall -q -y torchaudio torchcodec >/dev/null || true
  # torchvision 0.28.0 is a CUDA build whose C ops do not load; vLLM's Qwen-VL code only needs
  # its transforms, so guard the two fake-kernel registrations that crash on import.
  env -u LD_LIBRARY_PATH "$VENV/bin/python" "$ROOT/scripts/patch_torchvision.py"
  # The ROS wheels' exported CMake files name the wheel build machine's Python and numpy
  # include directories; point them at this venv so rosidl can configure.
  bash "$ROOT/scripts/fix_ros_wheel_cmake.sh" "$VENV"
  echo "$deps_hash" > "$VENV/.deps-stamp"
  rm -f "$BUILD/.build-stamp"
else
  log "python environment up to date"
fi

# 2. colcon build of both packages (the interface package is nested: name it explicitly).
build_inputs=$(cd "$ROOT" && find cosmos_reason_interfaces package.xml setup.py setup.cfg resource \
  launch config -type f 2>/dev/null | LC_ALL=C sort)
build_hash=$( (cd "$ROOT" && echo "$build_inputs" && cat $build_inputs; cat "$VENV/.deps-stamp") \
  | sha256sum | cut -c1-16)
if ! stamp_ok "$BUILD/.build-stamp" "$build_hash"; then
  log "colcon build (both packages)"
  mkdir -p "$BUILD"
  (
    cd "$ROOT"
    # shellcheck disable=SC1091
    . "$VENV/bin/activate"
    export AMENT_PREFIX_PATH="$VIRTUAL_ENV" CMAKE_PREFIX_PATH="$VIRTUAL_ENV"
    env -u LD_LIBRARY_PATH colcon --log-base "$BUILD/log" build \
      --base-paths . cosmos_reason_interfaces \
      --build-base "$BUILD/build" --install-base "$BUILD/install" --symlink-install \
      --event-handlers console_direct- summary+ \
      --cmake-args -DBUILD_TESTING=OFF -DPython3_EXECUTABLE="$VIRTUAL_ENV/bin/python"
  )
  echo "$build_hash" > "$BUILD/.build-stamp"
else
  log "colcon build up to date"
fi

# 2b. Upstream ROS 2 parts with no PyPI wheels (ros2 launch/lifecycle/param, tf2, vision_msgs)
#     from ../shared/ros-src when that folder exists; otherwise the tests needing them skip.
bash "$ROOT/scripts/build_ros_src.sh" "$DISTRO"

# 3. The env file: activate the venv, overlay the built packages, put the console scripts on
#    PATH, isolate DDS to this host.
cat > "$ENVFILE" <<EOF
# Generated by scripts/setup.sh: source it to use cosmos_reason_ros ($DISTRO) from this checkout.
# Over another distro's setup its libraries would mix with this one's (a "symbol lookup error"
# at the first rclpy import): refuse, naming both.
if [ -n "\${COSMOS_REASON_SETUP:-}" ] && [ "\$COSMOS_REASON_SETUP" != "$DISTRO" ]; then
  echo "env-$DISTRO.sh: this shell has env-\$COSMOS_REASON_SETUP.sh sourced already (one distro per shell): open a new shell, then source env-$DISTRO.sh" >&2
  return 1 2>/dev/null || exit 1
fi
# colcon's setup scripts read unset variables: relax 'set -u' while sourcing them.
case \$- in *u*) _cr_nounset=1; set +u;; *) _cr_nounset=;; esac
. "$VENV/bin/activate"
export AMENT_PREFIX_PATH="\$VIRTUAL_ENV\${AMENT_PREFIX_PATH:+:\$AMENT_PREFIX_PATH}"
# Upstream parts built from ../shared/ros-src (scripts/build_ros_src.sh), when there are any.
if [ -f "$BUILD/ros-src/install/local_setup.sh" ]; then . "$BUILD/ros-src/install/local_setup.sh"; fi
. "$BUILD/install/local_setup.sh"
[ -n "\$_cr_nounset" ] && set -u
unset _cr_nounset
export PYTHONPATH="$ROOT\${PYTHONPATH:+:\$PYTHONPATH}"
# The console scripts (query, replay, bench, soak, demo_recording, tiny_model, ...): ament_python
# installs them to lib/<package>/ for 'ros2 run', which is not on PATH by itself.
export PATH="$BUILD/install/cosmos_reason_ros/lib/cosmos_reason_ros:\$PATH"
export COSMOS_REASON_ROS_DISTRO="$ROS_BASE" COSMOS_REASON_SETUP="$DISTRO"
export ROS_AUTOMATIC_DISCOVERY_RANGE="\${ROS_AUTOMATIC_DISCOVERY_RANGE:-LOCALHOST}"
export HF_HUB_OFFLINE="\${HF_HUB_OFFLINE:-1}" VLLM_NO_USAGE_STATS=1
export VLLM_CPU_KVCACHE_SPACE="\${VLLM_CPU_KVCACHE_SPACE:-1}"
EOF

# 4. Tiny random-weight models for tests and the CPU demo (cached per builder version). Building
#    them needs torch; a venv without it (jazzy-py310) uses what another target's setup cached.
(
  # shellcheck disable=SC1090
  . "$ENVFILE"
  if ! python -c "import importlib.util as u; assert u.find_spec('torch')" 2>/dev/null; then
    log "no torch in this venv: tiny models not built here (the engine tests need a 3.11 target)"
    exit 0
  fi
  for arch in qwen3_vl qwen2_5_vl; do
    python -m cosmos_reason_ros.eval.tiny_model --arch "$arch" --cache >/dev/null 2>&1 \
      || { echo "setup: building the tiny $arch model failed" >&2; \
           python -m cosmos_reason_ros.eval.tiny_model --arch "$arch" --cache; exit 1; }
  done
)
log "ready in $(( $(date +%s) - t0 ))s: source $(basename "$ENVFILE")"
