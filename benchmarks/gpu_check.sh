#!/bin/bash
# One call on a lent CUDA machine (issue 27): the CUDA-marked tests, then bench_scale on the
# GPU. Run from the repository root with the runtime wheels that machine lacks in .whl/
# (cffi, pycparser, lmdb, pygit2; docs/development.md) and mvc/_mvc_native.abi3.so carried.
#   bash benchmarks/gpu_check.sh [bench_scale args...]      (results under $OUT)
# MVC_GPU_TESTS: test paths (default: every test file with a CUDA-only test); MVC_GPU_BENCH=0 skips the benchmark;
# MVC_GPU_BACKGROUND=1 adds bench_background --device cuda (issue 27's background commit);
# MVC_GPU_TRITON=1 adds bench_scale --only first,next again with MVC_TRITON=1 (the batched
# assignment as one Triton kernel, mvc.quant.triton_assign), right after the first bench_scale,
# and bench_device_pipeline's --triton rows;
# MVC_GPU_WRITE=1 adds bench_write --threads 16 (the write phase on the host's 16 CPUs);
# MVC_GPU_PIPELINE=0 skips bench_device_pipeline (the batched device passes and whole commit
# hooks at 124M: syncs, launches, time and peak extra GPU memory against the state).
# MVC_GPU_TEST_K: a pytest -k expression (e.g. cuda: only the tests that need the device).
# MVC_GPU_BIG: bench_scale arguments of a last, larger run (e.g. "--params 1.3e9 --layers 48
# --only checkout,worst"), only after the first bench_scale passed, given whatever is left of
# MVC_GPU_DEADLINE (seconds from the start; each phase's timeout is capped by what is left, so
# a lease's one call ends with every phase's log under $OUT).
# MVC_GPU_DEVICE=cpu: the same phases on the host, to try this script where no GPU is (with
# small --params; MVC_GPU_BACKGROUND_ARGS for bench_background's, default "--epsilon 0.05").
# bench_scale's --warm (e.g. `gpu_check.sh --warm`: both bench_scale runs) measures each step in
# a process that trained, saved, committed and checked out a tiny model first, and prints those
# one-time costs (device kernels loaded on first launch, Triton compiles) on their own; the
# Triton kernels compiled so far (Triton's cache) are counted after each Triton phase.
set -u
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
DEADLINE=${MVC_GPU_DEADLINE:-1800}
left() {  # a phase's timeout: its own cap, or what is left before the deadline
  local rest=$((DEADLINE - SECONDS - 5))
  [ "$rest" -lt "$1" ] && echo $((rest > 1 ? rest : 1)) || echo "$1"
}
if ls .whl/*.whl >/dev/null 2>&1 && ! "${PYTHON:-python3}" -c "import cffi, lmdb, pygit2" 2>/dev/null; then
  "${PYTHON:-python3}" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
compiled() {  # kernels in Triton's on-disk cache (a compile adds one; a cache hit none)
  find "${TRITON_CACHE_DIR:-$HOME/.triton/cache}" -name "*.cubin" 2>/dev/null | wc -l
}
DEV=${MVC_GPU_DEVICE:-cuda}
PY=${PYTHON:-python3}
command -v nvidia-smi >/dev/null && nvidia-smi -L
"$PY" -c "import sys, torch; print(sys.version.split()[0], torch.__version__,
      torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device')"
df -h /tmp "$PWD" | tail -n +2; nproc; free -g | head -2
# Every test file with a CUDA-only test (its skip names torch.cuda.is_available()), found here
# rather than listed: a listed set missed new files twice.
TESTS=${MVC_GPU_TESTS:-$(grep -rlE "cuda\.is_available\(\)" tests --include="test_*.py" | sort | tr "\n" " ")}
echo "== CUDA tests"
# shellcheck disable=SC2086
XDIST=""
"$PY" -c "import xdist" 2>/dev/null && XDIST="-n 8"
# shellcheck disable=SC2086
timeout "$(left "${MVC_GPU_TEST_TIMEOUT:-240}")" "$PY" -m pytest -q -p no:cacheprovider \
  -p no:benchmark -W ignore $XDIST -rfEs --tb=short --junitxml="$OUT/junit.xml" \
  ${MVC_GPU_TEST_K:+-k "$MVC_GPU_TEST_K"} $TESTS > "$OUT/tests.log" 2>&1
echo "pytest rc $? at ${SECONDS}s"
grep -E "passed|failed|error" "$OUT/tests.log" | tail -3
grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20
if [ "${MVC_GPU_BENCH:-1}" != 0 ]; then
  echo "== bench_scale --device $DEV $*"
  timeout "$(left "${MVC_GPU_BENCH_TIMEOUT:-330}")" "$PY" benchmarks/bench_scale.py --device "$DEV" \
    --json "$@" > "$OUT/bench.log" 2>&1
  BENCH_RC=$?
  echo "bench rc $BENCH_RC at ${SECONDS}s"
  sed -n '/^bench_scale:/,/^{/p' "$OUT/bench.log"
  grep -E "^  [a-z_]+: " "$OUT/bench.log" | cut -c1-160
  grep -E '/ torch\.(save|load)"|peak extra GPU memory|write-phase seconds' "$OUT/bench.log"
fi
if [ "${MVC_GPU_TRITON:-0}" != 0 ] && [ "${BENCH_RC:-1}" = 0 ]; then
  echo "== MVC_TRITON=1 bench_scale --device $DEV --only first,next $*"
  MVC_TRITON=1 timeout "$(left "${MVC_GPU_BENCH_TIMEOUT:-330}")" "$PY" benchmarks/bench_scale.py \
    --device "$DEV" --json --only first,next "$@" > "$OUT/triton.log" 2>&1
  echo "triton bench rc $? at ${SECONDS}s; Triton kernels compiled: $(compiled)"
  grep -iE "triton.*fail" "$OUT/triton.log" | head -3
  sed -n '/^bench_scale:/,/^{/p' "$OUT/triton.log"
  grep -E '/ torch\.(save|load)"|peak extra GPU memory' "$OUT/triton.log"
fi
if [ "${MVC_GPU_PIPELINE:-1}" != 0 ]; then
  PIPE_TRITON=""
  [ "${MVC_GPU_TRITON:-0}" != 0 ] && PIPE_TRITON="--triton"
  echo "== bench_device_pipeline --device $DEV --params 124e6"
  timeout "$(left "${MVC_GPU_BENCH_TIMEOUT:-330}")" "$PY" benchmarks/bench_device_pipeline.py --device "$DEV" \
    --params 124e6 --json $PIPE_TRITON > "$OUT/pipeline.json" 2> "$OUT/pipeline.log"
  echo "pipeline rc $?; Triton kernels compiled: $(compiled)"
  "$PY" -c "import json,sys; r=json.load(open(sys.argv[1]))
for s, p in r['stages'].items():
    b = next(iter(p.values()))['seconds']
    for k, m in p.items(): print(s, k, m['syncs'], m.get('waits'), m['launches'], round(m['seconds'], 4), round(m['seconds'] / b, 2),
                                 'gpu peak', round((m['peak_extra_gpu'] or 0) / r['state_bytes'], 3))" \
    "$OUT/pipeline.json" 2>/dev/null || tail -5 "$OUT/pipeline.log"
fi
if [ "${MVC_GPU_BACKGROUND:-0}" != 0 ]; then
  echo "== bench_background --device $DEV ${MVC_GPU_BACKGROUND_ARGS:---epsilon 0.05}"
  # shellcheck disable=SC2086
  timeout "$(left "${MVC_GPU_BACKGROUND_TIMEOUT:-330}")" "$PY" benchmarks/bench_background.py --device "$DEV" \
    ${MVC_GPU_BACKGROUND_ARGS:---epsilon 0.05} > "$OUT/background.log" 2>&1
  echo "background rc $? at ${SECONDS}s"; tail -n 14 "$OUT/background.log"
fi
if [ "${MVC_GPU_WRITE:-0}" != 0 ]; then
  # the host's 16 CPUs: a write phase whose largest tensors change, alone across the pool
  # against one per thread (mvc.native.parallel.large_alone), with as many threads as the host has
  echo "== bench_write --threads 16"
  timeout "$(left "${MVC_GPU_BENCH_TIMEOUT:-330}")" "$PY" benchmarks/bench_write.py --threads 16 \
    > "$OUT/write.log" 2>&1
  echo "write rc $?"; sed -n '/^bench_write:/,/^$/p;/^| /p' "$OUT/write.log"
fi
if [ -n "${MVC_GPU_BIG:-}" ] && [ "${BENCH_RC:-1}" = 0 ]; then
  echo "== bench_scale --device $DEV $MVC_GPU_BIG"
  # shellcheck disable=SC2086
  timeout "$(left 3600)" "$PY" benchmarks/bench_scale.py --device "$DEV" --json $MVC_GPU_BIG \
    > "$OUT/big.log" 2>&1
  echo "big rc $? at ${SECONDS}s"
  sed -n '/^bench_scale:/,/^{/p' "$OUT/big.log"
  grep -E "^  [a-z_]+: " "$OUT/big.log" | cut -c1-160
  grep -E '/ torch\.(save|load)"|peak extra GPU memory' "$OUT/big.log"
fi
