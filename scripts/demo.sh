#!/usr/bin/env bash
# The main job on the embedded default: real 2×H200 NCCL captures bundled in the repository
# (ViT-L/32 DDP, P2P over NVLink and the same job with NCCL_P2P_DISABLE=1) analysed, checked and
# recorded in the embedded SQLite store; the stored step breakdown and the report are shown, and
# HTML / JSON / JUnit reports are written under ./traceguard-demo/.
set -uo pipefail
cd "$(dirname "$0")/.."
TRACEGUARD_SKIP_NSYS=1 TRACEGUARD_SKIP_BROWSER=1 TRACEGUARD_SKIP_TORCH=1 bash scripts/setup.sh
TG=.venv/bin/traceguard
STORE=traceguard-demo/store
rm -rf "$STORE"
mkdir -p traceguard-demo
for run in p2p_nsys shm_nsys; do
  echo "=== $run (tests/fixtures/h200/$run) ==="
  $TG record "tests/fixtures/h200/$run" --data-dir "$STORE" --profile h200-nvlink --name "$run" \
    --label model=vit_l_32 --label gpus=2xH200 --label "transport=${run%%_*}"
  echo "record exit code: $? (0 = nothing fails, 1 = a check fails)"
  $TG analyze "tests/fixtures/h200/$run" --profile h200-nvlink --out "traceguard-demo/$run.html"
  $TG analyze "tests/fixtures/h200/$run" --profile h200-nvlink --out "traceguard-demo/$run.json"
  $TG check "tests/fixtures/h200/$run" --profile h200-nvlink --junit "traceguard-demo/$run.junit.xml" >/dev/null
done
echo "=== stored in $STORE/traceguard.db: backward-phase NCCL share per run and rank ==="
.venv/bin/python - "$STORE/traceguard.db" <<'PY'
import sqlite3, sys
db = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
query = """
SELECT r.id, r.name, r.verdict, p.rank, count(*) AS steps,
       round(100.0 * sum(p.nccl_ns) / sum(p.gpu_ns), 1) AS nccl_pct_of_backward
FROM phases p JOIN runs r ON r.id = p.run_id
WHERE p.phase = 'backward' GROUP BY r.id, p.rank ORDER BY r.id, p.rank"""
print(f"{'run':>3} {'name':<9} {'verdict':<7} {'rank':>4} {'steps':>5} {'NCCL % of backward GPU time':>28}")
for row in db.execute(query):
    print(f"{row[0]:>3} {row[1]:<9} {row[2]:<7} {row[3]:>4} {row[4]:>5} {row[5]:>28}")
PY
$TG analyze tests/fixtures/h200/shm_nsys --profile h200-nvlink --format md | head -40
echo "Reports: traceguard-demo/*.html; the store: $STORE (serve it with: $TG serve --data-dir $STORE)"
