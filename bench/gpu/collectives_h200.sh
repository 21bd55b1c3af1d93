#!/usr/bin/env bash
# Collective benchmarks (traceguard/capture/bench_collectives.py, nccl-tests output format) on a
# multi-GPU H200 machine, with NCCL_DEBUG logs and nvidia-smi side files, for issue 3's rules.
# Run from the repo root; results land under $OUT (one tar per setting).
set -u
OUTDIR=${OUT:-/tmp/out}
NGPU=${NGPU:-$(nvidia-smi -L | wc -l)}
W=/tmp/coll; rm -rf "$W"; mkdir -p "$W"
export PYTHONUNBUFFERED=1
MAX=${MAX_BYTES:-1G}
nvidia-smi topo -m > "$W/topo.txt" 2>&1
nvidia-smi -q > "$W/nvidia-smi-q.txt" 2>&1

bench() { # NAME "ENV" ARGS...
  local name=$1 extra=$2; shift 2
  local d=$W/$name; mkdir -p "$d"
  local start=$SECONDS
  nvidia-smi dmon -s put -d 1 > "$d/dmon.txt" 2>&1 & local dmon=$!
  env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH,ENV NCCL_DEBUG_FILE="$d/nccl.%h.%p.log" $extra \
    timeout 280 torchrun --nproc_per_node="$NGPU" -m traceguard.capture.bench_collectives \
    --ops all_reduce,all_gather,reduce_scatter,broadcast --min-bytes 8 --max-bytes "$MAX" \
    --out "$d/nccl-tests.txt" --json "$d/bench.json" "$@" > "$d/stdout.txt" 2>&1
  echo "rc=$? seconds=$((SECONDS - start))" >> "$d/stdout.txt"
  kill $dmon 2>/dev/null
  echo "== $name: $(tail -1 "$d/stdout.txt")"
}

RUNS=${RUNS:-p2p_graph p2p_eager shm_graph net_graph}
for r in $RUNS; do
  case $r in
    p2p_graph) bench "${NGPU}gpu_p2p_graph" "" --cuda-graph ;;
    p2p_eager) bench "${NGPU}gpu_p2p_eager" "" ;;
    shm_graph) bench "${NGPU}gpu_shm_graph" "NCCL_P2P_DISABLE=1" --cuda-graph ;;
    net_graph) MAX=64M bench "${NGPU}gpu_net_graph" "NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1" --cuda-graph ;;
  esac
done
mkdir -p "$OUTDIR"
for d in "$W"/*/; do tar -C "$W" -czf "$OUTDIR/$(basename "$d").tgz" "$(basename "$d")"; done
tar -C "$W" -czf "$OUTDIR/machine_${NGPU}gpu.tgz" topo.txt nvidia-smi-q.txt
ls -la "$OUTDIR"
