#!/usr/bin/env bash
# Real 2-GPU runs for the link counters (nsys GPU metrics) and NCCL Inspector logs, through the harness
# (`traceguard harness run`) as a user would run it: the DDP job (ViT-L/32, batch 32) on 2 GPUs.
#   links_p2p / links_shm: nsys with --gpu-metrics (each rank samples its own GPU) and the Inspector plugin
#     (verbose), one 2000 MB gradient bucket (one AllReduce per step), P2P vs NCCL_P2P_DISABLE=1 (SHM);
#   links_slow: the same P2P run with --slow-rank 1:30 (rank 1's host sleeps 30 ms per step);
#   insp_{clean,slow,shm}_default, insp_{clean,slow}_verbose: no profiler, the Inspector alone, 25 MB buckets (tens of
#     AllReduces per step), clean, --slow-rank 1:30 and SHM, default and verbose dumps;
#   insp_prom: the Inspector's Prometheus textfile form (NCCL_INSPECTOR_PROM_DUMP=1), copied while the
#     job runs (the plugin deletes it at exit), with --slow-rank 1:30.
# Needs, in $WORK (default .gpuwork/): the libdw/libelf .debs and nccl-inspector-src.tar.gz from
# ../shared/device. usage (repository root): OUT=/some/dir bash bench/gpu/links_inspector_h100.sh
set -u
OUTDIR=${OUT:-/tmp/out}; mkdir -p "$OUTDIR"
WORK=${WORK:-.gpuwork}
W=/tmp/runs; rm -rf "$W"; mkdir -p "$W"
export PYTHONUNBUFFERED=1

# nsys: Nsight Compute's bundled copy, with the importer's libdw (../shared/docs/NSYS.md).
mkdir -p /tmp/libdw && for f in "$WORK"/*.deb; do dpkg -x "$f" /tmp/libdw; done
export LD_LIBRARY_PATH=/tmp/libdw/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
NC=$(ls -d /opt/nvidia/nsight-compute/*/host | tail -1)
[ -e "$NC/host-linux-x64" ] || ln -s linux-desktop-glibc_2_11_3-x64 "$NC/host-linux-x64"
export TRACEGUARD_NSYS=$NC/target-linux-x64/nsys

# The Inspector plugin, built from NVIDIA/nccl's source (../shared/device/README.md).
CUDA_LIB=$(ls -d /usr/local/cuda*/targets/x86_64-linux/lib | head -1)
CUDA_INC=${CUDA_LIB%/lib}/include
tar -xzf "$WORK/nccl-inspector-src.tar.gz" -C /tmp
(cd /tmp/nccl-inspector && make -j8 libnccl-profiler-inspector.so CUDA_HOME=/tmp CXXSTD=-std=c++17 \
  CUDA_INC="$CUDA_INC" CUDA_LIB="$CUDA_LIB") > "$W/plugin_build.txt" 2>&1
PLUGIN=$(find /tmp/nccl-inspector -name libnccl-profiler-inspector.so | head -1)
echo "plugin: ${PLUGIN:-NOT BUILT}" | tee -a "$W/plugin_build.txt"
export LD_LIBRARY_PATH=$CUDA_LIB:$LD_LIBRARY_PATH

# What the machine has, and what nsys offers for GPU metrics here.
nvidia-smi topo -m > "$W/topo.txt" 2>&1
nvidia-smi -L > "$W/nvidia-smi-L.txt" 2>&1
"$TRACEGUARD_NSYS" --version > "$W/nsys-version.txt" 2>&1
"$TRACEGUARD_NSYS" profile --gpu-metrics-devices=help > "$W/gpu-metrics-devices.txt" 2>&1
"$TRACEGUARD_NSYS" profile --gpu-metrics-set=help > "$W/gpu-metrics-sets.txt" 2>&1
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())" \
  > "$W/versions.txt" 2>&1
MODEL=vit_l_32; python3 -c "import torchvision" 2>/dev/null || MODEL=mlp
echo "model $MODEL" >> "$W/versions.txt"

