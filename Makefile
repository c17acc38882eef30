# Two entry points for a fresh machine (see README Quickstart):
#   make demo   creates .venv, installs ackstream (its core install, no extra), runs the
#               main job on the embedded default
#   make test   creates .venv, installs ackstream with its test extra, brings Apache Kafka
#               (make kafka), runs the test suite
#   make test-bench the benchmarks' end-to-end runs at tiny sizes (marked bench), not in make test
#   make test-browser  the live view in headless Chromium (marked browser), not in make test
#   make test-long  the runs marked long (chaos, broker failures, scale), not in make test
#   make test-cluster  the long runs CI makes too: broker, Spark worker and security
#               failures, one small chaos seed
#   make chaos  the chaos suite at full size, CHAOS_SEEDS seeds (tests/test_chaos.py)
#   make lint   ruff check, ruff format --check, the import contracts and mypy (CI runs it first)
#   make docs   builds the documentation site from docs/ into site/ (open site/index.html),
#               strictly: a broken link or a docstring mkdocstrings cannot render fails it
#   make options-page  rewrites the tables of docs/reference/options.md from the table
#               of options in ackstream/config/source.py (a test fails when they differ)
#   make bench-scale  the same tracked work on 1 and 2 executors of a standalone cluster
#   make bench-failure  the failure path's cost: 0 to 100 % of each batch failing once
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# bash: the kafka recipe reads mvn's exit status through a pipe (PIPESTATUS)
SHELL := /bin/bash

LINTED := ackstream tests benchmarks

.PHONY: demo test test-e2e test-unit test-browser test-bench test-long test-cluster chaos lint format docs options-page bench bench-e2e bench-failure bench-driver bench-scale java kafka spark-kafka clean

# Apache Kafka for the broker tests: its jars, resolved from Maven Central by
# tests/kafka/pom.xml (the version is set there), copied once into KAFKA_LIBS.
KAFKA_VERSION := $(shell sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' tests/kafka/pom.xml)
KAFKA_LIBS ?= .cache/kafka-$(KAFKA_VERSION)/libs
# e.g. MVN_FLAGS=-Dmaven.repo.local=/tmp/m2 (another local repository)
MVN_FLAGS ?=
# Spark's own Kafka connector (benchmarks/spark-kafka/pom.xml): the tests' sessions and the
# end-to-end benchmark load it; ackstream itself needs it only for its JVM record path.
# It should match the installed pyspark; Maven Central has no spark-sql-kafka 4.3.0 yet,
# so the newest release there is the default (e2e.py records both versions).
SPARK_KAFKA_VERSION ?= 4.2.0
SPARK_KAFKA_JARS ?= .cache/spark-kafka-$(SPARK_KAFKA_VERSION)/jars
# a smaller run: make bench-e2e E2E_ARGS="--batch-sizes 20000 --batches 2 --repeats 1"
E2E_ARGS ?= --batch-sizes 20000,100000 --batches 10 --repeats 3
# a smaller run: make bench-failure FAILURE_ARGS="--batch-sizes 20000 --repeats 1"
FAILURE_ARGS ?=

# The demo needs the core install only (no test, ui or docs extra): a fresh machine's
# first result comes sooner. make test adds the test extra to the same venv later.
demo: $(VENV)/.core java
	$(PY) -m ackstream demo

# The tests' sessions load Spark's Kafka connector (make spark-kafka), so that topologies
# read and write on the JVM record path; the Python reader keeps tests of its own.
test: $(VENV)/.installed java kafka spark-kafka
	$(PY) -m pytest $(PYTEST_ARGS)

# What make test leaves out for its 20 minutes: Spark started in processes of its own as a
# user starts it (ackstream run, the docs' worked examples, the notebook) and failure paths
# run through. CI runs it after make test. About 20 minutes on 2 cores.
test-e2e: $(VENV)/.installed java kafka spark-kafka
	$(PY) -m pytest -m e2e $(PYTEST_ARGS)

# The unit tests alone: no Spark session, no broker (conftest marks the tests that use one).
test-unit: $(VENV)/.installed
	$(PY) -m pytest -m "not spark and not broker and not long and not bench" $(PYTEST_ARGS)

# The benchmarks' own end-to-end runs at tiny sizes (marked `bench`): each starts worker
# processes with a Spark of their own, so they stay out of make test; CI runs them.
test-bench: $(VENV)/.installed java kafka spark-kafka
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) -m pytest -m bench $(PYTEST_ARGS)

