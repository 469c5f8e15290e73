"""Shared test helpers: fixtures' building blocks, fakes and reference implementations.

Test modules import from here (``from helpers.runs import make``), never from one another; pytest puts
``tests/`` on the path (pyproject's ``pythonpath``), and tests/conftest.py holds the shared fixtures.
"""
