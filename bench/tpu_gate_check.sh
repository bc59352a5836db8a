#!/usr/bin/env bash
# The gate's chip checks on a TPU VM image with its own JAX (issue 56), from the checkout, each
# part one 10-minute device call (carry .whl-tpu, made by tools/tpu-wheels, as for
# bench/tpu_maxtext_check.sh):
#
#   bench/tpu_gate_check.sh smoke DIR    # the quick check's teeth: the smoke suite kills a kernel
#                                        #   fault that errs only after the first token block, in
#                                        #   both dtypes; the smoke suite passes unchanged code
#   bench/tpu_gate_check.sh default DIR  # the default suite judged against baselines/tpu-v5e.csv
#                                        #   (expect PASS), written as that baseline again (this
#                                        #   baseline format), and gated against the new one
#   bench/tpu_gate_check.sh make DIR     # the README's commands as a newcomer types them: make setup
#                                        #   SYSTEM_JAX=1, make parity SYSTEM_JAX=1 (gated against
#                                        #   baselines/tpu-v5e.csv on a TPU host); REBASE=1: that
#                                        #   baseline written again from the run (after a policy
#                                        #   change, which the gate refuses), then make gate;
#                                        #   AGAIN=1: make parity once more, its stores warm (the
#                                        #   second run after an edit); each run's report.json kept
#                                        #   (its metadata: where the seconds went)
#   DTYPE=bfloat16|float32 bench/tpu_gate_check.sh faults DIR
#                                        # the smoke suite's kill matrix in that dtype, written as
#                                        #   docs/results/kill-matrix-tpu-v5e-DTYPE.md (own cause and
#                                        #   wrong-cause rows per fault, as make faults on the CPU)
#   DTYPE=... FAULTS=GLOB bench/tpu_gate_check.sh causes DIR
#                                        # the same, those faults only, with every failing leaf's
#                                        #   attribution scores kept (bench/probes/cause_diagnosis.py) in
#                                        #   DIR/causes-DTYPE.jsonl: why the chip names what it names
#
# Each step's exit status and seconds go to DIR/steps.txt, its output to DIR/logs; the logs and
# the runs' summaries, rows and the new baseline are packed into DIR/<part>.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
usage="usage: bench/tpu_gate_check.sh smoke|default|make|faults|causes DIR"
part=${1:?$usage}
out=${2:?$usage}
source bench/tpu_common.sh

case $part in
  smoke)
    setup_or_exit
    step smoke-fault "$CLI" faults --suite smoke --faults kernel.accumulators_reset_every_block --jobs 1 \
      --out out/tpu-smoke-fault --quiet
    step smoke "$CLI" run --suite smoke --out out/tpu-smoke --jobs 1 --quiet
    tar czf "$out/smoke.tgz" out/tpu-smoke-fault out/tpu-smoke/summary.md out/tpu-smoke/rows.csv "$out/logs"
    ;;
  default)
    setup_or_exit
    step default "$CLI" run --suite default --out out/tpu --jobs 1 --quiet --baseline baselines/tpu-v5e.csv
    step baseline "$CLI" baseline --from out/tpu --to baselines/tpu-v5e.csv
    step gate "$CLI" gate --baseline baselines/tpu-v5e.csv --current out/tpu
    tar czf "$out/default.tgz" out/tpu/summary.md out/tpu/rows.csv baselines/tpu-v5e.csv "$out/logs"
    ;;
  make)
    setup_or_exit
    step parity make parity SYSTEM_JAX=1
    cp out/parity/report.json "$out/report-parity.json"
    if [ "${REBASE:-0}" = 1 ]; then
      step baseline "$CLI" baseline --from out/parity --to baselines/tpu-v5e.csv
      step gate make gate SYSTEM_JAX=1
    fi
    if [ "${AGAIN:-0}" = 1 ]; then
      step parity-again make parity SYSTEM_JAX=1
      cp out/parity/report.json "$out/report-parity-again.json"
    fi
    tar czf "$out/make.tgz" out/parity/summary.md out/parity/rows.csv baselines/tpu-v5e.csv "$out"/report-parity*.json "$out/logs"
    ;;
  faults)
    dtype=${DTYPE:?DTYPE=bfloat16 or DTYPE=float32}
    results=docs/results/kill-matrix-tpu-v5e-$dtype.md
    setup_or_exit
    step "faults-$dtype" "$CLI" faults --suite smoke --dtype "$dtype" --jobs 1 --out "out/faults-$dtype" \
      --quiet --results "$results"
    # perturbed_rows.csv: each failing row's cause, to read the chip's wrong causes row by row
    tar czf "$out/faults-$dtype.tgz" "$results" "out/faults-$dtype"/{kill_matrix.csv,kill_matrix.json,perturbed_rows.csv} \
      "$out/logs"
    ;;
  causes)
    dtype=${DTYPE:?DTYPE=bfloat16 or DTYPE=float32}
    setup_or_exit
    step "causes-$dtype" "$PY" bench/probes/cause_diagnosis.py --to "$out/causes-$dtype.jsonl" faults --suite smoke \
      --dtype "$dtype" --faults "${FAULTS:?FAULTS=a glob of fault names}" --jobs 1 --out "out/causes-$dtype" --quiet
    tar czf "$out/causes-$dtype.tgz" "out/causes-$dtype"/{kill_matrix.md,perturbed_rows.csv} "$out/logs"
    ;;
  *)
    echo "bench/tpu_gate_check.sh: unknown part '$part' (smoke, default, make, faults or causes)" >&2
    exit 2
    ;;
esac