# The live view in a real browser (marked `browser`): Debian's headless Chromium driven
# by Playwright against a topology on the test broker; Chromium is Debian's package
# (apt-get install chromium), never Playwright's own download. A minute or two.
test-browser: $(VENV)/.installed java kafka spark-kafka
	@test -x /usr/bin/chromium || { echo "ackstream: make test-browser needs Debian's chromium (apt-get install chromium)" >&2; exit 1; }
	$(PY) -m pytest -m browser $(PYTEST_ARGS)

# The runs marked `long` (chaos seeds, broker failures, scale), left out of make test.
test-long: $(VENV)/.installed java kafka spark-kafka
	$(PY) -m pytest -m long --timeout=3600 $(PYTEST_ARGS)

# What CI runs after make test: the runs only a real cluster allows, at small sizes:
# the three-broker cluster's failures, a standalone Spark cluster
# losing a Worker, the README's topology from a Spark Connect client, TLS and SASL
# listeners, one small chaos seed, a sink's broker stalled at 20,000 a batch
# (ACKSTREAM_OUTAGE_S, 60 s); then the failure path at 20,000 records a batch and
# topics deleted under a running topology (a broker that creates no topics).
CLUSTER_TESTS := tests/kafka/test_broker_failures.py tests/test_standalone_cluster.py \
	tests/test_connect.py tests/test_sink_outage.py \
	tests/test_secured_kafka.py tests/test_chaos.py::test_chaos_small \
	tests/test_broker_fixture.py::test_a_three_broker_cluster_keeps_a_replicated_topic_through_a_lost_leader
test-cluster: $(VENV)/.installed java kafka spark-kafka
	$(PY) -m pytest -m long $(CLUSTER_TESTS) $(PYTEST_ARGS)
	$(PY) -m pytest -m long tests/test_failure_path.py -k "20000 or deleted" $(PYTEST_ARGS)

# The chaos suite at full size (20,000 records, 4 partitions) for CHAOS_SEEDS seeds,
# each run's figures appended to CHAOS_REPORT; e.g. make chaos CHAOS_SEEDS=3,7
CHAOS_SEEDS ?= 1-20
CHAOS_REPORT ?= .cache/chaos-results.jsonl
chaos: $(VENV)/.installed java kafka
	@mkdir -p $(dir $(CHAOS_REPORT))
	ACKSTREAM_CHAOS_SEEDS=$(CHAOS_SEEDS) ACKSTREAM_CHAOS_REPORT=$(CHAOS_REPORT) \
	  $(PY) -m pytest -m 'chaos and long' -s tests/test_chaos.py $(PYTEST_ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)
	$(VENV)/bin/lint-imports  # pyproject.toml's contracts: imports run one way
	$(VENV)/bin/mypy  # the package's annotations ([tool.mypy] in pyproject.toml)

# mkdocs.yml: Material theme, API pages from the docstrings (mkdocstrings), --strict
docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# the options page's tables, made from the options the parser reads (docs/hooks/options_page.py)
options-page: $(VENV)/.installed
	$(PY) docs/hooks/options_page.py

$(VENV)/.docs-installed: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[docs]'
	touch $@

format: $(VENV)/.installed
	$(VENV)/bin/ruff check --fix $(LINTED)
	$(VENV)/bin/ruff format $(LINTED)

bench: $(VENV)/.installed java kafka
	$(PY) benchmarks/acker.py
	cd benchmarks && ../$(PY) topology.py

# The end-to-end benchmark: every system doing the same work over one Apache Kafka
# broker, warm, 3 runs alternating, at 20,000 and 100,000 records per batch, cold starts
# and the half-rate latency run (benchmarks/e2e.py). Quix Streams comes with the bench
# extra, Spark's Kafka connector with make spark-kafka. Run it on an idle machine.
# The driver's CPU per batch, by process, of the README's pipeline at two batch sizes.
bench-driver: $(VENV)/.installed java kafka spark-kafka
	$(PY) benchmarks/driver_cpu.py

bench-e2e: $(VENV)/.installed java kafka spark-kafka
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) benchmarks/e2e.py $(E2E_ARGS)

