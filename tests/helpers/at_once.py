"""Independent real-process tests of one module run at once, in threads of the pytest process.

Such a test spends its time waiting on its own `grpokit train` processes (one torch thread each,
``train.threads=1``), so on 2 cores two of them take little more than one. Its whole body becomes a
scenario: a module-scoped fixture starts every scenario whose test this session runs (``-k`` picks
as usual) when the first of them needs it, and each test then waits for its own one, re-raising what it
raised (the assertion with its traceback): each test still passes or fails on its own assertions.
A scenario gets its own folder and may use only session or module fixtures (no capsys, monkeypatch)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest


def started(request: pytest.FixtureRequest, scenarios: dict[str, Callable[[], object]]) -> Iterator[dict[str, Future]]:
    """Starts the scenarios of ``request``'s module that this session runs, keyed by their test's name
    (``request.node.name`` inside the test, e.g. ``test_x[15]``); yields their futures, and at the
    module's end waits for every one (no process outlives the module)."""
    wanted = {item.name for item in request.session.items if getattr(item, "module", None) is request.module}
    chosen = {name: run for name, run in scenarios.items() if name in wanted}
    pool = ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2), thread_name_prefix="scenario")
    try:
        yield {name: pool.submit(run) for name, run in chosen.items()}
    finally:
        pool.shutdown(wait=True)


def outcome(futures: dict[str, Future], request: pytest.FixtureRequest) -> object:
    """This test's scenario's result, or what it raised, raised here."""
    return futures[request.node.name].result()
