#!/usr/bin/env bash
# On the GPU machine (offline, Python 3.12, torch, no ROS, no vLLM), from what stage.sh put in
# /root/stage:
#   bash scripts/gpu/install.sh ros    # ROS kit -> /tmp/ros312, build cosmos_reason_interfaces
#                                      # for this Python -> /tmp/ros_ws/install, smoke: ros pkg
#   bash scripts/gpu/install.sh vllm   # the parts site.parts names -> verify -> /tmp/site, smoke: vllm (+ ros pkg)
#   bash scripts/gpu/install.sh all    # both
# Then: source scripts/gpu/env.sh. Each step is skipped when already done on this machine
# (FORCE=1 redoes it). Exit status non-zero when a step or a smoke check fails.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
S=${GPU_STAGE:-/root/stage}
PY=${PY:-python3}
ROS_PREFIX=/tmp/ros312
ROS_WS=${GPU_ROS_WS:-/tmp/ros_ws}
VLLM_SITE=${GPU_VLLM_SITE:-/tmp/site}
WHAT=${1:-}
case "$WHAT" in ros|vllm|all) ;; *) echo "usage: install.sh ros|vllm|all" >&2; exit 2;; esac
log() { echo "install[$WHAT]: $*"; }
fail() { echo "install[$WHAT]: ERROR: $*" >&2; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}'; }
if command -v zstd >/dev/null; then Z=(zstd); elif [ -x "$S/bin/zstd" ]; then
  Z=(env LD_LIBRARY_PATH="$S/bin" "$S/bin/zstd"); else Z=(); fi
need_zstd() { [ ${#Z[@]} -gt 0 ] || fail "no zstd here and none staged ($S/bin/zstd comes with call 1)"; }

install_ros() {
  local t0; t0=$(now)
  if [ -z "${FORCE:-}" ] && [ -f "$ROS_PREFIX/.installed" ]; then
    log "ROS kit already unpacked at $ROS_PREFIX"
  else
    [ -f "$S/ros312.tar.zst" ] || fail "$S/ros312.tar.zst missing: carry it (call 1) and run stage.sh"
    need_zstd
    (cd "$S" && sha256sum -c --quiet ros312.sha256) || fail "ros312.tar.zst hash mismatch"
    rm -rf "$ROS_PREFIX"
    "${Z[@]}" -d -q --long=27 -c "$S/ros312.tar.zst" | tar xf - -C "$(dirname "$ROS_PREFIX")"
    # console scripts name the kit builder's Python: point them at this one
    for f in "$ROS_PREFIX"/bin/*; do
      [ -f "$f" ] && head -c 64 "$f" | head -1 | grep -q '^#!.*python' \
        && sed -i "1s|.*|#!$(command -v "$PY")|" "$f"
    done
    touch "$ROS_PREFIX/.installed"
    log "ROS kit unpacked to $ROS_PREFIX ($(du -sh "$ROS_PREFIX" | cut -f1)) in $(since "$t0") s"
  fi
  t0=$(now)
  if PY="$PY" ROS_PREFIX="$ROS_PREFIX" WS="$ROS_WS" bash "$HERE/build_interfaces.sh" "$REPO/cosmos_reason_interfaces"; then
    log "cosmos_reason_interfaces built for $("$PY" -c 'import platform; print(platform.python_version())') in $(since "$t0") s"
  else
    rm -rf "$ROS_WS/install"   # env.sh then falls back to $ROS_PREFIX/prebuilt
    log "WARNING: the build failed (see above); using the copy prebuilt for cp312 in the kit ($ROS_PREFIX/prebuilt)"
  fi
}

install_vllm() {
  local t0; t0=$(now)
  if [ -z "${FORCE:-}" ] && [ -f "$VLLM_SITE/.installed" ]; then
    log "vLLM site tree already at $VLLM_SITE"
    return
  fi
  local missing="" parts
  [ -f "$S/site.parts" ] || missing=" site.parts (call 1)"
  parts=$(cat "$S/site.parts" 2>/dev/null || true)
  for p in $parts; do [ -f "$S/$p" ] || missing="$missing $p"; done
  [ -f "$S/site.sha256" ] || missing="$missing site.sha256"
  [ -z "$missing" ] || fail "missing in $S:$missing (each staging call must run while the machine is still warm; a fresh machine needs every staging call again, from call 1)"
  need_zstd
  (cd "$S" && cat $parts > site.tar.zst \
     && sha256sum -c --quiet site.sha256) || fail "vLLM carry hash mismatch (a part is damaged or from another build)"
  rm -rf "$VLLM_SITE" && mkdir -p "$VLLM_SITE"
  "${Z[@]}" -d -q --long=30 -c "$S/site.tar.zst" | tar xf - -C "$VLLM_SITE"
  rm -f "$S/site.tar.zst"
  touch "$VLLM_SITE/.installed"
  log "vLLM site tree unpacked to $VLLM_SITE ($(du -sh "$VLLM_SITE" | cut -f1)) in $(since "$t0") s"
}

T0=$(now)
log "python $("$PY" -c 'import sys; print(sys.version.split()[0], sys.executable)'); stage $S"
case "$WHAT" in
  ros) install_ros ;;
  vllm) install_vllm ;;
  all) install_ros; install_vllm ;;
esac
# shellcheck disable=SC1091
source "$HERE/env.sh"
groups=(pkg)
[ -f "$ROS_PREFIX/.installed" ] && groups+=(ros node)
[ -f "$VLLM_SITE/.installed" ] && groups+=(vllm)
[ -n "${SMOKE_GROUPS:-}" ] && read -r -a groups <<< "$SMOKE_GROUPS"   # e.g. "ros pkg" without a GPU
log "smoke: ${groups[*]}"
rc=0
timeout -s KILL 300 "$PY" "$HERE/smoke.py" "${groups[@]}" || rc=$?
log "done in $(since "$T0") s (smoke exit $rc)"
exit $rc
