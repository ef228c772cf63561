# Both targets create and reuse a local virtual environment (.venv) by themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-real test-spark-cluster lint bench bench-spark-cluster chaos docs clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[cli,dev,docs,speed,spark,prometheus,otel]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m smartnsq.demo

lint: $(STAMP)
	$(BIN)/ruff check smartnsq tests benchmarks examples docs/hooks
	$(BIN)/mypy --strict smartnsq

# two workers (pytest-xdist): one per core; tests/conftest.py keeps each module, and all the
# Spark tests, on one worker (its pytest_xdist_make_scheduler)
test: lint
	$(BIN)/python -m pytest -q -n 2 --dist loadscope

# Real stock nsqd and a 3-node youzan cluster from ../shared/realnsq (REALNSQ_DIR), started for
# the run and always stopped; honours REALNSQ_STOCK_BASE, REALNSQ_YOUZAN_BASE, REALNSQ_STATE;
# PYTEST_ARGS go to pytest.
test-real: $(STAMP)
	PYTHON=$(BIN)/python tests/run_real_servers.sh $(PYTEST_ARGS)

# The Spark source and sink on a Spark standalone cluster (a master and two one-core workers
# from pyspark's spark-class, executors on a venv-packed environment, tests/spark/cluster.py)
# against the real servers: already running ones when SMARTNSQ_REAL_YOUZAN_LOOKUPD is set,
# else started and stopped as by test-real (which runs these tests too).
test-spark-cluster: $(STAMP)
	$(BIN)/python -c 'import venv_pack' 2>/dev/null || $(BIN)/pip install -q venv-pack
	if [ -n "$$SMARTNSQ_REAL_YOUZAN_LOOKUPD" ]; then \
	  SMARTNSQ_SPARK_CLUSTER=1 $(BIN)/python -m pytest -q -m spark_cluster tests/spark $(PYTEST_ARGS); \
	else \
	  SMARTNSQ_SPARK_CLUSTER=1 PYTHON=$(BIN)/python tests/run_real_servers.sh -m spark_cluster $(PYTEST_ARGS); \
	fi

# the documentation site on http://127.0.0.1:8000 (make test builds it with --strict)
docs: $(STAMP)
	$(BIN)/mkdocs serve -a 127.0.0.1:8000

bench: $(STAMP)
	$(BIN)/pip install -q -e '.[cli,dev,speed,bench]'
	$(BIN)/python benchmarks/codec.py
	$(BIN)/python benchmarks/throughput.py

# The Spark table (benchmarks/spark.py) on local standalone clusters of 1 and 2 workers against a
# running youzan cluster (YOUZAN_LOOKUPD, e.g. ../shared/realnsq/start-youzan.sh 3), beside the
# hand-written ways (gnsq, from the bench extra).
YOUZAN_LOOKUPD ?= 127.0.0.1:14161
bench-spark-cluster: $(STAMP)
	$(BIN)/pip install -q -e '.[cli,dev,speed,spark,bench]'
	$(BIN)/python benchmarks/spark.py --lookupd $(YOUZAN_LOOKUPD) --partitions 1 3 --workers 1 2

# The chaos soak (benchmarks/chaos.py --help): 10 minutes of faults on the embedded cluster by
# default; CHAOS_ARGS go to the script (e.g. CHAOS_ARGS="--minutes 2 --rate 1000 --seed 7",
# or "--real" against ../shared/realnsq/start-youzan.sh 3 with the same REALNSQ_* settings).
chaos: $(STAMP)
	$(BIN)/python benchmarks/chaos.py $(CHAOS_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
