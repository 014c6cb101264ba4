# Two commands on a fresh machine:  `make demo`  (main job)  and  `make test`  (the suite).
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin

# The kernel, quantisation and fast-path parity tests, run again as on CPUs of lower classes
# (docs/performance.md, "CPU classes"): aiayn's dispatch capped by AIAYN_CPU_CAP, oneDNN's by
# ONEDNN_MAX_CPU_ISA and PyTorch's vector code by ATEN_CPU_CAPABILITY.
PARITY  = tests/kernels tests/attention tests/layers/test_quantized.py tests/inference \
          tests/decoding/test_fast_step.py tests/decoding/test_fast_step_options.py
AVX2    = AIAYN_CPU_CAP=avx2 ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2
GENERIC = AIAYN_CPU_CAP=generic ONEDNN_MAX_CPU_ISA=SSE41 ATEN_CPU_CAPABILITY=default

.PHONY: install demo test test-cpu-classes lint typecheck wheel clean

# Installs, then builds aiayn's C++ kernels where they can run (`aiayn kernels build`), so that
# no later command compiles; a kernel that fails to build is a warning, never a failed install.
$(BIN)/aiayn: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[dev]"
	-$(BIN)/aiayn kernels build
	touch $(BIN)/aiayn

install: $(BIN)/aiayn

demo: install
	$(BIN)/aiayn train

test: install
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy
	$(BIN)/python -m pytest
	$(MAKE) test-cpu-classes

test-cpu-classes: install
	$(AVX2) $(BIN)/python -m pytest -p no:cacheprovider $(PARITY)
	$(GENERIC) $(BIN)/python -m pytest -p no:cacheprovider $(PARITY)

wheel: install
	$(BIN)/python -m build --wheel --outdir dist .

clean:
	rm -rf $(VENV) dist build .pytest_cache .mypy_cache .ruff_cache
