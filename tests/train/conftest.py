"""Fixtures of the fault tests that run real `grpokit train` processes (helpers.train_processes)."""

import pytest

from helpers.train_processes import final_state, finish, start, write_setup


@pytest.fixture(scope="session")
def reference(tiny_model_dir, tmp_path_factory):
    """(weights, metrics) of the uninterrupted run of ``write_setup``'s config: what every stopped, killed,
    locked-out or resumed run of that config must end equal to, bit for bit (run once per session)."""
    tmp = tmp_path_factory.mktemp("reference")
    cfg = write_setup(tmp, tiny_model_dir)
    rc, _, err = finish(start(["--config", str(cfg), "--out", str(tmp / "run")], tmp))
    assert rc == 0, err[-2000:]
    return final_state(tmp / "run")
