# The two commands of the README: `make demo` (set up, build, run the main job) and `make test`.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
# torch is pinned to the CPU build that lies on this kind of machine; an open range pulls CUDA.
DEPS := torch==2.13.0 pyyaml jinja2 pytest scikit-build-core pybind11

.PHONY: setup build demo test bench clean

setup:
	$(PIP) install -q $(DEPS)

# Generates the bindings from ops.yaml and compiles them (editable: Python edits need no rebuild).
build: setup
	$(PIP) install -q --no-build-isolation -e .

demo: build
	$(PYTHON) -m opgen.demo

test: build
	$(PYTHON) -m pytest -q -p no:cacheprovider

bench: build
	$(PYTHON) -m opgen.bench ops

clean:
	rm -rf build
