#!/usr/bin/env bash
# The `tpu` suite's numbers on a TPU VM image with its own JAX (issue 55), from the checkout, in
# shards that each fit a 10-minute device call (carry .whl-tpu, made by tools/tpu-wheels, as for
# bench/tpu_maxtext_check.sh), then merged and made the suite's TPU baseline:
#
#   bench/tpu_suite_check.sh shard K N DIR  # on the TPU VM: set-up, then shard K of N of
#                                           #   `mhc-parity run --suite tpu` into out/tpu-suite-K,
#                                           #   the whole run folder packed into DIR/shard-K.tgz
#   bench/tpu_suite_check.sh shards 'K ...' N DIR  # on the TPU VM: those shards in one call, each
#                                           #   given what is left of it, the logs packed in
#                                           #   DIR/logs.tgz (FRESH=1: drop a run folder of older code;
#                                           #   GATE=1: each run gated against BASELINE, its own cases)
#   bench/tpu_suite_check.sh child DIR      # on the TPU VM: does the oracle's own process start
#                                           #   there while a process holds the chip? Its imports
#                                           #   (-X importtime; a traceback if still importing after
#                                           #   45 s) with the chip held and not, then a small case's
#                                           #   run (which holds the chip) with its oracle in a
#                                           #   process of its own (MHC_PARITY_ORACLE_PROCESS=always)
#   bench/tpu_suite_check.sh accounting DIR # on the TPU VM: the oracle's time, page faults and memory
#                                           #   under each of bench/probes/oracle_memory_accounting.py's
#                                           #   VARIANTS (glibc's settings), TOKENS tokens
#   bench/tpu_suite_check.sh merge DIR      # where the shards' packs are (DIR/shard-*.tgz): unpack
#                                           #   them in DIR/unpacked, merge into out/tpu-suite
#                                           #   (MERGED), write its baseline baselines/tpu-v5e-tpu.csv
#                                           #   (BASELINE), gate the merged run against it, write its
#                                           #   Speed section's speed-tpu.csv/.md/.svg (bench/speed_run.py);
#                                           #   packed into DIR/merge.tgz
#
# N = 8 (a case a shard) is the plan of docs/accelerators.md ("The tpu suite on the chip"). A
# shard cut by the part's budget (PART_BUDGET_S, bench/tpu_common.sh) is packed as far as it got;
# run the same shard again on the same machine (its out/ and cache kept between calls) and it
# resumes: its finished cases and oracle answers are not computed again. The lowering and compile
# rows (checked on any host with libtpu) are left out unless LOWERING=1: single-threaded they cost
# about 100 s a case on the chip. Where MaxText is installed, its fixed kernels run beside this
# project's paths (MAXTEXT_PATHS). Merge on any machine with the project installed (its Speed step
# lowers each case's reference program with the project's JAX, for the FLOPs).
# docs/results/tpu-suite-tpu-v5e.md has what ran, and the memory it took.
# Each step's exit status and seconds go to DIR/steps.txt, its output to DIR/logs.
set -uo pipefail
cd "$(dirname "$0")/.."
usage="usage: bench/tpu_suite_check.sh shard K N DIR | shards 'K ...' N DIR | child DIR | accounting DIR | merge DIR"
part=${1:?$usage}
BASELINE=${BASELINE:-baselines/tpu-v5e-tpu.csv}
MAXTEXT_PATHS=${MAXTEXT_PATHS:-"maxtext-layer-reference-fixed/* maxtext-layer-kernel-fixed/* maxtext-kernel-fwd-fixed/*"}
MERGED=${MERGED:-out/tpu-suite}

