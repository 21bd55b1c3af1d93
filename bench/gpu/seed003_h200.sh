#!/usr/bin/env bash
# The published DDP study (seed document 003) reproduced the way it was run — `traceguard harness
# sweep --matrix seed003` on a 2-GPU H200 machine: ViT-L/32, every comparison on one 2000 MB
# bucket, cumulative (DDP; + static_graph; + gradient_as_bucket_view; + bf16 hook; PowerSGD from
# iteration 2), then 25 / 100 MB buckets for the bf16 and PowerSGD variants, each over P2P and SHM.
# Throughput: 20 steps timed outside the capture, 3 times (the matrix's defaults; median and spread
# in each manifest); then 3 steps under nsys. Bundles gzipped, tarred under $OUT.
#   usage (repository root): OUT=/some/dir [ONLY="ddp static_graph"] bash bench/gpu/seed003_h200.sh
# A setting takes about a minute (ViT-L start-up, 66 steps, nsys export): split the 18 settings over
# device calls with ONLY; the sweep keeps the settings run before into the same directory ($W), so
# the last call's tar holds every bundle and `traceguard harness table` makes the one results table.
set -u
OUTDIR=${OUT:-/tmp/out}
mkdir -p /tmp/libdw && for f in .devdeb/*.deb; do dpkg -x "$f" /tmp/libdw; done
export LD_LIBRARY_PATH=/tmp/libdw/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
NC=$(ls -d /opt/nvidia/nsight-compute/*/host | head -1)
[ -e "$NC/host-linux-x64" ] || ln -s linux-desktop-glibc_2_11_3-x64 "$NC/host-linux-x64"
export TRACEGUARD_NSYS=$NC/target-linux-x64/nsys
W=${SWEEP_DIR:-/tmp/seed003}; mkdir -p "$W"
only=(); for s in ${ONLY:-}; do only+=(--only "$s"); done
python3 -m traceguard.capture.harness sweep --matrix seed003 --out "$W" "${only[@]}" \
  --model vit_l_32 --batch-size 32 --steps 3 --capture nsys --backend nccl --compress
mkdir -p "$OUTDIR"
tar -C "$W" -cf "$OUTDIR/seed003_$(date +%s).tar" .
ls -la "$OUTDIR"
