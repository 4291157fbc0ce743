# Two entry points: `make demo` runs the main job, `make test` runs the suite.
# Both create .venv and install what they need on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test,bench,dev,xarray,plot,zarr]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/lamina demo

# the suite starts hundreds of Python processes (mpiexec): the package's bytecode compiled
# once first, so that none compiles it again where PYTHONDONTWRITEBYTECODE keeps imports
# from caching it (0.7 s an import without, 0.3 s with)
test: $(STAMP)
	$(BIN)/python -m compileall -q src/lamina > /dev/null
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -q

# the checks CI runs before the tests (.pre-commit-config.yaml runs the same on each commit)
lint: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/lamina bench write --size 64MiB --ranks 1,2,4
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/lamina bench read --size 64MiB --ranks 1,2,4

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