case $part in
  shard)
    k=${2:?$usage}
    n=${3:?$usage}
    out=${4:?$usage}
    source bench/tpu_common.sh
    run=out/tpu-suite-$k
    lowering=(--no-lowering)
    [ "${LOWERING:-0}" = 1 ] && lowering=()
    setup_or_exit
    resume=()
    # An earlier call's run of other code is refused by --resume: FRESH=1 drops it first.
    [ "${FRESH:-0}" = 1 ] && rm -rf "$run"
    # An earlier call's unfinished shard (same request): continue it.
    [ -f "$run/manifest.json" ] && resume=(--resume)
    # The committed baseline judges a later code's shard, its own cases only (exit 1 on a failed gate).
    gate=()
    [ "${GATE:-0}" = 1 ] && gate=(--baseline "$BASELINE")
    # MaxText's fixed layer and kernels beside this project's (the Speed section's third column;
    # the released ones raise UnexpectedTracerError: docs/results/maxtext-tpu-v5e.md), where
    # installed. Every implementation loaded must be compared (a run that compares nothing of one
    # exits 2), so MAXTEXT_PATHS names each of `:fixed`'s three, or MAXTEXT_PATHS= leaves them out.
    maxtext=() maxtext_paths=()
    if [ -n "$MAXTEXT_PATHS" ] && "$PY" -c "import maxtext" 2>/dev/null; then
      maxtext=(--impl mhc_parity.maxtext_parity:fixed)
      read -ra maxtext_paths <<<"$MAXTEXT_PATHS"  # split on spaces, the globs kept for --paths
    fi
    step "shard-$k" "$CLI" run --suite tpu --shard "$k/$n" --out "$run" --jobs 1 --quiet "${lowering[@]}" "${resume[@]}" \
      "${gate[@]}" "${maxtext[@]}" --paths 'reference/*' 'interpret/*' 'mosaic/*' "${maxtext_paths[@]}"
    free -g >"$out/logs/memory-after-shard-$k.txt" 2>&1
    tar czf "$out/shard-$k.tgz" "$run" "$out/logs" "$out/steps.txt"
    ;;
  shards)  # those shards one after another in one call, each given what is left of the call's
    # PART_BUDGET_S (none started with a minute or less left); every log then packed into
    # DIR/logs.tgz, so that no more than 8 files come back
    ks=${2:?$usage}
    n=${3:?$usage}
    out=${4:?$usage}
    budget=${PART_BUDGET_S:-570}
    mkdir -p "$out/logs"
    for k in $ks; do
      left=$((budget - SECONDS))
      if [ "$left" -le 60 ]; then
        echo "shard-$k: not started, ${left} s left of the call's ${budget}" >>"$out/steps.txt"
        continue
      fi
      PART_BUDGET_S=$left bash bench/tpu_suite_check.sh shard "$k" "$n" "$out"
    done
    tar czf "$out/logs.tgz" -C "$out" logs steps.txt && rm -rf "$out/logs"
    ;;
  child)  # on 2026-12-06 it showed the oracle's own process starting and computing beside the chip
    out=${2:?$usage}
    source bench/tpu_common.sh
    setup_or_exit
    child_import=(env JAX_PLATFORMS=cpu PYTHONFAULTHANDLER=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
      timeout -s ABRT 45 "$PY" -X importtime -c "import mhc_parity.harness.engine.oracle_process; print('imported')")
    "$PY" -c "import jax, time; print('holding', jax.devices(), flush=True); time.sleep(120)" >"$out/logs/holder.log" 2>&1 &
    holder=$!
    sleep 20  # the chip opened (6 to 11 s after a start: the device README's KINDS.md)
    step child-import-chip-held "${child_import[@]}"
    kill "$holder"
    wait "$holder"
    step child-import-chip-free "${child_import[@]}"
    # Every 5 s while the run goes: each process's state, resident memory and where it waits.
    (while sleep 5; do echo "--- $((SECONDS - PART_START)) s"; ps -eo pid,ppid,rss,stat,wchan:24,args | cut -c1-200
    done >"$out/logs/child-run-processes.log") &
    watcher=$!
    step child-run env MHC_PARITY_ORACLE_PROCESS=always PYTHONFAULTHANDLER=1 timeout 150 "$CLI" run \
      --cases lite-n4-c96-b2s64-f32-w32-identity-default --paths 'reference/*' --no-lowering --out out/child-probe
    kill "$watcher"
    grep -h "host memory" out/child-probe/summary.md >>"$out/steps.txt" 2>&1  # where its oracle ran
    tar czf "$out/child.tgz" "$out/logs" "$out/steps.txt"
    ;;
  accounting)  # bench/probes/oracle_memory_accounting.py's VARIANTS (default: one chunk at a time, plain,
    # glibc keeping what it frees, huge pages; two at once keeping) on TOKENS tokens, and glibc's version
    out=${2:?$usage}
    source bench/tpu_common.sh
    setup_or_exit
    "$PY" -c 'import platform; print("glibc", *platform.libc_ver())' >>"$out/steps.txt"
    read -ra variants <<<"${VARIANTS:-child-one child-one-malloc child-one-huge child-malloc}"
    step accounting "$PY" bench/probes/oracle_memory_accounting.py --seconds 100 --tokens "${TOKENS:-768}" "${variants[@]}"
    ;;
  merge)
    out=${2:?$usage}
    caller_cli=${CLI:-} caller_py=${PY:-}
    PART_BUDGET_S=${PART_BUDGET_S:-86400}  # not a device call: no 10-minute bound
    source bench/tpu_common.sh
    CLI=${caller_cli:-.venv/bin/mhc-parity}
    [ -x "$CLI" ] || CLI=.venv-system/bin/mhc-parity
    PY=${caller_py:-.venv/bin/python}  # the project's: the Speed plot is drawn with its matplotlib
    [ -x "$PY" ] || PY=.venv-system/bin/python
    shards=()
    unpacked=$out/unpacked
    rm -rf "$unpacked" "$MERGED"
    mkdir -p "$unpacked"
    shopt -s nullglob
    for pack in "$out"/shard-*.tgz; do  # each pack's own run folder, unpacked beside the packs
      folder=$(tar tzf "$pack" | grep -o '^out/tpu-suite-[0-9]*/' | sort -u | head -n 1)
      [ -n "$folder" ] || { echo "$pack holds no out/tpu-suite-K folder" >&2; exit 2; }
      tar xzf "$pack" -C "$unpacked" "$folder" || exit 2
      shards+=("$unpacked/${folder%/}")
    done
    [ ${#shards[@]} -gt 0 ] || { echo "no $out/shard-*.tgz to merge" >&2; exit 2; }
    step merge "$CLI" merge "$MERGED" "${shards[@]}" || { cat "$out/logs/merge.log"; exit 2; }
    # The rows were made on the TPU image, by its JAX, libtpu and MaxText, and `merge` checked that
    # every shard's code digest is one. This checkout's digest covers its own environment too, so
    # off the image it always differs: the baseline and its gate take the run's code as it is.
    step baseline "$CLI" baseline --from "$MERGED" --to "$BASELINE" --allow-code-change
    step gate "$CLI" gate --baseline "$BASELINE" --current "$MERGED" --allow-code-change
    step speed "$PY" bench/speed_run.py --from "$MERGED" --suite tpu --out "$out"
    packed=("$MERGED/summary.md" "$MERGED/rows.csv" "$BASELINE" "$out/speed-tpu.csv" "$out/speed-tpu.md" "$out/logs")
    [ -f "$out/speed-tpu.svg" ] && packed+=("$out/speed-tpu.svg")  # the plot: programs that ran on a chip
    tar czf "$out/merge.tgz" "${packed[@]}"
    ;;
  *)
    echo "bench/tpu_suite_check.sh: unknown part '$part' ($usage)" >&2
    exit 2
    ;;
esac
