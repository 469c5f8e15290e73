# The two entry points of the README. Both set everything up first (cheap when already done).
.PHONY: setup train test
setup:
	@bash scripts/setup.sh

train: setup
	.venv/bin/grpokit train

test: setup
	@bash scripts/install_test_deps.sh
	.venv/bin/ruff format --check --quiet . || { echo 'ruff: run .venv/bin/ruff format'; exit 1; }
	.venv/bin/ruff check --quiet .
	.venv/bin/python -m pytest -q

# Mutation testing of the pure math (src/grpokit/algo/) with mutmut; slow, not part of `make test`.
# Settings in pyproject's [tool.mutmut]; results and the survivors' reasons: docs/MUTATION.md.
.PHONY: mutate
mutate: setup
	.venv/bin/python -c 'import mutmut' 2>/dev/null || .venv/bin/python -m pip install -q -e '.[mutate]'
	rm -rf mutants
	OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python -m mutmut run --max-children 2
	.venv/bin/python -m mutmut results

# The long soak of the property-based fault suite (docs/FAULTS.md): thousands of generated config
# values and data files per property instead of the few dozen `make test` runs.
.PHONY: fuzz
fuzz: setup
	GRPOKIT_FUZZ=soak .venv/bin/python -m pytest -q tests/project/test_faults_fuzz.py
