# Each target is one line of real work; see README.md.
PYTHON ?= $(if $(wildcard .venv/bin/python),.venv/bin/python,python3)

.PHONY: setup lab test test-gpu sanitize exercises notebooks bench results

.venv/.installed: pyproject.toml .ci/constraints.txt  # the course's environment, made once
	python3 -m venv .venv && .venv/bin/python -m pip install -q -c .ci/constraints.txt -e . && touch $@

setup: .venv/.installed

lab: setup  # open the course
	.venv/bin/jupyter lab notebooks/

test: setup  # CPU tests, every .cu compiled with nvcc, nbval over the notebooks (GPU tests run if there is a GPU)
	.venv/bin/python -m pytest

test-gpu:  # on a GPU machine: all tests, the notebooks run with the solutions, the grader over every exercise, sanitizers
	MLA_LAB_EXERCISE_SOURCE=solution $(PYTHON) -m pytest && $(PYTHON) -m mla_lab grade --all --variant solution && $(PYTHON) -m mla_lab grade --all --variant exercise --expect-stubs && $(MAKE) sanitize

sanitize:  # compute-sanitizer over every step on small odd shapes (15 min per tool at most; any error or time-out fails). racecheck and synccheck leave out step 6: on its TMA/mbarrier path they never finish, even one block of the smallest shape (kernels/NOTES.md); on steps 9 and 10's they do
	status=0; for tool in memcheck initcheck; do timeout 900 compute-sanitizer --tool $$tool --print-limit 10 --error-exitcode 1 $(PYTHON) -m mla_lab check --quick || status=1; done; \
	for tool in racecheck synccheck; do timeout 900 compute-sanitizer --tool $$tool --print-limit 10 --error-exitcode 1 $(PYTHON) -m mla_lab check --quick 1 2 3 4 5 7 8 9 10 || status=1; done; exit $$status

exercises:  # regenerate exercises/ from solutions/ (an edited exercise is kept unless FORCE=--force)
	$(PYTHON) -m mla_lab exercises $(FORCE)

notebooks:  # re-execute every notebook in place on a GPU machine, so stored outputs are a real run
	MLA_LAB_EXERCISE_SOURCE=solution $(PYTHON) -m mla_lab notebooks

bench:  # on a GPU machine: the benchmark sweep (every step and peer, checked, timed) into results/<device>.json
	$(PYTHON) -m mla_lab bench --command-line "make bench"

results:  # the README results table and the plots in results/, made from results/*.json
	$(PYTHON) -m mla_lab results
