# Each target is one line of real work; see README.md.
PYTHON ?= python3

.PHONY: setup lab test test-gpu sanitize exercises notebooks

setup:  # a virtual environment with everything, then the package in editable mode
	$(PYTHON) -m venv .venv && .venv/bin/python -m pip install -q -c .ci/constraints.txt -e .

lab: setup
	.venv/bin/jupyter lab notebooks/

test:  # CPU tests, every .cu compiled with nvcc, and nbval over the notebooks
	$(PYTHON) -m pytest

test-gpu:  # on a GPU machine: everything, notebooks run with the solutions, the grader over all
	MLA_LAB_EXERCISE_SOURCE=solution $(PYTHON) -m pytest && $(PYTHON) -m mla_lab grade --all --variant solution && $(PYTHON) -m mla_lab grade --all --variant exercise --expect-stubs && $(MAKE) sanitize

sanitize:  # compute-sanitizer's four tools over every step on small odd shapes
	for tool in memcheck racecheck initcheck synccheck; do compute-sanitizer --tool $$tool --error-exitcode 1 $(PYTHON) -m mla_lab check --quick || exit 1; done

exercises:  # regenerate exercises/ from solutions/ (keeps edited exercises unless FORCE=--force)
	$(PYTHON) -m mla_lab exercises $(FORCE)

notebooks:  # re-execute every notebook in place on a GPU machine (stored outputs = a real run)
	MLA_LAB_EXERCISE_SOURCE=solution $(PYTHON) -m mla_lab notebooks
