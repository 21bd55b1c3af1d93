#!/usr/bin/env bash
# Real 2-GPU captures of the DDP job (traceguard/capture/ddp_job.py) on an H200 machine, with
# the nsys recipe of NSYS.md: run from the repo root with the libdw/libelf .debs in .devdeb/.
# Writes gzipped SQLite exports, Kineto traces, NCCL_DEBUG logs and nvidia-smi output under $OUT.
set -u
OUTDIR=${OUT:-/tmp/out}
W=/tmp/caps; rm -rf "$W"; mkdir -p "$W"
NGPU=${NGPU:-2}
MODEL_ARGS=${MODEL_ARGS:---model vit_l_32 --batch-size 32 --warmup 3 --timed 5 --steps 3}

mkdir -p /tmp/libdw && for f in .devdeb/*.deb; do dpkg -x "$f" /tmp/libdw; done
export LD_LIBRARY_PATH=/tmp/libdw/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
NC=/opt/nvidia/nsight-compute/2025.3.1/host
[ -e "$NC/host-linux-x64" ] || ln -s linux-desktop-glibc_2_11_3-x64 "$NC/host-linux-x64"
NSYS=$NC/target-linux-x64/nsys
export PYTHONUNBUFFERED=1

{ nvidia-smi topo -m; } > "$W/topo.txt" 2>&1
nvidia-smi -q > "$W/nvidia-smi-q.txt" 2>&1
"$NSYS" --version > "$W/nsys-version.txt" 2>&1
"$NSYS" export --help > "$W/nsys-export-help.txt" 2>&1
python3 -c "import torch, torchvision; print(torch.__version__, torchvision.__version__, torch.version.cuda, torch.cuda.nccl.version())" > "$W/versions.txt" 2>&1

nccl_env() { echo "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH,ENV NCCL_DEBUG_FILE=$1/nccl.%h.%p.log"; }

# run NAME CAPTURE "EXTRA_ENV" JOB_ARGS...
run() {
  local name=$1 capture=$2 extra=$3; shift 3
  local d=$W/$name; mkdir -p "$d"
  local start=$SECONDS
  nvidia-smi dmon -s put -d 1 > "$d/dmon.txt" 2>&1 & local dmon=$!
  if [ "$capture" = nsys ]; then
    env $(nccl_env "$d") $extra timeout 300 torchrun --nproc_per_node="$NGPU" --no-python "$NSYS" profile \
      --trace=cuda,nvtx,osrt --sample=none --cpuctxsw=none --capture-range=cudaProfilerApi \
      --capture-range-end=stop -f true -o "$d/cap_%q{RANK}" \
      python3 -m traceguard.capture.ddp_job --out "$d" --capture nsys $MODEL_ARGS "$@" > "$d/stdout.txt" 2>&1
    # --include-blobs=true keeps NCCL's NVTX payloads (message sizes) in NVTX_EVENTS.binaryData.
    for r in $(seq 0 $((NGPU - 1))); do
      "$NSYS" export --type sqlite --include-blobs=true -f true -o "$d/cap_$r.sqlite" "$d/cap_$r.nsys-rep" \
        > "$d/export_$r.txt" 2>&1 || echo "export of rank $r failed" >> "$d/stdout.txt"
    done
    rm -f "$d"/*.nsys-rep "$d"/*.qdstrm
  else
    env $(nccl_env "$d") $extra timeout 300 torchrun --nproc_per_node="$NGPU" -m traceguard.capture.ddp_job \
      --out "$d" --capture "$capture" $MODEL_ARGS "$@" > "$d/stdout.txt" 2>&1
  fi
  echo "rc=$? seconds=$((SECONDS - start))" >> "$d/stdout.txt"
  kill $dmon 2>/dev/null
  echo "== $name: $(tail -1 "$d/stdout.txt")"; ls -la "$d" | tail -n +2
}

RUNS=${RUNS:-p2p_nsys shm_nsys p2p_torch shm_torch nobucketview_nsys nobucketview_torch bf16_torch}
for r in $RUNS; do
  case $r in
    p2p_nsys) run p2p_nsys nsys "" ;;
    shm_nsys) run shm_nsys nsys "NCCL_P2P_DISABLE=1" ;;
    p2p_torch) run p2p_torch torch "" ;;
    shm_torch) run shm_torch torch "NCCL_P2P_DISABLE=1" ;;
    nobucketview_nsys) run nobucketview_nsys nsys "" --no-bucket-view ;;
    nobucketview_torch) run nobucketview_torch torch "" --no-bucket-view ;;
    bf16_torch) run bf16_torch torch "" --comm-hook bf16 ;;
    net_none) MODEL_ARGS="--model vit_l_32 --batch-size 32 --warmup 1 --timed 1 --steps 1" \
                run net_none none "NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1" ;;
  esac
done

find "$W" -name '*.sqlite' -o -name '*.trace.json' | xargs -r gzip -9
mkdir -p "$OUTDIR"
for d in "$W"/*/; do tar -C "$W" -cf "$OUTDIR/${NGPU}gpu_$(basename "$d").tar" "$(basename "$d")"; done
tar -C "$W" -cf "$OUTDIR/machine_caps_${NGPU}gpu.tar" $(cd "$W" && ls *.txt)
ls -la "$OUTDIR"
