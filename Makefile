# The two commands a user needs are `make parity` and `make test`; both bootstrap .venv. After a
# kernel edit, `make smoke`: the smoke suite gated on the default baseline's rows of its cases.
# On an accelerator add its extra: `make parity EXTRAS=tpu` (TPU VM), EXTRAS=cuda or cuda13 (NVIDIA
# GPU: the CUDA 12 or CUDA 13 plugin of JAX).
# On a machine that brings its own JAX (a TPU VM image, perhaps without a registry): SYSTEM_JAX=1,
# a venv of its python3 (PYTHON=... to name another) that sees its jax, jaxlib and libtpu, with
# the rest installed from whatever index pip is configured with (tools/install_on_own_jax.py).
SYSTEM_JAX ?=
ifneq ($(filter-out 0 1,$(SYSTEM_JAX)),)
$(error SYSTEM_JAX must be empty, 0 or 1, got '$(SYSTEM_JAX)')
endif
ifeq ($(SYSTEM_JAX),1)
VENV   := .venv-system
else
VENV   := .venv
endif
PY     := $(VENV)/bin/python
# The documented command line: the console script the install puts in the venv (the exit codes
# README.md lists are its own; `$(PY) -m mhc_parity.harness` is the same program).
MHC_PARITY := $(VENV)/bin/mhc-parity
EXTRAS ?=
comma  := ,
ifneq ($(filter-out tpu cuda cuda13,$(subst $(comma), ,$(EXTRAS))),)
$(error EXTRAS must be empty, tpu, cuda or cuda13 (the accelerator extras of pyproject.toml), got '$(EXTRAS)')
endif
# One stamp per set of extras, so a different EXTRAS installs again.
STAMP  := $(VENV)/.installed$(if $(EXTRAS),-$(subst $(comma),-,$(EXTRAS)))

# The variables that choose what runs or where its results are written come from make's command
# line only (`make parity SUITE=smoke`), never from the environment: an OUT or SUITE exported
# for something else would otherwise change the suite, drop `make parity`'s gate, or make
# `make baseline` write one suite's rows over another's baseline, with nothing said. One found
# in the environment is dropped (`make -e` does not bring it back), with a warning when a
# goal other than setting up runs. JOBS, FAULT_JOBS and SWEEP_JOBS (how many processes, not
# what they compute) and the set-up's EXTRAS, SYSTEM_JAX and PYTHON are still read from the
# environment too.
COMMAND_LINE_ONLY := SUITE BASELINE IMPL OUT MAXTEXT MAXTEXT_OUT FAULTS_OUT SWEEP_OUT RESULTS SEEDS PYTEST_ARGS
FROM_ENVIRONMENT  := $(foreach v,$(COMMAND_LINE_ONLY),$(if $(filter environment,$(origin $(v))),$(v)))
ifneq ($(filter-out setup print-venv clean lint,$(MAKECMDGOALS)),)
$(foreach v,$(FROM_ENVIRONMENT),$(warning $(v)=$($(v)) in the environment is ignored: make takes $(v) from its command line only (make $(MAKECMDGOALS) $(v)=$($(v)))))
endif
$(foreach v,$(FROM_ENVIRONMENT),$(eval override undefine $(v)))

