# Two commands on a fresh machine:  `make demo`  (main job)  and  `make test`  (the suite).
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin

.PHONY: install demo test lint typecheck wheel clean

$(BIN)/aiayn: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[dev]"
	touch $(BIN)/aiayn

install: $(BIN)/aiayn

demo: install
	$(BIN)/aiayn train

test: install
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy
	$(BIN)/python -m pytest

wheel: install
	$(BIN)/python -m build --wheel --outdir dist .

clean:
	rm -rf $(VENV) dist build .pytest_cache .mypy_cache .ruff_cache
