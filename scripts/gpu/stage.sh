#!/usr/bin/env bash
# On the GPU machine: copy what this call carried in .gpucarry/ to /root/stage (it survives
# between calls only while the machine stays warm) and say what is there now.
#   bash scripts/gpu/stage.sh
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
S=${GPU_STAGE:-/root/stage}
mkdir -p "$S"
if [ -d "$REPO/.gpucarry" ] && [ -n "$(ls -A "$REPO/.gpucarry" 2>/dev/null)" ]; then
  cp -r "$REPO/.gpucarry/." "$S/"
  echo "stage: copied $(du -sh "$REPO/.gpucarry" | cut -f1) from .gpucarry/: $(ls "$REPO/.gpucarry" | tr '\n' ' ')"
else
  echo "stage: nothing carried in .gpucarry/ this call"
fi
have() { [ -e "$S/$1" ] && echo "$1" || echo "($1 missing)"; }
parts=$(cat "$S/site.parts" 2>/dev/null || echo site.parts)
echo "stage: $S holds: $(for p in $parts; do have "$p"; done | tr '\n' ' ')" \
     "$(have site.sha256) $(have ros312.tar.zst) $(have bin/zstd); disk free $(df -h "$S" | awk 'NR==2{print $4}')"
