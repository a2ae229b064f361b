#!/usr/bin/env bash
# HERE: lay out what each staging call carries, sized so that every call (working tree +
# .gpucarry/) stays under the 64 MiB a device call may carry, and fill .gpucarry/ for call 1.
#
#   bash scripts/gpu/pack_calls.sh
#     in:  $SITE_ZST (make_carry.sh's site.tar.zst), $CARRY/site.sha256 and $CARRY/bin/ (zstd for the
#          device), $CARRY/kit/ros312.tar.zst + ros312.sha256 (make_ros_kit.sh)
#     out: $CARRY/call1/ = site.tar.zst.partaa + site.parts + site.sha256 + ros312.tar.zst
#                          + ros312.sha256 + bin/
#          $CARRY/callN/ = site.tar.zst.part<ab, ac, ...> for N = 2.. as many calls as it takes
#          .gpucarry/  = hard links to call1/ (switch with: rm -rf .gpucarry && cp -al $CARRY/callN .gpucarry)
# partaa fills what call 1 has room for beside the ROS kit; the other parts share what is left
# evenly (each <= PART_MAX, default 60 MiB). The working tree grows (2.2 MiB by
# now), so the number of calls is counted, not fixed: 3 while the tree stayed under ~1.6 MiB.
# site.parts names the parts in order (install.sh reassembles from it); the sha256 is of the
# whole site.tar.zst.
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
PART=$(( BUDGET < PART_MAX ? BUDGET : PART_MAX ))
A=$((PART - EXTRA1))   # partaa: what call 1 has room for beside the ROS kit
[ "$A" -gt 0 ] || fail "the ROS kit ($((EXTRA1 / MiB)) MiB) leaves no room in call 1 (budget $((BUDGET / MiB)) MiB)"
[ "$A" -le "$TOTAL" ] || A=$TOTAL
REST=$((TOTAL - A))
N=$(( 1 + (REST + PART - 1) / PART ))   # calls
EACH=$(( N > 1 ? (REST + N - 2) / (N - 1) : 0 ))   # the other parts, evenly
suffix() { printf "a\\$(printf %03o $((96 + $1)))"; }   # 1 -> aa, 2 -> ab, ...

rm -rf "$CARRY"/call[0-9]*
cut_part() {  # cut_part OFFSET COUNT OUT
  dd if="$SITE_ZST" of="$3" bs=1M iflag=skip_bytes,count_bytes skip="$1" count="$2" status=none
}
offset=0
: > "$CARRY/site.parts"
for n in $(seq 1 "$N"); do
  mkdir -p "$CARRY/call$n"
  count=$(( n == 1 ? A : EACH ))
  [ $((offset + count)) -le "$TOTAL" ] || count=$((TOTAL - offset))
  name="site.tar.zst.part$(suffix "$n")"
  cut_part "$offset" "$count" "$CARRY/call$n/$name"
  echo "$name" >> "$CARRY/site.parts"
  offset=$((offset + count))
done
[ "$offset" -eq "$TOTAL" ] || fail "parts cover $offset of $TOTAL bytes"
cp "$CARRY/site.parts" "$CARRY/site.sha256" "$CARRY/kit/ros312.tar.zst" "$CARRY/kit/ros312.sha256" \
  "$CARRY/call1/"
cp -r "$CARRY/bin" "$CARRY/call1/"
# check: the parts are the whole file
(cd "$CARRY" && for n in $(seq 1 "$N"); do cat call"$n"/site.tar.zst.part*; done) | cmp - "$SITE_ZST" \
  || fail "parts do not reassemble to $SITE_ZST"
rm -rf "$ROOT/.gpucarry"
cp -al "$CARRY/call1" "$ROOT/.gpucarry"
(cd "$ROOT" && git check-ignore -q .gpucarry/site.tar.zst.partaa) || fail ".gpucarry/ is not git-ignored"
for n in $(seq 1 "$N"); do
  c=$(size "$CARRY/call$n")
  [ $((c + TREE)) -le "$LIMIT" ] || fail "call $n would carry $(( (c + TREE) / MiB )) MiB"
  printf 'pack_calls: call %d carries %6.2f MiB + tree %.2f MiB = %6.2f MiB (limit 64): %s\n' "$n" \
    "$(awk -v x="$c" 'BEGIN{print x/1048576}')" "$(awk -v x="$TREE" 'BEGIN{print x/1048576}')" \
    "$(awk -v x="$((c + TREE))" 'BEGIN{print x/1048576}')" "$(cd "$CARRY/call$n" && ls | tr '\n' ' ')"
done
echo "pack_calls: $N staging calls; .gpucarry/ holds call 1 now"
