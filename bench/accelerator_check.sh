#!/usr/bin/env bash
# One check of mhc-parity on a TPU VM or an NVIDIA GPU machine, from a fresh clone.
#
#   bench/accelerator_check.sh            # detects the accelerator and installs its extra
#   EXTRAS=tpu bench/accelerator_check.sh # or name it (tpu | cuda | cuda13; "" for none)
#   bench/accelerator_check.sh --print-extra   # only print the extra it would install
#   SYSTEM_JAX=1 bench/accelerator_check.sh    # a TPU VM image's own jax, jaxlib and libtpu
#
# Steps: install .venv with the accelerator's extra (make setup EXTRAS=...; with SYSTEM_JAX=1,
# .venv-system on the machine's own JAX: make setup SYSTEM_JAX=1); report what
# JAX sees; run the smoke suite through every path (reference, interpret, mosaic on a
# TPU; the oracle on the host CPU; one- and multi-block cases of each dtype and the epsilon-
# and gate-stressing init families, docs/running.md "The quick check" says what it cannot
# see); run the hardware-marked tests (tests/test_hardware.py:
# Mosaic-compiled kernels on a TPU, interpret kernels on a GPU, against the reference)
# with the explicit-precision audit and the host-placement tests; print one summary line
# per path and a final PASS/FAIL line. Each step has a time limit so the whole check
# stays under 8 minutes once the packages are installed.
#
# Without an accelerator it says so, still runs the precision audit and the hardware
# tests (which skip, with their reason), and exits 0: `make parity` covers the CPU.
# Exit: 0 pass, 1 a check failed, 2 set-up failed, 3 the extra does not match the backend.
set -uo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-out/accelerator-check}
SUITE=${SUITE:-smoke}
SUITE_TIMEOUT=${SUITE_TIMEOUT:-300}
TESTS_TIMEOUT=${TESTS_TIMEOUT:-240}
SYSTEM_JAX=${SYSTEM_JAX:-}
VENV=$(make -s --no-print-directory print-venv SYSTEM_JAX="$SYSTEM_JAX" EXTRAS=) || exit 2
PY=$VENV/bin/python
# The documented command line (the console script `make setup` installs).
CLI=$VENV/bin/mhc-parity
START=$SECONDS
mkdir -p "$OUT"

detect_extra() {
  if [ -n "${EXTRAS+set}" ]; then echo "$EXTRAS"; return; fi
  # TPU VMs expose their chips as /dev/accel* (v2-v4) or VFIO groups (v5e and later).
  if compgen -G "/dev/accel*" >/dev/null || compgen -G "/dev/vfio/[0-9]*" >/dev/null \
     || [ -n "${TPU_ACCELERATOR_TYPE:-}" ]; then
    echo tpu
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    # The driver's CUDA version (nvidia-smi's header) picks JAX's CUDA 13 or CUDA 12 plugin.
    cuda_major=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\).*/\1/p' | head -n 1)
    if [ "${cuda_major:-0}" -ge 13 ]; then echo cuda13; else echo cuda; fi
  fi
}

EXTRA=$(detect_extra)
if [ "${1:-}" = --print-extra ]; then echo "$EXTRA"; exit 0; fi
if [ "$SYSTEM_JAX" = 1 ]; then
  # The machine's JAX brings its own plugin: the extra only names the backend expected.
  echo "accelerator check: the machine's own JAX (SYSTEM_JAX=1), expecting '${EXTRA:-none}' (set EXTRAS= to override)"
  SETUP=(make setup SYSTEM_JAX=1 EXTRAS=)
else
  echo "accelerator check: extra '${EXTRA:-none}' (set EXTRAS= to override)"
  SETUP=(make setup EXTRAS="$EXTRA")
fi
if ! "${SETUP[@]}" >"$OUT/setup.log" 2>&1; then
  tail -n 20 "$OUT/setup.log"
  echo "accelerator check: FAIL: ${SETUP[*]} failed (log: $OUT/setup.log)"
  if [ "$SYSTEM_JAX" != 1 ] && python3 -c 'import jax' >/dev/null 2>&1; then
    echo "python3 has its own jax: SYSTEM_JAX=1 bench/accelerator_check.sh uses it (docs/accelerators.md)"
  fi
  exit 2
fi
"$PY" bench/accelerator_report.py probe "$EXTRA"
probe=$?
if [ "$probe" -ne 0 ]; then
  echo "accelerator check: FAIL: backend does not match the installed extra"
  exit "$probe"
fi
BACKEND=$("$PY" -c 'from mhc_parity.harness.env import ensure_host_devices; ensure_host_devices(); import jax; print(jax.default_backend())')

status=0
TESTS=(tests/test_matmul_precision.py tests/test_host_placement.py tests/test_hardware.py)
if [ "$BACKEND" = cpu ]; then
  echo "no accelerator: JAX's default backend is cpu; the smoke suite is not run here (make parity covers the CPU)"
  echo "still checked: explicit matmul precision (jaxpr audit) and that the tpu/gpu tests skip with their reason"
  TESTS=(tests/test_matmul_precision.py tests/test_hardware.py)
else
  if timeout "$SUITE_TIMEOUT" "$CLI" run --suite "$SUITE" --out "$OUT/$SUITE" --quiet \
       >"$OUT/suite.log" 2>&1; then
    echo "smoke suite: pass"
  else
    code=$?
    [ "$code" -eq 124 ] && echo "smoke suite: FAIL (over ${SUITE_TIMEOUT}s)" || echo "smoke suite: FAIL (exit $code; log: $OUT/suite.log)"
    status=1
  fi
  if [ -f "$OUT/$SUITE/rows.jsonl" ] || [ -f "$OUT/$SUITE/report.json" ]; then
    "$PY" bench/accelerator_report.py paths "$OUT/$SUITE" || status=1
  fi
fi

if timeout "$TESTS_TIMEOUT" "$PY" -m pytest -q -rs -p no:cacheprovider "${TESTS[@]}" >"$OUT/tests.log" 2>&1; then
  echo "tests: $(tail -n 1 "$OUT/tests.log")"
else
  code=$?
  [ "$code" -eq 124 ] && echo "tests: FAIL (over ${TESTS_TIMEOUT}s)" || echo "tests: FAIL: $(tail -n 1 "$OUT/tests.log") (log: $OUT/tests.log)"
  status=1
fi
grep -E "^SKIPPED .*test_hardware" "$OUT/tests.log" | sed -E 's/^SKIPPED \[[0-9]+\] /skipped: /' | sort -u

verdict=PASS
[ "$status" -ne 0 ] && verdict=FAIL
echo "accelerator check: $verdict on $BACKEND in $((SECONDS - START)) s (logs in $OUT)"
exit "$status"
