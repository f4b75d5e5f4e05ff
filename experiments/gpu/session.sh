#!/usr/bin/env bash
# One GPU session: install what gpu_carry/ brings, check versions and assets, then the gpu-marked tests and
# experiments.gpu.bench, every log kept whole under $OUT. At most 7.5 minutes (the limits below sum to 435 s), leaving
# room for a rerun in a 15-minute lease.
#
# Here first:   make gpu-carry        # gpu_carry/: transformers 5.24 + huggingface-hub wheels for Python 3.12,
#                                     #   the tokenizers the tests and the benchmark read; fails above 60 MiB
# Dry run here: DEVICE=cpu OUT=runs/gpu_session_cpu bash experiments/gpu/session.sh
# On the GPU (the device tool, from the repository root, carry ["gpu_carry"]):
#               OUT=$OUT bash experiments/gpu/session.sh
# OUT receives session.log (what ran, when, each step's exit status), install.log, preflight.txt, gpu_tests.txt,
# gpu_bench.txt, gpu_bench.md and records.jsonl.
set -uo pipefail
OUT=${OUT:-runs/gpu_session}
DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT"
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/session.log"; }
step() {  # step NAME LIMIT_S LOGFILE CMD...: run with a time limit, the whole output kept in LOGFILE
  local name=$1 limit=$2 file=$3; shift 3
  log "start $name (limit ${limit}s)"
  timeout "$limit" "$@" > "$OUT/$file" 2>&1
  local rc=$?
  log "end $name: exit $rc ($(wc -l < "$OUT/$file") lines in $file)"
  return $rc
}

if [ ! -f gpu_carry/manifest.json ]; then
  log "gpu_carry/manifest.json is missing: run 'make gpu-carry' here and carry gpu_carry"; exit 3
fi
SITE=$(mktemp -d)/site
export PYTHONDONTWRITEBYTECODE=1
step install 30 install.log python3 -m pip install --no-index --no-deps --no-compile --disable-pip-version-check \
  --target "$SITE" gpu_carry/wheels/*.whl || { log "installing the carried wheels failed"; exit 3; }
CACHE=$(mktemp -d)/xvocab-cache
mkdir -p "$CACHE" && tar xJf gpu_carry/xvocab-cache.tar.xz -C "$CACHE" || { log "unpacking the cache failed"; exit 3; }
export PYTHONPATH=$SITE:$PWD XVOCAB_CACHE=$CACHE XVOCAB_OFFLINE=1
step preflight 45 preflight.txt python3 -m experiments.gpu.carry --preflight --device "$DEVICE" \
  || { cat "$OUT/preflight.txt"; log "preflight failed: nothing else runs"; exit 4; }
cat "$OUT/preflight.txt"

# On the CPU the gpu-marked tests run too (eagerly, no graph captured): their logic is checked before a GPU sees it.
if [ "$DEVICE" = cpu ]; then export XVOCAB_TEST_DEVICE=cpu; fi
step gpu-tests 120 gpu_tests.txt python3 -m pytest -q -m gpu tests/test_cuda.py -p no:cacheprovider -s -rs
tail -5 "$OUT/gpu_tests.txt"
if [ "$DEVICE" = cpu ]; then  # a check of the script itself: the benchmark's code paths on two-layer shapes
  BENCH=(--device cpu --dtype float32 --small --tokens 8 --prompts 1 --reps 2) BENCH_LIMIT=400  # (a CPU is slower)
else
  BENCH=() BENCH_LIMIT=240  # (190 s cut the first H200 session before its second pair)
fi
step gpu-bench "$BENCH_LIMIT" gpu_bench.txt python3 -m experiments.gpu.bench --out "$OUT" "${BENCH[@]}"
cat "$OUT/gpu_bench.md" 2>/dev/null
log "session done"
