#!/usr/bin/env bash
# HERE: lay out what each staging call carries, sized so that every call (working tree +
# .gpucarry/) stays under the 64 MiB a device call may carry, and fill .gpucarry/ for call 1.
#
#   bash scripts/gpu/pack_calls.sh
#     in:  $SITE_ZST (make_carry.sh's site.tar.zst), $CARRY/site.sha256 and $CARRY/bin/ (zstd for the
#          device), $CARRY/kit/ros312.tar.zst + ros312.sha256 (make_ros_kit.sh)
#     out: $CARRY/call1/ = site.tar.zst.partaa + site.sha256 + ros312.tar.zst + ros312.sha256 + bin/
#          $CARRY/call2/ = site.tar.zst.partab
#          $CARRY/call3/ = site.tar.zst.partac
#          .gpucarry/  = hard links to call1/ (switch with: rm -rf .gpucarry && cp -al $CARRY/callN .gpucarry)
# partaa is the smallest part, since call 1 also carries the ROS kit; partab and partac take
# what is left (each <= PART_MAX, default 60 MiB). The sha256 is of the whole site.tar.zst, so
# the shared device_install.sh logic (cat part* | sha256sum -c) still holds.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
CARRY=${CARRY:-/work/gpu-carry}
SITE_ZST=${SITE_ZST:-/work/gpu-dep/site.tar.zst}
MiB=1048576
LIMIT=$((64 * MiB))
PART_MAX=${PART_MAX:-$((60 * MiB))}
MARGIN=${MARGIN:-$((MiB + MiB / 2))}   # room for the working tree to grow before the calls
fail() { echo "pack_calls: $*" >&2; exit 1; }
for f in "$SITE_ZST" "$CARRY/site.sha256" "$CARRY/bin/zstd" "$CARRY/kit/ros312.tar.zst" "$CARRY/kit/ros312.sha256"; do
  [ -e "$f" ] || fail "missing $f (run make_carry.sh and make_ros_kit.sh first)"
done
(cd "$(dirname "$SITE_ZST")" && sed "s#  site.tar.zst#  $(basename "$SITE_ZST")#" "$CARRY/site.sha256" | sha256sum -c --quiet) \
  || fail "$SITE_ZST does not match $CARRY/site.sha256"

tree_bytes() {  # what a device call sends besides carry: tracked + untracked-not-ignored files
  (cd "$ROOT" && { git ls-files -z; git ls-files -z --others --exclude-standard; } \
    | xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
}
size() { du -cb "$@" | tail -1 | cut -f1; }
TREE=$(tree_bytes)
BUDGET=$((LIMIT - TREE - MARGIN))
TOTAL=$(stat -c %s "$SITE_ZST")
EXTRA1=$(size "$CARRY/kit/ros312.tar.zst" "$CARRY/kit/ros312.sha256" "$CARRY/site.sha256" "$CARRY/bin")
B=$(( BUDGET < PART_MAX ? BUDGET : PART_MAX ))   # partab
C=$(( BUDGET < PART_MAX ? BUDGET : PART_MAX ))   # partac (at most)
A=$((TOTAL - B - C))
[ "$A" -gt 0 ] || { A=$((TOTAL / 3)); B=$A; C=$((TOTAL - 2 * A)); }
C=$((TOTAL - A - B))
[ $((A + EXTRA1)) -le "$BUDGET" ] || fail "call 1 would carry $(( (A + EXTRA1) / MiB )) MiB > budget $((BUDGET / MiB)) MiB: the ROS kit ($((EXTRA1 / MiB)) MiB) is too big for 3 calls"

rm -rf "$CARRY/call1" "$CARRY/call2" "$CARRY/call3"
mkdir -p "$CARRY/call1" "$CARRY/call2" "$CARRY/call3"
cut_part() {  # cut_part OFFSET COUNT OUT
  dd if="$SITE_ZST" of="$3" bs=1M iflag=skip_bytes,count_bytes skip="$1" count="$2" status=none
}
cut_part 0 "$A" "$CARRY/call1/site.tar.zst.partaa"
cut_part "$A" "$B" "$CARRY/call2/site.tar.zst.partab"
cut_part $((A + B)) "$C" "$CARRY/call3/site.tar.zst.partac"
cp "$CARRY/site.sha256" "$CARRY/call1/"
cp "$CARRY/kit/ros312.tar.zst" "$CARRY/kit/ros312.sha256" "$CARRY/call1/"
cp -r "$CARRY/bin" "$CARRY/call1/"
# check: the three parts are the whole file
cat "$CARRY"/call{1,2,3}/site.tar.zst.part* | cmp - "$SITE_ZST" || fail "parts do not reassemble to $SITE_ZST"
rm -rf "$ROOT/.gpucarry"
cp -al "$CARRY/call1" "$ROOT/.gpucarry"
(cd "$ROOT" && git check-ignore -q .gpucarry/site.tar.zst.partaa) || fail ".gpucarry/ is not git-ignored"
for n in 1 2 3; do
  c=$(size "$CARRY/call$n")
  printf 'pack_calls: call %d carries %6.2f MiB + tree %.2f MiB = %6.2f MiB (limit 64): %s\n' "$n" \
    "$(awk -v x="$c" 'BEGIN{print x/1048576}')" "$(awk -v x="$TREE" 'BEGIN{print x/1048576}')" \
    "$(awk -v x="$((c + TREE))" 'BEGIN{print x/1048576}')" "$(cd "$CARRY/call$n" && ls | tr '\n' ' ')"
done
echo "pack_calls: .gpucarry/ holds call 1 now"
