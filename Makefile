# The two entry points of the README. Both set everything up first (cheap when already done).
.PHONY: setup train test
setup:
	@bash scripts/setup.sh

train: setup
	.venv/bin/grpokit train

test: setup
	@bash scripts/install_test_deps.sh
	.venv/bin/python -m pytest -q
