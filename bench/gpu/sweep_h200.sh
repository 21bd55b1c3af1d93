#!/usr/bin/env bash
# The harness sweep (issue 4) on a 2-GPU H200 machine: ViT-L/32, each setting of the `gpu` matrix
# under nsys (the Nsight Compute bundled one, NSYS.md recipe), bundles gzipped under $OUT.
# ONLY="a b c" runs a subset (the sweep is split over device calls to fit their time limit).
set -u
OUTDIR=${OUT:-/tmp/out}
mkdir -p /tmp/libdw && for f in .devdeb/*.deb; do dpkg -x "$f" /tmp/libdw; done
export LD_LIBRARY_PATH=/tmp/libdw/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
NC=/opt/nvidia/nsight-compute/2025.3.1/host
[ -e "$NC/host-linux-x64" ] || ln -s linux-desktop-glibc_2_11_3-x64 "$NC/host-linux-x64"
export TRACEGUARD_NSYS=$NC/target-linux-x64/nsys
W=/tmp/sweep; mkdir -p "$W"
only=(); for s in ${ONLY:-}; do only+=(--only "$s"); done
python3 -m traceguard.capture.harness sweep --matrix gpu --out "$W" "${only[@]}" \
  --model vit_l_32 --batch-size 32 --warmup 3 --timed 5 --steps 3 --capture nsys --backend nccl --compress
mkdir -p "$OUTDIR"
tar -C "$W" -cf "$OUTDIR/sweep_$(date +%s).tar" .
ls -la "$OUTDIR"
