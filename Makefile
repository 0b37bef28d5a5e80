# The two commands of the README: `make demo` (set up, build, run the main job) and `make test`.
PYTHON ?= python3
# The interpreter to install into: $(PYTHON) itself where pip may install into it (a virtual
# environment, or no PEP 668 EXTERNALLY-MANAGED marker), else a local .venv (tools/python_env.sh).
# Worked out once per make run, and only by targets that need it.
PY = $(eval PY := $$(shell PYTHON='$(PYTHON)' sh tools/python_env.sh))$(PY)
PIP = $(PY) -m pip
# torch is pinned to the CPU build that lies on this kind of machine; an open range pulls CUDA.
DEPS := torch==2.13.0 pyyaml jinja2 pytest pytest-xdist hypothesis scikit-build-core pybind11
# The zoo extra (tests/zoo: Hugging Face architectures from configs, nothing downloaded; about 15 s
# for the CI subset). Without it the zoo tests skip.
ZOO_DEPS := transformers
# Bigger budgets for `make fuzz` (CI runs the same suites with small ones, in `make test`).
FUZZ_ENV := OPGEN_FUZZ_CALLS_PER_FUNCTION=400 OPGEN_FUZZ_SPEC_MUTATIONS=10000 OPGEN_LEAK_CALLS=1000000 \
	OPGEN_LEAK_COMPILES=1000
# AddressSanitizer + UBSan: the extension is built instrumented (in build/asan) and Python, which is
# not, preloads the runtime (and libstdc++, or ASan cannot intercept C++ throws from a C program).
# Python's own allocations at exit are not leaks of ours: no leak check.
ASAN_LIB = $(shell $${CXX:-g++} -print-file-name=libasan.so) $(shell $${CXX:-g++} -print-file-name=libstdc++.so)
ASAN_ENV = LD_PRELOAD="$(ASAN_LIB)" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:detect_odr_violation=0 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

.PHONY: setup build demo test test-gpu fuzz asan bench clean

setup:
	$(PIP) install -q $(DEPS) $(ZOO_DEPS)

# Generates the bindings from ops.yaml and compiles them (editable: Python edits need no rebuild).
build: setup
	$(PIP) install -q --no-build-isolation -e .

demo: build
	$(PY) -m opgen.demo

# The suite in TEST_WORKERS processes (pytest-xdist, one a core on CI's 2-core machine; work stealing: an
# idle worker takes the tests queued behind a long one). TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2
test: build
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist worksteal

# The whole suite on a GPU machine, in parallel (docs/development.md). Nothing is installed there but
# opgen itself, built against the machine's CUDA torch (no registry is reached: set-up is the
# machine's). pytest stops at GPU_TEST_SECONDS with SIGINT, so it still prints its summary; each
# failure is appended to $(GPU_LOG)/failures.log as it happens, and junit.xml is written at the end.
# Work stealing: an idle worker takes tests queued behind a long one (a build, a child process).
GPU_WORKERS ?= 16
GPU_TEST_SECONDS ?= 480
GPU_LOG ?= build/test-gpu
test-gpu:
	$(PIP) install -q --no-build-isolation --no-deps -e .
	mkdir -p $(GPU_LOG) && rm -f $(GPU_LOG)/failures.log
	OPGEN_FAILURE_LOG=$(abspath $(GPU_LOG))/failures.log timeout -s INT -k 60 $(GPU_TEST_SECONDS) \
		$(PY) -m pytest -q -rfE -p no:cacheprovider -n $(GPU_WORKERS) --dist worksteal --timeout 300 --durations 15 \
		--junitxml=$(GPU_LOG)/junit.xml tests; status=$$?; \
		if [ -s $(GPU_LOG)/failures.log ]; then echo "failures: $(GPU_LOG)/failures.log"; fi; exit $$status

# The fuzz, leak and thread suites with the large budgets (over 100,000 calls, 10,000 spec mutations,
# a million calls for the leak check), printing the figures; about 35 minutes on 2 cores.
fuzz: build
	$(FUZZ_ENV) $(PY) -m pytest -q -s -p no:cacheprovider tests/hardening

# The whole test suite against an ASan + UBSan build of the extension, then the normal build again.
asan: setup
	$(PIP) install -q --no-build-isolation -e . -Cbuild-dir=build/asan -Ccmake.define.OPGEN_SANITIZE=ON \
		-Ccmake.build-type=RelWithDebInfo
	$(ASAN_ENV) $(PY) -m pytest -q -p no:cacheprovider -x; status=$$?; \
		$(PIP) install -q --no-build-isolation -e .; exit $$status

bench: build
	$(PY) -m opgen.bench ops

clean:
	rm -rf build
