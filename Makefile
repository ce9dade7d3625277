# The two commands of the README:
#   make run    the main job: example kernels -> mirror -> a real kerneld (user mode) -> a
#               training script, cold, warm, and with the daemon stopped (examples/main_job.py)
#   make test   lint, type checks and the whole test suite
# Both create or reuse .venv and install what they need (scripts/bootstrap).

VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# pytest-xdist workers for `make test`; 0 runs the suite in this process, in pytest's order.
# Each test file goes whole to one worker, the files with slow tests first (tests/scheduling.py).
# One worker more than two cores pays (while one test waits on a daemon, a job or pip, another
# computes); a fourth only adds contention (bench/SUITE.md: 3 workers beat 4 twice).
PYTEST_WORKERS ?= 3

.PHONY: run test test-deps test-typecheck bootstrap bytecode lint typecheck proto proto-check bench clean

bootstrap:
	@scripts/bootstrap

run: bootstrap
	@$(PY) -m examples.main_job

lint: bootstrap
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: bootstrap
	$(VENV)/bin/mypy

proto: bootstrap
	$(PY) scripts/genproto

proto-check: bootstrap
	$(PY) scripts/genproto --check

# The work tree's bytecode, written before the suite: it starts hundreds of daemons, kerneldctl
# runs and jobs from this checkout, and where PYTHONDONTWRITEBYTECODE is set (this kind of
# machine sets it) each of them would compile kerneld's modules again, as an installed wheel
# never does (pip compiles at install). The suite ran in 0.84x the wall time and CPU
# (bench/SUITE.md).
bytecode: bootstrap
	$(PY) -m compileall -q -j 0 kerneld client/kerneld_client examples tests bench chaos

# The suite's heavy set-up, once per machine and outside every test's timeout (issue 55): the
# released `kernels`/Transformers venvs, the kernels 0.17.2/0.19.1 suites and their venvs, the
# example builds, the systemd test's wheelhouse and the image's base and wheels, into a cache
# outside the clone keyed by what each is made from: $KERNELD_TEST_CACHE, else
# /var/cache/kerneld-test as root, else ~/.cache/kerneld-test (tests/support/testcache.py).
# Later runs and later clones on the machine reuse it. TEST_DEPS names some steps only
# (python -m tests.deps --list).
TEST_DEPS ?=

test-deps: bootstrap
	$(PY) -m tests.deps $(TEST_DEPS)

# `make test`'s type check keeps mypy's incremental cache in the suite's cache outside the clone,
# so a fresh clone checks against an earlier clone's results (mypy revalidates each module by its
# source's hash): 1.4 s where a fresh .mypy_cache took 35 s (bench/SUITE.md). `make typecheck`
# keeps .mypy_cache in the checkout.
test-typecheck: bootstrap
	$(VENV)/bin/mypy --cache-dir "$$($(PY) -m tests.deps --cache-dir mypy)"

test: lint test-typecheck bytecode test-deps
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# BENCH_ARGS adds flags, e.g. BENCH_ARGS=--quick (python -m bench.run --help lists them).
BENCH_ARGS ?=

bench: bootstrap
	$(PY) -m bench.run $(BENCH_ARGS)

# Chaos/soak harness (issue 10, chaos/): DURATION seconds of CLIENTS client processes loading
# kernels while the daemon is killed and restarted, the test Hub injects faults and kerneldctl
# prefetches, collects, pins and denies; fails if an invariant breaks. CHAOS_ARGS adds flags,
# e.g. CHAOS_ARGS="--report RELIABILITY.md" (python -m chaos --help lists them).
DURATION ?= 300
CLIENTS ?= 64
CHAOS_ARGS ?=

.PHONY: chaos
chaos: bootstrap
	$(PY) -m chaos --duration $(DURATION) --clients $(CLIENTS) $(CHAOS_ARGS)

# The CUDA example kernels (issues 44, 53), opt-in: downloads the CUDA 13.0 toolkit wheels
# (about 100 MiB, cached in .cache/cuda-wheels/), builds activation-cuda and attention-cuda (the
# attention example's GPU build) for sm_80/sm_90 with nvcc, checks their archs, and runs their
# tests (check_arch against the real archs included) and scripts/gpu-check --dry-run.
# `make test` never does.
.PHONY: cuda-examples
cuda-examples: bootstrap
	$(PY) -m examples.kernels.cuda.build --mirror .cache/cuda-mirror
	KERNELD_CUDA_EXAMPLES=1 $(PY) -m pytest tests/example_kernels/test_cuda_build.py -q $(PYTEST_ARGS)

clean:
	rm -rf .cache .pytest_cache .mypy_cache .ruff_cache

# kerneld with the registry's real CUDA torch and no device (issue 44), opt-in: a venv with
# torch==2.13.0+cu130 from pypi.org (about 2.6 GB of wheels cached in .cache/cuda-torch/wheels/,
# 4.7 GB installed; a second run installs nothing) and kerneld-client from this checkout; its
# tests check platform facts, the daemon's ranking, the device check, the import of the CUDA
# example and kernelize against torch's own values. `make test` never does.
.PHONY: cuda-torch
cuda-torch: bootstrap
	KERNELD_CUDA_TORCH=1 KERNELD_CUDA_TORCH_PYTHON="$$(scripts/cuda-torch-venv)" \
	  $(PY) -m pytest tests/example_kernels/test_cuda_torch.py -q -p no:xdist $(PYTEST_ARGS)
