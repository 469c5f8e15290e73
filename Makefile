# The two entry points of the README. Each sets up what its job needs first (scripts/setup.sh; cheap when
# already done): `make train` only what training needs, `make test` that plus the test suite's packages.
.PHONY: setup setup-test train test
setup:
	@bash scripts/setup.sh train

setup-test:
	@bash scripts/setup.sh test

train: setup
	.venv/bin/grpokit train

test: setup-test
	.venv/bin/ruff format --check --quiet . || { echo 'ruff: run .venv/bin/ruff format'; exit 1; }
	.venv/bin/ruff check --quiet .
	.venv/bin/python -m pytest -q

# Mutation testing of the pure math (src/grpokit/algo/) with mutmut; slow, not part of `make test`.
# Settings in pyproject's [tool.mutmut]; results and the survivors' reasons: docs/MUTATION.md.
.PHONY: mutate
mutate: setup-test
	.venv/bin/python -c 'import mutmut' 2>/dev/null || .venv/bin/python -m pip install -q -e '.[mutate]'
	rm -rf mutants
	OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python -m mutmut run --max-children 2
	.venv/bin/python -m mutmut results

# The long soak of the property-based fault suite (docs/FAULTS.md): thousands of generated config
# values and data files per property instead of the few dozen `make test` runs.
.PHONY: fuzz
fuzz: setup-test
	GRPOKIT_FUZZ=soak .venv/bin/python -m pytest -q tests/project/test_faults_fuzz.py

# Soak-length repeats (tests marked `soak`, deselected by `make test` through pyproject's addopts), then
# the fuzz soak. Pytest's exit status 5 (no test marked) is not a failure.
.PHONY: soak
soak: fuzz
	.venv/bin/python -m pytest -q -m soak || [ $$? -eq 5 ]
