#!/usr/bin/env bash
# Real captures of one job three ways (CUDA graph at graph level, at node level, eager) plus a
# torch.profiler trace of the graph replay, for tests/fixtures/cuda_graphs/. Runs on a GPU machine
# with torch (no other project dependency) and the nsys that Nsight Compute bundles; see
# /work/shared/docs/NSYS.md for the libdw recipe. Results land gzipped in $OUT.
#   usage (repository root): OUT=/some/dir bash bench/gpu/cuda_graph_captures.sh
set -u
OUT=${OUT:?set OUT}
W=/tmp/cg && rm -rf "$W" && mkdir -p "$W"
exec > >(tee "$W/log.txt") 2>&1
NSYS=$(ls /opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys | head -1)
HOST=$(dirname "$(dirname "$NSYS")")
mkdir -p /tmp/libdw && for f in .devdeb/*.deb; do dpkg -x "$f" /tmp/libdw; done
export LD_LIBRARY_PATH=/tmp/libdw/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
[ -e "$HOST/host-linux-x64" ] || ln -s linux-desktop-glibc_2_11_3-x64 "$HOST/host-linux-x64"
echo "nsys: $NSYS"; "$NSYS" --version
nvidia-smi --query-gpu=name,driver_version --format=csv
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())'

# The step: MLP 4x2048, batch 64, explicit all-reduce (AVG) of the flat gradients, SGD.
JOB=(--model mlp --mlp-width 2048 --mlp-depth 4 --batch-size 64 --warmup 3 --timed 3 --steps 6 --comm allreduce)

echo "== probe"
timeout 120 torchrun --nproc_per_node=1 bench/gpu/nccl_one_rank_probe.py --out "$W/probe.json" || echo "probe failed"

capture() {  # name trace-mode job-args...
  local name=$1 mode=$2; shift 2
  echo "== $name ($mode)"
  timeout 180 torchrun --nproc_per_node=1 --no-python "$NSYS" profile --trace=cuda,nvtx,osrt --sample=none \
    --cpuctxsw=none --cuda-graph-trace="$mode" --capture-range=cudaProfilerApi --capture-range-end=stop \
    --force-overwrite=true -o "$W/$name" \
    python3 -m traceguard.capture.ddp_job --out "$W/$name.job" --capture nsys "${JOB[@]}" "$@" \
    || echo "$name: profile failed"
  timeout 120 "$NSYS" export --type sqlite --include-blobs=true --force-overwrite=true \
    -o "$W/$name.sqlite" "$W/$name.nsys-rep" || echo "$name: export failed"
  cp "$W/$name.job/rank0.json" "$W/$name.job.json" 2>/dev/null
}
capture graph_level graph --cuda-graphs
capture node_level node --cuda-graphs
capture eager graph

echo "== kineto"
timeout 180 torchrun --nproc_per_node=1 -m traceguard.capture.ddp_job --out "$W/kineto" --capture torch \
  --cuda-graphs "${JOB[@]}" || echo "kineto failed"

echo "== harness CLI smoke (--cuda-graphs, no capture)"
timeout 120 torchrun --nproc_per_node=1 -m traceguard.capture.ddp_job --out "$W/smoke" --cuda-graphs \
  --model mlp --steps 2 || echo "smoke failed"

for n in graph_level node_level eager; do
  [ -f "$W/$n.sqlite" ] && gzip -9 -c "$W/$n.sqlite" > "$OUT/$n.sqlite.gz"
done
[ -f "$W/kineto/rank0.trace.json" ] && gzip -9 -c "$W/kineto/rank0.trace.json" > "$OUT/kineto_graph.trace.json.gz"
tar -C "$W" -czf "$OUT/meta.tar.gz" log.txt probe.json graph_level.job.json node_level.job.json eager.job.json \
  kineto/rank0.json smoke/rank0.json 2>/dev/null
ls -la "$OUT"