# The failure path's cost (benchmarks/failure_path.py): the same word count with 0, 1,
# 10 and 100 % of each batch failing on its first attempt, by a fail_where stage and by
# a raising pandas bolt, at 100,000 and 20,000 records a batch, each against its clean
# case in the same run; a run that does not keep up is cut at --timeout-s (90 s). Meant to
# take about 15 minutes on 2 idle cores (it prints its time); run it on an idle machine.
bench-failure: $(VENV)/.installed java kafka spark-kafka
	$(PY) benchmarks/failure_path.py $(FAILURE_ARGS)

# Scale-out: 1 and 2 executors of one core on a standalone cluster started from
# the pyspark package on loopback; a ratio only on a machine with at least 4 free cores.
# make bench-scale SCALE_ARGS="--records 40000 --repeat 3"
SCALE_ARGS ?=
bench-scale: $(VENV)/.installed java
	$(PY) benchmarks/scale.py $(SCALE_ARGS)

$(VENV)/.core: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	touch $@

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

ifdef ACKSTREAM_KAFKA_LIBS
kafka:
	@echo "ackstream: Apache Kafka's jars from ACKSTREAM_KAFKA_LIBS=$(ACKSTREAM_KAFKA_LIBS)"
else
kafka: $(KAFKA_LIBS)/.resolved
endif

# Copied into a fresh folder and moved into place only when mvn succeeded, so a
# failed or interrupted run never leaves a half-filled one that looks done.
$(KAFKA_LIBS)/.resolved: tests/kafka/pom.xml | java
	@command -v mvn >/dev/null 2>&1 || { \
	  echo "ackstream: Maven (mvn) is required to bring Apache Kafka for the tests and was not found." >&2; \
	  echo "  Install it (Debian/Ubuntu: apt-get install maven), or set ACKSTREAM_KAFKA_LIBS to a folder of Kafka's jars." >&2; \
	  exit 1; }
	@echo "ackstream: resolving Apache Kafka $(KAFKA_VERSION) from Maven Central into $(KAFKA_LIBS)"
	@rm -rf $(KAFKA_LIBS).tmp
	@mvn -B $(MVN_FLAGS) -f tests/kafka/pom.xml dependency:copy-dependencies \
	  -Dkafka.libs=$(abspath $(KAFKA_LIBS)).tmp \
	  | sed -n 's:^\[INFO\] Downloaded from [^ ]* .*/\([^/]*\.jar\) .*:  downloaded \1:p; /ERROR/p'; \
	  status=$${PIPESTATUS[0]}; if [ $$status -ne 0 ]; then \
	  echo "ackstream: mvn failed ($$status) resolving Apache Kafka $(KAFKA_VERSION); rerun with" >&2; \
	  echo "  mvn -B -f tests/kafka/pom.xml dependency:copy-dependencies -Dkafka.libs=/tmp/kafka-libs" >&2; \
	  echo "  to see all of its output." >&2; rm -rf $(KAFKA_LIBS).tmp; exit 1; fi
	@rm -rf $(KAFKA_LIBS) && mv $(KAFKA_LIBS).tmp $(KAFKA_LIBS)
	@touch $@
	@echo "ackstream: Apache Kafka $(KAFKA_VERSION): $$(ls $(KAFKA_LIBS) | wc -l) jars in $(KAFKA_LIBS)"

spark-kafka: $(SPARK_KAFKA_JARS)/.resolved

$(SPARK_KAFKA_JARS)/.resolved: benchmarks/spark-kafka/pom.xml | java
	@command -v mvn >/dev/null 2>&1 || { echo "ackstream: Maven (mvn) is required for make spark-kafka" >&2; exit 1; }
	@rm -rf $(SPARK_KAFKA_JARS).tmp
	@mvn -B -q $(MVN_FLAGS) -f benchmarks/spark-kafka/pom.xml dependency:copy-dependencies \
	  -Dspark.version=$(SPARK_KAFKA_VERSION) -Dspark.kafka.jars=$(abspath $(SPARK_KAFKA_JARS)).tmp \
	  || { rm -rf $(SPARK_KAFKA_JARS).tmp; exit 1; }
	@rm -rf $(SPARK_KAFKA_JARS) && mv $(SPARK_KAFKA_JARS).tmp $(SPARK_KAFKA_JARS)
	@touch $@
	@echo "ackstream: spark-sql-kafka-0-10 $(SPARK_KAFKA_VERSION): $$(ls $(SPARK_KAFKA_JARS) | wc -l) jars in $(SPARK_KAFKA_JARS)"

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
