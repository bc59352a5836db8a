# Sourced by the bench/tpu_*_check.sh scripts: the environment of a TPU VM image with its own JAX and
# no registry, and the step runner. Needs `out` (the results folder) set before it is sourced.
# PART_BUDGET_S (default 570) bounds a whole part: each step gets what is left of it, so a part
# always packs its results inside a 10-minute device call, even when a step runs out of time.
# The image's index is file:///opt/pypi/simple (PIP_INDEX_URL); the carried wheels are .whl-tpu
# (tools/tpu-wheels), which join the image's own PIP_FIND_LINKS, with their versions as constraints.
mkdir -p "$out/logs"
export PIP_INDEX_URL=${PIP_INDEX_URL:-file:///opt/pypi/simple}
export PIP_FIND_LINKS="$PWD/.whl-tpu${PIP_FIND_LINKS:+ $PIP_FIND_LINKS}"
export PIP_CONSTRAINT="$PWD/.whl-tpu/constraints.txt${PIP_CONSTRAINT:+ $PIP_CONSTRAINT}"
export PYTHONUNBUFFERED=1
CLI=.venv-system/bin/mhc-parity
PY=.venv-system/bin/python

PART_BUDGET_S=${PART_BUDGET_S:-570}
PART_START=$SECONDS

step() {  # step NAME COMMAND...: its output in DIR/logs/NAME.log, one line in DIR/steps.txt
  local name=$1 start=$SECONDS rc left=$((PART_BUDGET_S - (SECONDS - PART_START)))
  shift
  if [ "$left" -le 0 ]; then
    echo "$name: not run, the part's ${PART_BUDGET_S} s are spent: $*" | tee -a "$out/steps.txt"
    return 124
  fi
  timeout --kill-after=5 "$left" "$@" >"$out/logs/$name.log" 2>&1
  rc=$?
  echo "$name: exit $rc in $((SECONDS - start)) s: $*" | tee -a "$out/steps.txt"
  return $rc
}

setup_or_exit() {  # make setup SYSTEM_JAX=1 (quick where .venv-system is already current)
  step setup make setup SYSTEM_JAX=1 || { tail -30 "$out/logs/setup.log"; exit 2; }
}