SUITE  ?= default
# Each suite's run in its own folder: `make parity SUITE=smoke` leaves out/parity (what `make
# gate` judges) as it was.
OUT    ?= out/$(if $(filter default,$(SUITE)),parity,$(SUITE))
# Worker processes of `make parity`: auto = one per CPU core as memory allows on a CPU
# backend, 1 on an accelerator (mhc_parity/harness/processes/parallel.py auto_jobs; measured in `make bench`).
JOBS   ?= auto
# The reviewed baseline of the default suite: what `make gate` judges against, and what `make
# parity` draws drift against (BASELINE=... on the command line names another, for any suite).
# On a TPU VM (its chips as /dev/accel* or /dev/vfio/<n>, as mhc_parity.harness.env.tpu_host
# reads them) the reviewed baseline is the one made on the lent TPU v5e with the image's own JAX
# (a CPU baseline is refused there: its matmuls ran at another precision); another TPU
# generation makes its own with `make baseline BASELINE=baselines/tpu-<generation>.csv`.
TPU_HOST := $(wildcard /dev/accel* /dev/vfio/[0-9]*)
DEFAULT_BASELINE := $(if $(TPU_HOST),baselines/tpu-v5e.csv,baselines/default.csv)
BASELINE ?= $(DEFAULT_BASELINE)
# The suites whose cases are all in the default suite (mhc_parity/cases/catalogue.py: smoke is
# a subset of default): their run is gated on the default baseline's rows of the cases it ran
# (--only-current-cases), not failed on the rest as missing.
SUBSET_SUITES := smoke
# The baseline `make parity` is judged against, as `make gate` judges it: one named on the
# command line, else the default suite's own, when it exists, for the default suite and its
# subsets (another suite's run against it would be all missing and new rows).
PARITY_BASELINE := $(if $(filter command line,$(origin BASELINE)),$(BASELINE),$(if $(filter default $(SUBSET_SUITES),$(SUITE)),$(wildcard $(DEFAULT_BASELINE))))
# A subset suite judged against the default suite's baseline: only its own cases' rows.
GATE_SCOPE := $(if $(and $(filter $(SUBSET_SUITES),$(SUITE)),$(filter $(DEFAULT_BASELINE),$(if $(PARITY_BASELINE),$(PARITY_BASELINE),$(BASELINE)))), --only-current-cases)
PARITY_RUN  = $(MHC_PARITY) run --suite $(SUITE) --out $(OUT) --jobs $(JOBS)
# mhc-parity's usage errors (exit 2: a folder it will not write into, a file it cannot read)
# name its options (--out, --baseline), which a make user gave as variables:
# `cmd $(call options_from,--out is OUT; ...)` says which is which after such an error,
# keeping the command's exit status.
options_from = || { status=$$?; test $$status -ne 2 || echo "make $@: mhc-parity's options came from make's variables: $(1)" >&2; exit $$status; }
FAULTS_OUT ?= out/faults
SWEEP_OUT  ?= out/sweep
SEEDS      ?= 50
# Processes of `make faults` (each repeats the clean pass), and where `make faults`,
# `make sweep` and `make bench` write their figures, with date, commit and machine.
FAULT_JOBS ?= 2
# Processes of `make sweep` (the seeds are dealt to them).
SWEEP_JOBS ?= 2
RESULTS    ?= docs/results
PYTEST_ARGS ?=
IMPL       ?=

.PHONY: setup test test-fast lint parity smoke parity-maxtext baseline gate faults sweep audit tolerances bench bench-causes bench-reports accelerator-check clean

setup: $(STAMP)

