#!/usr/bin/env bash
# bench/gpu/compile_graphs.py under nsys at graph level and at node level (see cuda_graph_captures.sh
# for the nsys recipe). Results gzipped into $OUT.   usage: OUT=DIR bash bench/gpu/compile_graphs.sh
set -u
OUT=${OUT:?set OUT}
W=/tmp/cc && rm -rf "$W" && mkdir -p "$W"
exec > >(tee "$W/compile_log.txt") 2>&1
NSYS=$(ls /opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys | head -1)
HOST=$(dirname "$(dirname "$NSYS")")
mkdir -p /tmp/libdw && for f in .devdeb/*.deb; do dpkg -x "$f" /tmp/libdw; done
export LD_LIBRARY_PATH=/tmp/libdw/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
[ -e "$HOST/host-linux-x64" ] || ln -s linux-desktop-glibc_2_11_3-x64 "$HOST/host-linux-x64"
export TORCHINDUCTOR_CACHE_DIR=/tmp/cc/inductor
for mode in graph node; do
  echo "== compile_$mode"
  timeout 300 "$NSYS" profile --trace=cuda,nvtx,osrt --sample=none --cpuctxsw=none --cuda-graph-trace=$mode \
    --capture-range=cudaProfilerApi --capture-range-end=stop --force-overwrite=true -o "$W/compile_$mode" \
    python3 bench/gpu/compile_graphs.py || echo "compile_$mode: profile failed"
  timeout 120 "$NSYS" export --type sqlite --include-blobs=true --force-overwrite=true \
    -o "$W/compile_$mode.sqlite" "$W/compile_$mode.nsys-rep" || echo "compile_$mode: export failed"
  [ -f "$W/compile_$mode.sqlite" ] && gzip -9 -c "$W/compile_$mode.sqlite" > "$OUT/compile_${mode}_level.sqlite.gz"
done
cp "$W/compile_log.txt" "$OUT/" 2>/dev/null
ls -la "$OUT"
