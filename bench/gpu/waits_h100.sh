#!/usr/bin/env bash
# Real 2-GPU captures with a KNOWN late rank, for the cross-rank analysis (issue 24): the DDP job
# (traceguard/capture/ddp_job.py) clean, with `--slow-rank 1:30` (rank 1's host sleeps 30 ms in every
# step's `get batch`, before forward) and with NCCL_P2P_DISABLE=1 (SHM), each under nsys and under
# torch.profiler, with NCCL_DEBUG=INFO logs per rank and dmon. Modelled on capture_h200.sh; made for
# the lent 2×H100 machine. Run from a folder holding the traceguard package, with the libdw/libelf
# .debs in $DEBDIR (default .devdeb/). Writes one tar per run and the machine's facts under $OUT.
set -u
OUTDIR=${OUT:-/tmp/out}
W=/tmp/caps; rm -rf "$W"; mkdir -p "$W"
NGPU=${NGPU:-2}
DEBDIR=${DEBDIR:-.devdeb}
SLOW=${SLOW:-1:30}
# One 2000 MB gradient bucket: one AllReduce kernel per step, so each step has one collective to
# line up across ranks. nsys runs record 6 steps; torch.profiler traces are ~0.5 MB a step gzipped,
# so those record 3.
COMMON=${COMMON:---model vit_l_32 --batch-size 32 --bucket-cap-mb 2000 --warmup 3 --timed 3}
NSYS_STEPS=${NSYS_STEPS:-6}
TORCH_STEPS=${TORCH_STEPS:-3}

mkdir -p /tmp/libdw && for f in "$DEBDIR"/*.deb; do dpkg -x "$f" /tmp/libdw; done
export LD_LIBRARY_PATH=/tmp/libdw/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
NC=/opt/nvidia/nsight-compute/2025.3.1/host
[ -e "$NC/host-linux-x64" ] || ln -s linux-desktop-glibc_2_11_3-x64 "$NC/host-linux-x64"
NSYS=$NC/target-linux-x64/nsys
export PYTHONUNBUFFERED=1

# What the machine really has.
{ nvidia-smi topo -m; } > "$W/topo.txt" 2>&1
nvidia-smi -q > "$W/nvidia-smi-q.txt" 2>&1
nvidia-smi -L > "$W/nvidia-smi-L.txt" 2>&1
"$NSYS" --version > "$W/nsys-version.txt" 2>&1
python3 -c "import torch, platform; print('python', platform.python_version()); print('torch', torch.__version__); \
print('cuda', torch.version.cuda); print('nccl', '.'.join(map(str, torch.cuda.nccl.version()))); \
print('gpus', [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
try:
    import torchvision; print('torchvision', torchvision.__version__)
except ImportError:
    print('torchvision missing')
try:
    import nvtx; print('nvtx', getattr(nvtx, '__version__', '?'))
except ImportError:
    print('nvtx missing (the job uses torch.cuda.nvtx on GPUs)')" > "$W/versions.txt" 2>&1
env | grep -E '^(NCCL_|TORCH_|NVSHMEM_|CUDA_VERSION)' | sort > "$W/env.txt"
# The job must import with torch alone: say what it pulls in beyond torch and the standard library.
python3 -c "import sys; before = set(sys.modules); import traceguard.capture.ddp_job; \
print(sorted({m.split('.')[0] for m in set(sys.modules) - before} - set(sys.stdlib_module_names)))" \
  > "$W/job-imports.txt" 2>&1
MODEL=vit_l_32
python3 -c "import torchvision" 2>/dev/null || { MODEL=mlp; COMMON="${COMMON/vit_l_32/mlp} --mlp-width 8192"; }
echo "model $MODEL: $COMMON" >> "$W/versions.txt"

nccl_env() { echo "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH,ENV NCCL_DEBUG_FILE=$1/nccl.%h.%p.log"; }

# run NAME CAPTURE "EXTRA_ENV" JOB_ARGS...
run() {
  local name=$1 capture=$2 extra=$3; shift 3
  local d=$W/$name; mkdir -p "$d"
  local start=$SECONDS
  nvidia-smi dmon -s put -d 1 > "$d/dmon.txt" 2>&1 & local dmon=$!
  if [ "$capture" = nsys ]; then
    env $(nccl_env "$d") $extra timeout 150 torchrun --nproc_per_node="$NGPU" --no-python "$NSYS" profile \
      --trace=cuda,nvtx,osrt --sample=none --cpuctxsw=none --capture-range=cudaProfilerApi \
      --capture-range-end=stop -f true -o "$d/cap_%q{RANK}" \
      python3 -m traceguard.capture.ddp_job --out "$d" --capture nsys $COMMON --steps "$NSYS_STEPS" "$@" \
      > "$d/stdout.txt" 2>&1
    echo "rc=$? seconds=$((SECONDS - start))" >> "$d/stdout.txt"
    # --include-blobs=true keeps NCCL's NVTX payloads (message sizes) in NVTX_EVENTS.binaryData.
    for r in $(seq 0 $((NGPU - 1))); do
      timeout 120 "$NSYS" export --type sqlite --include-blobs=true -f true -o "$d/cap_$r.sqlite" "$d/cap_$r.nsys-rep" \
        > "$d/export_$r.txt" 2>&1 || echo "export of rank $r failed" >> "$d/stdout.txt"
    done
    rm -f "$d"/*.nsys-rep "$d"/*.qdstrm
  else
    env $(nccl_env "$d") $extra timeout 150 torchrun --nproc_per_node="$NGPU" -m traceguard.capture.ddp_job \
      --out "$d" --capture "$capture" $COMMON --steps "$TORCH_STEPS" "$@" > "$d/stdout.txt" 2>&1
    echo "rc=$? seconds=$((SECONDS - start))" >> "$d/stdout.txt"
  fi
  kill $dmon 2>/dev/null
  echo "== $name: $(grep '^rc=' "$d/stdout.txt")"
  find "$d" -name '*.sqlite' -o -name '*.trace.json' | xargs -r gzip -9
  ls -la "$d" | tail -n +2
  mkdir -p "$OUTDIR" && tar -C "$W" -cf "$OUTDIR/$name.tar" "$name"
}

RUNS=${RUNS:-clean_nsys slow_nsys shm_nsys clean_torch slow_torch shm_torch}
for r in $RUNS; do
  case $r in
    clean_nsys) run clean_nsys nsys "" ;;
    slow_nsys) run slow_nsys nsys "" --slow-rank "$SLOW" ;;
    shm_nsys) run shm_nsys nsys "NCCL_P2P_DISABLE=1" ;;
    clean_torch) run clean_torch torch "" ;;
    slow_torch) run slow_torch torch "" --slow-rank "$SLOW" ;;
    shm_torch) run shm_torch torch "NCCL_P2P_DISABLE=1" ;;
  esac
done

mkdir -p "$OUTDIR"
tar -C "$W" -cf "$OUTDIR/machine.tar" $(cd "$W" && ls *.txt)
ls -la "$OUTDIR"
