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

# The machine's memory: the lent TPU VM shows 45 GiB in /proc/meminfo and allows 40 GiB (the
# device tool's README, DEVICE_MEMORY). A device machine whose memory runs out is taken back with
# everything on it, the results too: the guard stops a step whose processes leave less than
# MEM_FLOOR_MB of that limit. The harness (its oracle processes' admission, chunks in flight and
# refusals: mhc_parity/harness/processes/worker_processes.py) is told 8 GiB less: the chip's
# runtime maps about that much into the run's process (resident 13.7 GB with 5.4 GB in use by
# MemAvailable, 10 s into a run on 2026-12-06), which its MemAvailable-based figure leaves out.
DEVICE_MEMORY=${DEVICE_MEMORY:-40G}
export MHC_PARITY_MEMORY_LIMIT=${MHC_PARITY_MEMORY_LIMIT:-32G}
MEM_LIMIT_MB=$(($(numfmt --from=iec "$DEVICE_MEMORY") / 2**20))
MEM_FLOOR_MB=${MEM_FLOOR_MB:-3072}

guard_memory() {  # guard_memory PID NAME: log the memory in use every second; near the limit, stop
  local group=$1 name=$2 used resident processes  # the process group PID leads (setsid), its children too
  while kill -0 "$group" 2>/dev/null; do
    used=$(awk '/^MemTotal:/ {t = $2} /^MemAvailable:/ {a = $2} END {print int((t - a) / 1024)}' /proc/meminfo)
    # The processes' resident memory too: on the TPU VM it holds 8 GiB the chip's runtime maps,
    # which MemAvailable leaves out and the machine's limit may count. The larger decides.
    processes=$(ps -eo rss=,pid=,pcpu=,comm= --sort=-rss)  # pcpu: the cores it used, on average since it began
    resident=$(awk '{s += $1} END {print int(s / 1024)}' <<<"$processes")
    echo "$((SECONDS - PART_START)) s: in use ${used} MiB, resident ${resident} MiB, of ${MEM_LIMIT_MB}; largest:" \
      "$(head -n 4 <<<"$processes" | awk '{printf "%s[%s] %d MiB %s%% cpu, ", $4, $2, $1 / 1024, $3}')" >>"$out/logs/memory-$name.log"
    [ "$resident" -gt "$used" ] && used=$resident
    if [ "$used" -gt $((MEM_LIMIT_MB - MEM_FLOOR_MB)) ]; then
      echo "$name: stopped by the memory guard, ${used} MiB in use of ${MEM_LIMIT_MB}" | tee -a "$out/steps.txt"
      kill -TERM -- "-$group" 2>/dev/null
      sleep 3
      kill -KILL -- "-$group" 2>/dev/null
    fi
    sleep 1
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