ifeq ($(SYSTEM_JAX),1)
ifneq ($(EXTRAS),)
$(error SYSTEM_JAX=1 uses the machine's own jax and its plugins (libtpu, CUDA): leave EXTRAS empty)
endif
# The machine's own JAX (checked against the supported releases, mhc_parity/jax_support.py),
# kept as it is; no pip upgrade (an image's index may not have one).
$(STAMP): pyproject.toml tools/make-venv tools/install_on_own_jax.py
	@PYTHON=$(or $(PYTHON),python3) tools/make-venv --system-site-packages $(VENV)
	@echo "setup: installing mhc-parity and its dependencies beside the machine's own JAX into $(VENV) (pip, quiet; a few minutes)"
	$(PY) tools/install_on_own_jax.py
	touch $(STAMP)
else
# Reinstall whenever the pinned dependency list (or EXTRAS) changes. Extras only add
# packages: installing without them later does not remove an accelerator's plugin.
# tools/make-venv finds a Python that meets requires-python (PYTHON=... to name one) and
# replaces a venv made with an older one.
$(STAMP): pyproject.toml tools/make-venv
	@tools/make-venv $(VENV)
	@echo "setup: upgrading pip in $(VENV)"
	$(PY) -m pip install --quiet --upgrade pip
	@echo "setup: installing mhc-parity with its pinned dependencies, extras dev,maxtext$(if $(EXTRAS),$(comma)$(EXTRAS)) (pip, quiet; a few minutes on first use, about 1.7 GB)"
	$(PY) -m pip install --quiet -e '.[dev,maxtext$(if $(EXTRAS),$(comma)$(EXTRAS))]'
	touch $(STAMP)
endif

# The whole suite: what CI runs.
test: setup
	$(PY) -m pytest -n auto $(PYTEST_ARGS)

# The edit loop: the unit tests and the smoke matrix (every test not marked slow).
test-fast: setup
	$(PY) -m pytest -n auto -m "not slow" $(PYTEST_ARGS)

# The not-slow tests on the oldest supported Python and JAX (a TPU VM image's own: Python 3.11,
# jax 0.10.2; tools/oldest-supported.txt pins it), in .venv-compat, installed as
# SYSTEM_JAX=1 installs on such an image.
.PHONY: test-compat print-venv
COMPAT_VENV := .venv-compat
COMPAT_PY   := $(COMPAT_VENV)/bin/python
$(COMPAT_VENV)/.installed: pyproject.toml tools/make-venv tools/install_on_own_jax.py tools/oldest-supported.txt
	@tools/make-venv --oldest $(COMPAT_VENV)
	$(COMPAT_PY) -m pip install --quiet -r tools/oldest-supported.txt
	$(COMPAT_PY) tools/install_on_own_jax.py --constraint tools/oldest-supported.txt
	touch $@

test-compat: $(COMPAT_VENV)/.installed
	$(COMPAT_PY) -m pytest -n auto -m "not slow" $(PYTEST_ARGS)

# ruff's linter and formatter, as configured in pyproject.toml (`ruff format .` applies the format).
lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# With a baseline (PARITY_BASELINE), the reports and the summary open with the gate's verdict
# against it, and a gate failure (a leaf grown past x2 inside its bound) fails the run, exit 1.
# make itself exits 2 whenever a recipe fails: CI that tells 1 from 2 calls `mhc-parity run`.
parity: setup
	$(PARITY_RUN)$(if $(PARITY_BASELINE), --baseline $(PARITY_BASELINE)$(GATE_SCOPE)) $(call options_from,--suite is SUITE; --out is OUT; --jobs is JOBS; --baseline is BASELINE)

# The edit loop: after a kernel edit, the smoke suite into out/smoke, gated on the default
# baseline's rows of its cases (README.md gives its measured time).
smoke:
	@$(MAKE) --no-print-directory parity SUITE=smoke

# MaxText 0.2.5 (the `maxtext` extra): its layer's two paths and its kernel API, as released and
# with the upstream fixes applied at run time, beside this project's reference (mhc_parity/maxtext_parity/).
# MAXTEXT=fixed runs only the fixed variants (exit 0: they pass), MAXTEXT=released only the
# released ones (exit 1, their causes first); the default runs all of them.
MAXTEXT ?= implementations
MAXTEXT_OUT ?= out/parity-maxtext$(if $(filter-out implementations,$(MAXTEXT)),-$(MAXTEXT))
# On a TPU host the run is judged against the baseline made on the lent v5e for that selection
# (baselines/tpu-v5e-maxtext.csv, -fixed.csv, -released.csv: bench/tpu_maxtext_check.sh makes them),
# where it exists; a CPU run has none (its numbers are interpret mode's and the compile rows).
MAXTEXT_BASELINE := $(if $(TPU_HOST),$(wildcard baselines/tpu-v5e-maxtext$(if $(filter-out implementations,$(MAXTEXT)),-$(MAXTEXT)).csv))
parity-maxtext: setup
	$(MHC_PARITY) run --suite maxtext --impl mhc_parity.maxtext_parity:$(MAXTEXT) --paths 'reference/*' 'maxtext-*' \
		--out $(MAXTEXT_OUT) --jobs $(JOBS)$(if $(MAXTEXT_BASELINE), --baseline $(MAXTEXT_BASELINE)) \
		$(call options_from,--impl is MAXTEXT; --out is MAXTEXT_OUT; --jobs is JOBS)

# Run the suite and store it as the reviewed baseline the gate uses. The run is not judged
# against the old baseline: after a deliberate numerical change its drift must not stop its
# own replacement (a fail or error row still does). With IMPL=MODULE:FACTORY:
# run that external implementation (and the reference) and write its own baseline, keyed by
# its name: baselines/<name>.csv (BASELINE=... on the command line to choose the file).
# Its default file is the default suite's: another SUITE writes only to a BASELINE named on the
# command line (its rows over the default suite's file would drop every case that suite lacks,
# and the gate would pass their regressions as rows the baseline does not hold). `mhc-parity
# baseline` refuses the same on its own: a baseline's header records its suite.
ifneq ($(filter baseline,$(MAKECMDGOALS)),)
ifneq ($(SUITE),default)
ifneq ($(origin BASELINE),command line)
$(error make baseline SUITE=$(SUITE) would write the $(SUITE) suite's rows over the default suite's baseline: name the file on the command line, e.g. make baseline SUITE=$(SUITE) BASELINE=baselines/$(SUITE)$(if $(IMPL),-<implementation>).csv)
endif
endif
endif
ifeq ($(IMPL),)
baseline: setup
	$(PARITY_RUN) $(call options_from,--suite is SUITE; --out is OUT; --jobs is JOBS)
	$(MHC_PARITY) baseline --from $(OUT) --to $(BASELINE) $(call options_from,--from is OUT; --to is BASELINE)
else
baseline: setup
	$(MHC_PARITY) baseline --impl $(IMPL) --suite $(SUITE) --out $(OUT)$(if $(filter command line,$(origin BASELINE)), --to $(BASELINE)) \
		$(call options_from,--impl is IMPL; --suite is SUITE; --out is OUT; --to is BASELINE)
endif

# Gate the last run in $(OUT) against the baseline (run `make parity` first; SUITE=smoke: the
# smoke run in out/smoke, on the default baseline's rows of its cases).
gate: setup
	$(MHC_PARITY) gate --baseline $(BASELINE) --current $(OUT)$(GATE_SCOPE) $(call options_from,--baseline is BASELINE; --current is OUT)

# The kill matrix: every catalogued fault injected in turn; exits 1 if one survives.
faults: setup
	$(MHC_PARITY) faults --suite $(SUITE) --out $(FAULTS_OUT) --jobs $(FAULT_JOBS) --results $(RESULTS)/kill-matrix-$(SUITE).md \
		$(call options_from,--suite is SUITE; --out is FAULTS_OUT; --jobs is FAULT_JOBS; --results is under RESULTS)

# The false-positive sweep: the unmodified code over $(SEEDS) seeds; exits 1 on any failure. Its
# calibration table holds every cell's tail against the policy's stated false-positive rate.
sweep: setup
	$(MHC_PARITY) faults --seeds $(SEEDS) --suite $(SUITE) --out $(SWEEP_OUT) --jobs $(SWEEP_JOBS) --results $(RESULTS)/sweep-$(SUITE).md \
		$(call options_from,--seeds is SEEDS; --suite is SUITE; --out is SWEEP_OUT; --jobs is SWEEP_JOBS; --results is under RESULTS)

# The rounding audit: every bfloat16 value the reference holds and the model's site for it, and
# each site's share of the sensitivity; exits 1 on a value no site rounds.
audit: setup
	$(MHC_PARITY) faults --audit --out out/audit --results $(RESULTS)/rounding-audit.md

# docs/tolerances.md: the bound every comparison of the case matrix resolves to (a test
# fails until it is regenerated after a change of mhc_parity/harness/judging/tolerances.toml).
tolerances: setup
	$(MHC_PARITY) policy --markdown > docs/tolerances.md.tmp && mv docs/tolerances.md.tmp docs/tolerances.md

# `make parity`'s run (the default suite with its baseline), cold, warm and after a kernel edit, with
# --jobs 1 and auto: the shares spent compiling, executing, in the oracle and in harness overhead,
# peak memory, programs compiled (targets on 2 cores: warm <= 5 s wall with the harness's own time
# <= 2 s; edit <= 90 and cold <= 200 CPU-s), into docs/results/bench-default.md; then
# `make parity-maxtext`'s run (--jobs 1), cold and warm (target 15 s warm), into
# docs/results/bench-maxtext.md. SUITE=NAME on the command line: that suite alone.
BENCH_SUITES = $(if $(filter command line,$(origin SUITE)),$(SUITE),default maxtext)
bench: setup
	$(foreach suite,$(BENCH_SUITES),$(PY) bench/parity_bench.py --suite $(suite) --results $(RESULTS)/bench-$(suite).md &&) true

# What naming a failing run's causes costs: the smoke suite with d_post_bias broken, cold and warm,
# against the passing run, with and without --no-causes (CAUSES_SUITE=default for the default suite).
CAUSES_SUITE ?= smoke
bench-causes: setup
	$(PY) bench/causes_bench.py --suite $(CAUSES_SUITE) --results $(RESULTS)/bench-causes-$(CAUSES_SUITE).md

# Report writing alone (mhc_parity.reports.write_all and `mhc-parity render`) on the run in $(OUT) (`make parity` first).
bench-reports: setup
	$(PY) bench/report_writing.py --rows $(OUT)

# On a TPU VM or GPU machine: install its extra, smoke suite + hardware tests, one line per path
# (SYSTEM_JAX=1: on the machine's own JAX).
accelerator-check:
	$(if $(EXTRAS),EXTRAS=$(EXTRAS) )$(if $(SYSTEM_JAX),SYSTEM_JAX=$(SYSTEM_JAX) )bench/accelerator_check.sh

# The venv this configuration uses (for bench/accelerator_check.sh).
print-venv:
	@echo $(VENV)

clean:
	rm -rf $(VENV) out .cache .pytest_cache
