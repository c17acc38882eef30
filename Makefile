# Two entry points for a fresh machine (see README Quickstart):
#   make demo   creates .venv, installs ackstream, runs the main job on the embedded default
#   make test   creates .venv, installs ackstream with its test extra, runs the test suite
#   make lint   ruff check and ruff format --check (CI runs it before the tests)
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

LINTED := ackstream tests benchmarks

.PHONY: demo test lint format bench java clean

demo: $(VENV)/.installed java
	$(PY) -m ackstream demo

test: $(VENV)/.installed java
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)

format: $(VENV)/.installed
	$(VENV)/bin/ruff check --fix $(LINTED)
	$(VENV)/bin/ruff format $(LINTED)

bench: $(VENV)/.installed java
	$(PY) benchmarks/acker.py
	cd benchmarks && ../$(PY) topology.py

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

# Spark needs a JVM; say so plainly instead of letting py4j fail later.
java:
	@command -v java >/dev/null 2>&1 || { \
	  echo "ackstream: Java 17 or newer is required by Spark and was not found on PATH." >&2; \
	  echo "  Install a JDK (Debian/Ubuntu: apt-get install openjdk-17-jdk-headless) or set JAVA_HOME and PATH." >&2; \
	  exit 1; }
	@major=$$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1); \
	if [ -n "$$major" ] && [ "$$major" -lt 17 ]; then \
	  echo "ackstream: Java $$major found, Spark 4 needs Java 17 or newer." >&2; exit 1; fi

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
