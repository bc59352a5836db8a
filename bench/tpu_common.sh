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

# The host memory a step may leave free before the guard stops it (MiB of MemAvailable): a device
# machine whose memory runs out is taken back with everything on it, the results too.
MEM_FLOOR_MB=${MEM_FLOOR_MB:-3072}

guard_memory() {  # guard_memory PID NAME: log the host's memory every 3 s; below the floor, stop the
  local group=$1 name=$2 available  # process group PID leads (setsid), its children with it
  while kill -0 "$group" 2>/dev/null; do
    available=$(awk '/^MemAvailable:/ {print int($2 / 1024)}' /proc/meminfo)
    echo "$((SECONDS - PART_START)) s: available ${available} MiB; largest: $(ps -eo rss=,pid=,comm= --sort=-rss |
      head -n 5 | awk '{printf "%s[%s] %d MiB, ", $3, $2, $1 / 1024}')" >>"$out/logs/memory-$name.log"
    if [ "$available" -lt "$MEM_FLOOR_MB" ]; then
      echo "$name: stopped by the memory guard, ${available} MiB available < ${MEM_FLOOR_MB}" | tee -a "$out/steps.txt"
      kill -TERM -- "-$group" 2>/dev/null
      sleep 5
      kill -KILL -- "-$group" 2>/dev/null
    fi
    sleep 3
  done
}

step() {  # step NAME COMMAND...: its output in DIR/logs/NAME.log, one line in DIR/steps.txt
  local name=$1 start=$SECONDS rc group guard left=$((PART_BUDGET_S - (SECONDS - PART_START)))
  shift
  if [ "$left" -le 0 ]; then
    echo "$name: not run, the part's ${PART_BUDGET_S} s are spent: $*" | tee -a "$out/steps.txt"
    return 124
  fi
  # A process group of its own, so that the guard stops the step's children (oracle processes) too.
  setsid timeout --kill-after=5 "$left" "$@" >"$out/logs/$name.log" 2>&1 &
  group=$!
  guard_memory "$group" "$name" &
  guard=$!
  wait "$group"
  rc=$?
  kill "$guard" 2>/dev/null
  kill -KILL -- "-$group" 2>/dev/null  # what the step left running (a killed run's oracle processes)
  echo "$name: exit $rc in $((SECONDS - start)) s: $*" | tee -a "$out/steps.txt"
  return $rc
}

setup_or_exit() {  # make setup SYSTEM_JAX=1 (quick where .venv-system is already current)
  step setup make setup SYSTEM_JAX=1 || { tail -30 "$out/logs/setup.log"; exit 2; }
}
