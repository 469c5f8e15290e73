"""Where things are: the repository root and the tests folder, wherever a test file sits below tests/."""

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
