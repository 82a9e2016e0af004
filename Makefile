# Two commands do all set-up on a fresh machine:
#   make serve   install the serving side and start the server on the bundled demo policy
#   make test    install everything the tests need and run lint, type checks and tests
# While working, the quick tier (under 3 minutes once installed):
#   make check   lint, type checks and the unit tests (tests/serve: the request path without
#                a server)
#
# torch comes from the export extra; TORCH pins the version we test with. On this project's
# machines a local CPU wheel answers that pin; elsewhere PyPI's torch==2.13.0 is the CUDA
# build (several GB): for the CPU build there, pass its index, e.g.
#   make test TORCH_INDEX=https://download.pytorch.org/whl/cpu

PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
TORCH_FROM := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
GRPC_PORT ?= 8001
DEMO_REPOSITORY ?= examples/model_repository
PYTEST_ARGS ?=
# `make test` runs the suite in this many pytest-xdist workers, each test file on one
# worker (--dist loadfile: a file's fixtures are built once); 0 runs it in this process.
TEST_WORKERS ?= 2

UNIT_TESTS ?= tests/kernel tests/cli tests/client tests/serve

.PHONY: serve test check lint typecheck unit bench bench-gpu demo loadtest clean chaos proto hooks

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The serving install: onnxruntime and the web stack, no torch.
$(VENV)/.serve-installed: pyproject.toml | $(BIN)/python
	@echo "make: installing the serving side into $(VENV) (a minute or two the first time)"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e .
	touch $@

# The demo's training (examples/train_cartpole.py): torch and Stable-Baselines3, nothing else.
$(VENV)/.demo-installed: pyproject.toml | $(BIN)/python
	@echo "make: installing torch and the exporter into $(VENV) (a few minutes the first time)"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check $(TORCH_FROM) "$(TORCH)"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[export]"
	touch $@ $(VENV)/.serve-installed

# Load tests (loadtests/, docs/loadtests.md): locust beside the serving install.
$(VENV)/.load-installed: pyproject.toml | $(BIN)/python
	@echo "make: installing the serving side and locust into $(VENV)"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[load]"
	touch $@ $(VENV)/.serve-installed

# Everything: the export extra (torch pinned first), load tests and test tools, and, when
# missing, redis-server (Debian package; the Redis buffer's tests start their own) and
# promtool (Debian's prometheus package, without its recommended exporters, for the tests of
# k8s/monitoring and k8s/rl/dashboards; on a systemd host the service it starts is stopped).
# Without root, a missing tool stops here with the command that installs it.
$(VENV)/.test-installed: pyproject.toml | $(BIN)/python
	@echo "make: installing everything the tests need into $(VENV) (several minutes the first time)"
	command -v redis-server >/dev/null || $(APT_INSTALL) redis-server
	command -v promtool >/dev/null || { $(APT_INSTALL) prometheus && { systemctl disable --now prometheus 2>/dev/null || true; }; }
	$(BIN)/python -m pip install --quiet --disable-pip-version-check $(TORCH_FROM) "$(TORCH)"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[export,loop,cache,load,test]"
	touch $@ $(VENV)/.serve-installed $(VENV)/.demo-installed $(VENV)/.load-installed

# apt-get as root (without recommended packages); anyone else is told what to install (the
# package names are Debian's).
APT_INSTALL = sh -c 'if [ "$$(id -u)" != 0 ]; then echo "make: the tests need $$*, which is not installed; as root: apt-get install $$* (or your system'"'"'s package), then run make again" >&2; exit 1; fi; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$$@"' apt-install

serve: $(VENV)/.serve-installed
	$(BIN)/rlserve serve --model-repository $(DEMO_REPOSITORY) --host $(HOST) --port $(PORT) --grpc-port $(GRPC_PORT)

lint: $(VENV)/.test-installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-logo --no-cache

typecheck: $(VENV)/.test-installed
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

check: lint typecheck unit

unit: $(VENV)/.test-installed
	$(BIN)/python -m pytest -q $(UNIT_TESTS) $(PYTEST_ARGS)

bench: $(VENV)/.test-installed
	$(BIN)/python -m bench

# The GPU path measured (docs/benchmarks.md): on a machine with an NVIDIA GPU, in a venv of
# its own (.cache/gpu-venv, onnxruntime-gpu as docker/Dockerfile.gpu installs it); exit 2
# without a GPU.
bench-gpu:
	bash bench/gpu.sh

# The chaos suite's full form (docs/chaos.md): gunicorn with 2 workers on a copy of the demo
# repository, 60 s of locust load while every fault is injected; exits 1 when a gate fails.
chaos: $(VENV)/.test-installed
	$(BIN)/python -m loadtests.chaos --start-server --model-repository $(DEMO_REPOSITORY) --duration 60

# Regenerate the gRPC modules of serve/frontends/oip/proto from its .proto files (grpcio-tools
# and mypy-protobuf from the test extra); the generated files are checked in.
proto: $(VENV)/.test-installed
	$(BIN)/python -m serve.frontends.oip.proto.generate

demo: $(VENV)/.demo-installed
	$(BIN)/python examples/train_cartpole.py

# The locust gates against a server you started (docs/loadtests.md); HOST and PORT as above.
loadtest: $(VENV)/.load-installed
	$(BIN)/locust -f loadtests/ --host http://$(HOST):$(PORT) --headless -u 8 -t 30s

# The commit-msg hook of .githooks (a subject of at most 72 characters, a blank line, the
# body): git runs it on every commit in this clone once installed.
hooks:
	git config core.hooksPath .githooks

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
