#!/usr/bin/env bash
# HERE: rehearse the device staging calls with a local Python 3.12 that stands in for the
# device's python3 (a venv holding only what the device image has that we rely on: numpy,
# pyyaml, pillow, opencv, setuptools, pyparsing, python-dateutil, requests ...), in a clean
# environment, with the same commands the README gives for the staging calls, from $CARRY/callN.
#
#   DEV_PY=/tmp/dev312/bin/python bash scripts/gpu/rehearse_local.sh
#
# Differences from the device, by necessity: no GPU and no torch/vLLM 0.24 here, so the last call
# only reassembles, verifies and unpacks the vLLM tree (no `import vllm`, no model build);
# a separate stage dir (/tmp/rehearse/stage) instead of /root/stage.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
CARRY=${CARRY:-/work/gpu-carry}
DEV_PY=${DEV_PY:-/tmp/dev312/bin/python}
R=/tmp/rehearse
"$DEV_PY" -c 'import sys, numpy; assert sys.version_info[:2] == (3, 12)' \
  || { echo "rehearse: DEV_PY=$DEV_PY must be a Python 3.12 with numpy" >&2; exit 2; }
rm -rf "$R" && mkdir -p "$R/stage"
rm -rf /tmp/ros312 /tmp/ros_ws_rehearse   # fresh: the kit must bring everything
# zstd is on PATH here but not there: a PATH of links to the tools the device has (not zstd),
# so the staged bin/zstd is what runs
mkdir -p "$R/bin"
for t in tar sha256sum awk cat cp du df ls sed grep cut tr head tail date nproc find xargs rm \
    mkdir touch dirname cmake ninja make gcc g++ cc c++ ld as strip timeout env bash sh readlink \
    basename uname stat wc sort cmp mv ln printf id; do
  p=$(command -v "$t" || true); [ -n "$p" ] && ln -sf "$p" "$R/bin/$t"
done
clean_env=(env -i HOME="$HOME" PATH="$(dirname "$DEV_PY"):$R/bin" LANG=C.UTF-8
           GPU_STAGE="$R/stage" GPU_ROS_WS=/tmp/ros_ws_rehearse GPU_VLLM_SITE="$R/site")
swap() { rm -rf "$ROOT/.gpucarry" && cp -al "$CARRY/call$1" "$ROOT/.gpucarry"; }
t0=$(date +%s)
echo "=== call 1: stage partaa + ROS kit, install ROS, build interfaces, smoke"
swap 1
(cd "$ROOT" && "${clean_env[@]}" bash -c 'bash scripts/gpu/stage.sh && bash scripts/gpu/install.sh ros') 2>&1 | tee "$R/call1.log"
calls=$(find "$CARRY" -maxdepth 1 -name 'call[0-9]*' | wc -l)   # pack_calls.sh counts them
for n in $(seq 2 $((calls - 1))); do
  echo "=== call $n: stage $(ls "$CARRY/call$n")"
  swap "$n"
  (cd "$ROOT" && "${clean_env[@]}" bash -c 'bash scripts/gpu/stage.sh') 2>&1 | tee "$R/call$n.log"
done
echo "=== call $calls: stage the last part, install vLLM tree (no import here: no CUDA torch), smoke ros pkg"
swap "$calls"
(cd "$ROOT" && "${clean_env[@]}" SMOKE_GROUPS="ros pkg" bash -c 'bash scripts/gpu/stage.sh && bash scripts/gpu/install.sh vllm') 2>&1 | tee "$R/call$calls.log"
swap 1
echo "=== rehearsal done in $(( $(date +%s) - t0 )) s; .gpucarry/ holds call 1 again; logs in $R"