harness() {  # harness NAME ARGS...
  local name=$1; shift
  local start=$SECONDS
  timeout 200 python3 -m traceguard.capture.harness run --out "$W/$name" --world-size 2 --model "$MODEL" \
    --batch-size 32 --compress --timeout 170 "$@" > "$W/$name.log" 2>&1
  echo "== $name rc=$? $((SECONDS - start)) s" | tee -a "$W/runs.txt"
  find "$W/$name" -name '*.log' -path '*inspector*' | xargs -r gzip -9
  find "$W/$name" -name 'nccl.*.log' | xargs -r gzip -9
  ls -la "$W/$name" "$W/$name/inspector" 2>/dev/null | tee -a "$W/runs.txt" >/dev/null
}

LINKS="--capture nsys --gpu-metrics --gpu-metrics-frequency 10000 --bucket-cap-mb 2000 --warmup 3 --timed 3 --steps 4"
INSP=(); [ -n "$PLUGIN" ] && INSP=(--nccl-inspector "$PLUGIN")
RUNS=${RUNS:-links_p2p links_shm links_slow insp_clean_default insp_slow_default insp_shm_default insp_clean_verbose insp_slow_verbose insp_prom}
want() { [[ " $RUNS " == *" $1 "* ]]; }
want links_p2p && harness links_p2p $LINKS "${INSP[@]}" --nccl-inspector-verbose
want links_shm && harness links_shm $LINKS --no-p2p "${INSP[@]}" --nccl-inspector-verbose
want links_slow && harness links_slow $LINKS --slow-rank 1:30 "${INSP[@]}" --nccl-inspector-verbose
QUICK="--capture none --warmup 3 --timed 10 --steps 3"
want insp_clean_default && harness insp_clean_default $QUICK "${INSP[@]}"
want insp_slow_default && harness insp_slow_default $QUICK --slow-rank 1:30 "${INSP[@]}"
want insp_shm_default && harness insp_shm_default $QUICK --no-p2p "${INSP[@]}"
want insp_clean_verbose && harness insp_clean_verbose $QUICK "${INSP[@]}" --nccl-inspector-verbose
want insp_slow_verbose && harness insp_slow_verbose $QUICK --slow-rank 1:30 "${INSP[@]}" --nccl-inspector-verbose
# Prometheus form: the plugin rewrites nccl_inspector_metrics_<GPU UUID>.prom at most every 30 s
# and DELETES it at teardown, so a job needs > 30 s and the files are copied while it runs (every
# 3 s, into insp_prom/snap/, suffix _tNNN = seconds since the start), as a node exporter scrapes them.
if want insp_prom; then
  mkdir -p "$W/insp_prom_snap"; rm -f "$W/prom.done"
  (harness insp_prom --capture none --warmup 3 --timed 150 --repeats 3 --steps 3 --slow-rank 1:30 "${INSP[@]}" \
     --env NCCL_INSPECTOR_PROM_DUMP=1; touch "$W/prom.done") &
  i=0
  while [ ! -e "$W/prom.done" ]; do
    sleep 3; i=$((i + 1))
    for f in "$W"/insp_prom/inspector/*.prom; do
      [ -e "$f" ] && cp "$f" "$W/insp_prom_snap/$(basename "$f" .prom)_t$(printf %03d $((i * 3))).prom"
    done
  done
  mv "$W/insp_prom_snap" "$W/insp_prom/snap"
fi

# At most 8 files of 16 MiB come back: one tar per capture run, the Inspector-only runs together.
for r in links_p2p links_shm links_slow; do [ -d "$W/$r" ] && tar -C "$W" -cf "$OUTDIR/$r.tar" "$r" "$r.log"; done
insp=$(cd "$W" && ls -d insp_* 2>/dev/null)
[ -n "$insp" ] && tar -C "$W" -cf "$OUTDIR/inspector_runs.tar" $insp
tar -C "$W" -cf "$OUTDIR/machine.tar" $(cd "$W" && ls *.txt)
ls -la "$OUTDIR"
