#!/usr/bin/env bash
# The workloads of seed documents 001-002 — `traceguard harness sweep --matrix seed001-002` on 2 or 4
# H200 (NGPU): broadcast/reduce fp32 vs fp16, blocking vs async; pipeline GPipe vs 1F1B, blocking vs
# batched send/recv, 2 and 4 stages (4-stage rows need NGPU=4; on 2 GPUs they are left out); FSDP2
# and tensor parallel beside. An MLP large enough for NCCL to matter: 8 × 8192² (2.1 GB of fp32
# parameters), batch 256 (8 microbatches of 32). Each setting: 3 warm-up steps, 20 timed steps × 3
# (median and spread), 3 steps under nsys, plus a torch.profiler capture of the same setting
# (Kineto's collective records carry sizes and peers). Bundles gzipped, tarred under $OUT.
#   usage (repository root): OUT=/some/dir NGPU=4 [ONLY="pipeline4_1f1b_batched"] bash bench/gpu/workloads_h200.sh
# The sweep keeps settings run before into the same directory, so ONLY can split it over device calls.
set -u
OUTDIR=${OUT:-/tmp/out}
NGPU=${NGPU:-2}
mkdir -p /tmp/libdw && for f in .devdeb/*.deb; do dpkg -x "$f" /tmp/libdw; done
export LD_LIBRARY_PATH=/tmp/libdw/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
NC=$(ls -d /opt/nvidia/nsight-compute/*/host | head -1)
[ -e "$NC/host-linux-x64" ] || ln -s linux-desktop-glibc_2_11_3-x64 "$NC/host-linux-x64"
export TRACEGUARD_NSYS=$NC/target-linux-x64/nsys
JOB=(--model mlp --mlp-width 8192 --mlp-depth 8 --batch-size 256 --steps 3 --backend nccl --compress
  --world-size "$NGPU")
settings=${ONLY:-$(python3 -c "
from traceguard.capture.harness import MATRICES
print(' '.join(n for n, o in MATRICES['seed001-002'] if not ('4' in o and $NGPU < 4)))")}
for capture in nsys torch; do
  W=${SWEEP_DIR:-/tmp/seed001-002_${NGPU}gpu}/$capture; mkdir -p "$W"
  only=(); for s in $settings; do only+=(--only "$s"); done
  python3 -m traceguard.capture.harness sweep --matrix seed001-002 --out "$W" "${only[@]}" "${JOB[@]}" \
    --capture "$capture"
done
mkdir -p "$OUTDIR"
tar -C "$(dirname "$W")" -cf "$OUTDIR/seed001-002_${NGPU}gpu_$(date +%s).tar" .
ls -la "$OUTDIR"
