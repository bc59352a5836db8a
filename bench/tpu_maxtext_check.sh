#!/usr/bin/env bash
# MaxText's mHC on a TPU VM image with its own JAX (Python 3.11, no registry): the set-up, `make
# parity-maxtext` as released and fixed, the suite's TPU baselines, and the speed table, from the
# checkout, in three parts that each fit a 10-minute device call (issue 54; docs/maxtext.md).
#
#   tools/tpu-wheels                               # here, where pip reaches a registry: .whl-tpu
#   bench/tpu_maxtext_check.sh run DIR     # on the TPU VM: set-up, the kernel-primitive probe, make
#                                          #   parity-maxtext SYSTEM_JAX=1 (every variant), its baseline
#   bench/tpu_maxtext_check.sh fixed DIR   # MAXTEXT=fixed, its baseline, the run gated against it
#   bench/tpu_maxtext_check.sh speed DIR   # the speed table (bench/device_speed.py)
#   bench/tpu_maxtext_check.sh leaves DIR  # one case's reference paths: their leaves on the chip
#                                          #   (bench/probes/leaves_dump.py, for bench/probes/cause_replay.py
#                                          #   here) and the harness's rows and report.json
#
# Each step's exit status and seconds go to DIR/steps.txt, its output to DIR/logs; the logs, the
# run folders' summaries and rows and the new baselines are packed into DIR/<part>.tgz. The
# environment (the image's index, the carried wheels) is bench/tpu_common.sh's.
set -uo pipefail
cd "$(dirname "$0")/.."
usage="usage: bench/tpu_maxtext_check.sh run|fixed|speed|leaves DIR"
part=${1:?$usage}
out=${2:?$usage}
source bench/tpu_common.sh

# The largest cases of the speed table: the maxtext suite's largest and the tpu suite's bfloat16
# ones (real sizes: no oracle is needed to time a program).
SPEED_CASES=("lite-n4-c1024-b1s256-*" "lite-n4-c1024-b4s2048-bf16-w32-mlp-default"
  "lite-n4-c2048-b2s1024-bf16-w32-identity-default" "lite-n4-c4096-b1s1024-bf16-wbf16-identity-default")
# The case whose chip rows named another cause than the host's (docs/results/maxtext-tpu-v5e.md).
LEAVES_CASE=${LEAVES_CASE:-lite-n4-c256-b8s64-bf16-w32-mlp-peaky_permutation-m8x1-bt64-btb32}

case $part in
  run)  # every variant: the released ones fail (exit 1)
    setup_or_exit
    # PROBE=0 leaves the probe out (19 s; measured: docs/results/kernel-primitives-tpu-v5e.json).
    # On a bare machine the set-up and the run take about the whole part (52 s and 518 s at
    # 5cb435f, the run's own gate last), so the baseline step needs a machine set up already.
    [ "${PROBE:-1}" = 0 ] || step kernel-primitives "$PY" bench/probes/tpu_kernel_primitive_probe.py --out "$out/kernel-primitives"
    step parity-maxtext make parity-maxtext SYSTEM_JAX=1 MAXTEXT_OUT=out/tpu-maxtext
    step baseline "$CLI" baseline --from out/tpu-maxtext --to baselines/tpu-v5e-maxtext.csv
    tar czf "$out/run.tgz" out/tpu-maxtext/summary.md out/tpu-maxtext/rows.csv out/tpu-maxtext/report.json \
      baselines/tpu-v5e-maxtext.csv "$out/logs" $([ -d "$out/kernel-primitives" ] && echo "$out/kernel-primitives")
    ;;
  fixed)  # the fixed variants (exit 0), their baseline, and the run gated against it
    setup_or_exit
    step parity-maxtext-fixed make parity-maxtext SYSTEM_JAX=1 MAXTEXT=fixed MAXTEXT_OUT=out/tpu-maxtext-fixed
    step baseline-fixed "$CLI" baseline --from out/tpu-maxtext-fixed --to baselines/tpu-v5e-maxtext-fixed.csv
    step gate-fixed "$CLI" gate --baseline baselines/tpu-v5e-maxtext-fixed.csv --current out/tpu-maxtext-fixed
    tar czf "$out/fixed.tgz" out/tpu-maxtext-fixed/summary.md out/tpu-maxtext-fixed/rows.csv \
      baselines/tpu-v5e-maxtext-fixed.csv "$out/logs"
    ;;
  speed)  # this project's kernels, the XLA reference and MaxText's, side by side
    setup_or_exit
    step speed "$PY" bench/device_speed.py --suite maxtext tpu --impl mhc_parity.maxtext_parity:implementations \
      --paths reference mosaic 'maxtext-*' --cases "${SPEED_CASES[@]}" --runs 20 --out "$out/speed"
    tar czf "$out/speed.tgz" "$out/speed" "$out/logs"
    ;;
  leaves)  # one case's reference paths on the chip: leaves, compiled HLO, rows and causes
    setup_or_exit
    step leaves "$PY" bench/probes/leaves_dump.py --cases "$LEAVES_CASE" --impl mhc_parity.maxtext_parity:implementations \
      --paths reference 'maxtext-layer-reference*' --out "$out/leaves"
    step leaves-run "$CLI" run --suite maxtext --cases "$LEAVES_CASE" --impl mhc_parity.maxtext_parity:implementations \
      --paths 'reference/*' 'maxtext-layer-reference*' --out out/tpu-leaves --quiet --no-lowering
    tar czf "$out/leaves.tgz" "$out/leaves" out/tpu-leaves/summary.md out/tpu-leaves/rows.csv \
      out/tpu-leaves/report.json "$out/logs"
    ;;
  *)
    echo "bench/tpu_maxtext_check.sh: unknown part '$part' (run, fixed, speed or leaves)" >&2
    exit 2
    ;;
esac
