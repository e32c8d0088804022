#!/bin/bash
# One device window (issue 27): the environment, the CUDA tests on the hardware, the
# bits at scale (sim/gpu_bits.py) beside them, then the CUDA bench.  Run from the
# repository root on the GPU machine; logs go to $OUT (default out/gpu).
# T_TESTS, T_BITS, T_BENCH: seconds for each part.
set -u
OUT=${OUT:-out/gpu}; mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
{ date -u; nvidia-smi; nproc; $PY -c "import sys; print(sys.version)"
  $PY -m pip list 2>/dev/null | grep -i -E "^(numba|numba-cuda|torch|numpy|ml.dtypes|pytest|pytest-xdist) "
} > "$OUT/env.txt" 2>&1
( PAMSIM_CUDA_HARDWARE=1 NUMBA_NUM_THREADS=2 timeout "${T_TESTS:-240}" $PY -m pytest -v -rfE \
    -p no:cacheprovider -n "${WORKERS:-8}" --dist load -k "${TESTS_K:-not nothing}" \
    tests/test_cuda_sim.py tests/test_torch_cuda.py tests/test_memory_cuda.py \
    > "$OUT/tests.log" 2>&1; echo "tests exit $?" >> "$OUT/tests.log" ) &
( NUMBA_NUM_THREADS=${BITS_THREADS:-6} timeout "${T_BITS:-240}" $PY -m sim.gpu_bits --out "$OUT" \
    --deadline $(( ${T_BITS:-240} - 25 )) ${BITS_ARGS:-} > "$OUT/bits.log" 2>&1
  echo "bits exit $?" >> "$OUT/bits.log" ) &
wait
timeout "${T_BENCH:-100}" $PY -m sim.cli bench --device cuda > "$OUT/bench.log" 2>&1
echo "bench exit $?" >> "$OUT/bench.log"
grep -E "^(NVIDIA|\| )" "$OUT/env.txt" | head -4
echo "tests: $(grep -c ' PASSED' "$OUT/tests.log") passed, $(grep -c -E ' (FAILED|ERROR)' "$OUT/tests.log") failed/error so far"
tail -2 "$OUT/tests.log"
grep -E " (FAILED|ERROR) " "$OUT/tests.log" | sed 's/^\[gw[0-9]*\] *\[ *[0-9]*%\] *//' | head -40
cat "$OUT/bits.log" | tail -25
grep -v '"ok"' "$OUT/bits.jsonl" | grep -v '"refused"' | grep -v "device refuses" | head -20
tail -25 "$OUT/bench.log"
# exit status: 0 only when the tests and the bits both passed and the bench ran
grep -q "tests exit 0" "$OUT/tests.log" && grep -q "bits exit 0" "$OUT/bits.log" \
    && grep -q "bench exit 0" "$OUT/bench.log"
