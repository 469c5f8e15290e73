# The two entry points of the README. Both set everything up first (cheap when already done).
.PHONY: setup train test fuzz
setup:
	@bash scripts/setup.sh

train: setup
	.venv/bin/grpokit train

test: setup
	@bash scripts/install_test_deps.sh
	.venv/bin/python -m pytest -q

# The long soak of the property-based fault suite (docs/FAULTS.md): thousands of generated config
# values and data files per property instead of the few dozen `make test` runs.
fuzz: setup
	GRPOKIT_FUZZ=soak .venv/bin/python -m pytest -q tests/test_faults_fuzz.py
