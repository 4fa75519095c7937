# berth: the two quickstart commands are `make demo` and `make test`; both create .venv on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The real-engine tier (tests/engine) runs vLLM on CPU from its own cached venv.
ENGINE_VENV ?= $(HOME)/.cache/berth/engine-venv

.PHONY: venv redis demo serve test test-fast test-engine engine-env lint typecheck check bench-overhead bench-vllm soak clean

$(BIN)/berth: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@

venv: $(BIN)/berth

demo: venv
	$(BIN)/berth demo

serve: venv
	$(BIN)/berth serve -c conf/gateway.toml

engine-env:
	ENGINE_VENV=$(ENGINE_VENV) bash tests/engine/setup_engine_env.sh

# The cluster-mode tests run a real redis-server (loadgen/redis_server.py starts one per test run): Debian's
# redis-server package, installed here when it is missing and apt-get exists; otherwise say what to install.
redis:
	@command -v redis-server >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1; then \
	    SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	    $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server || { $$SUDO apt-get update -q && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server; }; \
	  else \
	    echo "cluster tests need redis-server: install Redis >= 7 (or Valkey) so that redis-server is on PATH; they are skipped without it" >&2; \
	  fi; }

# The whole suite: unit, integration and the real-engine tier.
test: venv engine-env redis
	BERTH_ENGINE_PYTHON=$(ENGINE_VENV)/bin/python $(BIN)/pytest -q tests

# Unit and integration only (no vLLM).
test-fast: venv redis
	$(BIN)/pytest -q tests -m "not engine"

# Only the real-engine tier.
test-engine: venv engine-env
	BERTH_ENGINE_PYTHON=$(ENGINE_VENV)/bin/python $(BIN)/pytest -q tests/engine

# ruff, then the import contracts of pyproject.toml ([tool.importlinter]: layers, sched/ a leaf, no cycles).
lint: venv
	$(BIN)/ruff check gateway loadgen tests
	$(BIN)/ruff format --check gateway loadgen tests
	$(BIN)/lint-imports --no-cache

typecheck: venv
	$(BIN)/mypy

check: lint typecheck

bench-overhead: venv
	$(BIN)/berth-loadgen bench overhead

# The fault-matrix soak (loadgen/bench/reliability/soak.py): berth in front of simulated engines, >= 20,000 requests at
# concurrency 64 with every fault kind; report.md and report.json in SOAK_OUT. `--quick` is the test's.
SOAK_OUT ?= bench-out/soak
soak: venv
	$(BIN)/berth-loadgen bench soak --out $(SOAK_OUT)

# vLLM's own benchmark client (`vllm bench serve`, from the engine venv) against berth in front of
# simulated engines; BENCH_VLLM_ARGS="--engine vllm" puts a real vLLM on CPU behind berth instead.
BENCH_VLLM_ARGS ?=
bench-vllm: venv engine-env
	BERTH_ENGINE_PYTHON=$(ENGINE_VENV)/bin/python $(BIN)/berth-loadgen bench vllm $(BENCH_VLLM_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
