#!/usr/bin/env bash
# HERE: everything the H200 staging calls carry, from a fresh clone, in one command.
#
#   bash scripts/gpu/prepare.sh        # then the calls of scripts/gpu/README.md, call 1 first
#
# Steps, each skipped when its output is already there and intact (FORCE=1 redoes them all):
#   1. the vLLM tree, ../shared/gpu/make_carry.sh -> $DEP/site.tar.zst, $CARRY/site.sha256, bin/
#   2. the ROS kit, make_ros_kit.sh                -> $CARRY/kit/ros312.tar.zst (+ .sha256)
#   3. the calls, pack_calls.sh                   -> $CARRY/call1..N, .gpucarry/ = call 1,
#      each call's size checked against 64 MiB with the working tree and a margin
# One pair of folders for all three (the scripts' own defaults differ: make_carry.sh is shared
# with other projects and writes under $TMPDIR unless told).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
CARRY=${CARRY:-/work/gpu-carry}
DEP=${DEP:-/work/gpu-dep}
SHARED_GPU=${SHARED_GPU:-$ROOT/../shared/gpu}
FORCE=${FORCE:-0}
log() { echo "prepare: $*" >&2; }

intact() {  # intact DIR HASHFILE: the hash file is there and the file it names in DIR matches
  [ -f "$2" ] && (cd "$1" 2>/dev/null && sha256sum -c --quiet "$2" >/dev/null 2>&1)
}

if [ "$FORCE" = 1 ] || ! [ -x "$CARRY/bin/zstd" ] || ! intact "$DEP" "$CARRY/site.sha256"; then
  [ -f "$SHARED_GPU/make_carry.sh" ] || { log "missing $SHARED_GPU/make_carry.sh"; exit 1; }
  log "1/3 vLLM tree -> $DEP/site.tar.zst (about 2 min idle, 30 min on a loaded machine)"
  DEST="$CARRY" WORK="$DEP" bash "$SHARED_GPU/make_carry.sh"
else
  log "1/3 vLLM tree: $DEP/site.tar.zst matches $CARRY/site.sha256, kept"
fi

if [ "$FORCE" = 1 ] || ! intact "$CARRY/kit" "$CARRY/kit/ros312.sha256"; then
  log "2/3 ROS kit -> $CARRY/kit (about 9 min on a loaded 2-core machine)"
  KIT_DIR="$CARRY/kit" bash "$ROOT/scripts/gpu/make_ros_kit.sh"
else
  log "2/3 ROS kit: $CARRY/kit/ros312.tar.zst matches its hash, kept"
fi

log "3/3 calls (re-measures the working tree: run again right before call 1 if it changed)"
CARRY="$CARRY" SITE_ZST="$DEP/site.tar.zst" bash "$ROOT/scripts/gpu/pack_calls.sh"
