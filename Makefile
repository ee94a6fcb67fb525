# Each target is one line of real work; see README.md.
PYTHON ?= $(if $(wildcard .venv/bin/python),.venv/bin/python,python3)

.PHONY: setup lab test gpu-check gpu-validate gpu-lane gpu-results gpu-candidates gpu-round profile sass exercises notebooks bench results

.venv/.installed: pyproject.toml .ci/constraints.txt  # the course's environment, made once: torch, then nvcc's wheels of torch's CUDA
	python3 -m venv .venv && .venv/bin/python -m pip install -q -c .ci/constraints.txt -e . && .venv/bin/python -m mla_lab toolkit install && touch $@

setup: .venv/.installed

lab: setup  # open the course: JupyterLab at the repository root, on notebooks/ (--allow-root only for root, as in cloud containers)
	.venv/bin/jupyter lab --ServerApp.root_dir=$(CURDIR) notebooks/00_setup.ipynb $(if $(filter 0,$(shell id -u)),--allow-root)

test: setup  # CPU tests, every .cu compiled with nvcc, nbval over the notebooks (GPU tests run if there is a GPU)
	.venv/bin/python -m pytest

# SITTING=SECONDS (make gpu-results SITTING=570): the time the machine is lent for (mla_lab/gpu_check.py)
SITTING_FLAG = $(if $(SITTING),--sitting $(SITTING))

gpu-check:  # on a GPU machine, the whole validation (build, check, GPU tests, grader, sanitizers, bench, notebooks, nbval), ending with a table
	$(PYTHON) -m mla_lab gpu-check $(SITTING_FLAG)

gpu-validate:  # its first part: every step checked, the GPU tests, the grader over solutions and stubs, compute-sanitizer's four tools
	$(PYTHON) -m mla_lab gpu-check validate $(SITTING_FLAG)

gpu-lane:  # the sanitizer lane (python -m mla_lab grade exNN --sanitize) over every solution and every stub
	$(PYTHON) -m mla_lab gpu-check lane $(SITTING_FLAG)

gpu-results:  # its last part: the sweep into results/, the README table and plots, the stored profiles, every notebook executed, nbval
	$(PYTHON) -m mla_lab gpu-check results $(SITTING_FLAG)

gpu-candidates:  # each prepared change in kernels/candidates/ applied to its step, checked on the shape matrix, timed beside it, eager and cuBLAS, and kept or rejected by its own rule; each probe timed unchecked
	$(PYTHON) -m mla_lab candidates

gpu-round:  # kernels/candidates/ landed: kept diffs and the candidates their rules keep applied here (copies in build/gpu-round/), the steps they change checked, sanitized and tested, then gpu-results; a later sitting replays and goes on. Then, where it was prepared: python -m mla_lab candidates --replay
	$(PYTHON) -m mla_lab gpu-check round results $(SITTING_FLAG)

profile:  # on a GPU whose counters can be read: Nsight Compute on every step at the toy and V2-Lite 4096 (both dtypes) and 1 and 16 bf16 decode tokens, into results/profiles/
	$(PYTHON) -m mla_lab profile

sass:  # each step's machine code against another commit's (REV=HEAD by default): what a change left as it was
	$(PYTHON) -m mla_lab sass --against $(or $(REV),HEAD)

exercises:  # regenerate exercises/ from solutions/ (an edited exercise is kept unless FORCE=--force)
	$(PYTHON) -m mla_lab exercises $(FORCE)

notebooks:  # re-execute every notebook in place on a GPU machine, so stored outputs are a real run
	MLA_LAB_EXERCISE_SOURCE=solution $(PYTHON) -m mla_lab notebooks

bench:  # on a GPU machine: the benchmark sweep (every step and peer, checked, timed) into results/<device>.json
	$(PYTHON) -m mla_lab bench --command-line "make bench"

results:  # the README results table and the plots in results/, made from results/*.json
	$(PYTHON) -m mla_lab results
