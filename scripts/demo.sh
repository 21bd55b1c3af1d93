#!/usr/bin/env bash
# The main job on the embedded default: real 2×H200 NCCL captures bundled in the repository
# (ViT-L/32 DDP, P2P over NVLink and the same job with NCCL_P2P_DISABLE=1) analysed and checked;
# reports written under ./traceguard-demo/ and shown.
set -uo pipefail
cd "$(dirname "$0")/.."
TRACEGUARD_SKIP_NSYS=1 TRACEGUARD_SKIP_BROWSER=1 TRACEGUARD_SKIP_TORCH=1 bash scripts/setup.sh
TG=.venv/bin/traceguard
mkdir -p traceguard-demo
for run in p2p_nsys shm_nsys; do
  echo "=== $run (tests/fixtures/h200/$run) ==="
  $TG analyze "tests/fixtures/h200/$run" --profile h200-nvlink --out "traceguard-demo/$run.html"
  $TG analyze "tests/fixtures/h200/$run" --profile h200-nvlink --out "traceguard-demo/$run.json"
  $TG check "tests/fixtures/h200/$run" --profile h200-nvlink --junit "traceguard-demo/$run.junit.xml"
  echo "check exit code: $? (0 = nothing fails, 1 = a check fails)"
done
$TG analyze tests/fixtures/h200/shm_nsys --profile h200-nvlink --format md | head -40
