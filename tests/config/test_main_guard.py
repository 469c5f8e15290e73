"""A script that trains at its top level, met by the workers grpokit starts (config/main_guard.py).

Real processes throughout: multiprocessing's "spawn" and "forkserver" run the parent's main script again
in each worker, which is what the guard is about, and no fake of that would show it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src")
TESTS = str(Path(__file__).resolve().parents[1])


def _run(tmp_path: Path, body: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(body)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, TESTS, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=timeout
    )


PROBE = """
import multiprocessing as mp
from grpokit.config.main_guard import reimporting_main, _preparing_on_stack

def refusals():
    out = []
    from grpokit.config import Config
    from grpokit.train import Trainer
    from grpokit.trl import GRPOTrainer
    for build in (lambda: Trainer(Config()), lambda: GRPOTrainer(None)):
        try:
            build()
        except Exception as e:
            out.append(f"{type(e).__name__}: {' '.join(str(e).split()[:7])}")
    return out

if __name__ == "__mp_main__":
    print("importing main", reimporting_main(), _preparing_on_stack(), *refusals(), sep=" | ", flush=True)

def target():
    print("in the target", reimporting_main(), _preparing_on_stack(), sep=" | ", flush=True)

if __name__ == "__main__":
    print("parent", reimporting_main(), _preparing_on_stack(), sep=" | ", flush=True)
    for method in ("spawn", "forkserver"):
        p = mp.get_context(method).Process(target=target)
        p.start()
        p.join()
"""


def test_a_trainer_is_refused_only_while_a_worker_runs_the_main_script_again(tmp_path):
    # both readings (CPython's flag and the call stack) say True exactly while a worker runs the parent's
    # script again, under both start methods grpokit uses; the worker's own target (where a guarded script's
    # sweep may build trainers) and the parent are never refused
    p = _run(tmp_path, PROBE)
    assert p.returncode == 0, p.stderr[-3000:]
    refused = (
        " | ConfigError: a grpokit Trainer was created while a"
        " | ConfigError: GRPOTrainer was created while a worker process"
    )
    assert p.stdout.splitlines() == [
        "parent | False | False",
        "importing main | True | True" + refused,
        "in the target | False | False",
        "importing main | True | True" + refused,
        "in the target | False | False",
    ]


def test_a_script_training_at_its_top_level_with_rollout_workers_stops_with_the_fix_and_no_second_run(
    tiny_model_dir, tmp_path
):
    # before: the worker's copy of the script opened a run of its own (here a second folder under runs/, or
    # the parent's locked one) and the trainer said only that the worker "closed its pipe while starting"
    body = (
        "from helpers.runs import make\n"
        "import sys\n"
        "tr = make(sys.argv[1], '', **{'rollout.async_staleness': 1, 'rollout.async_workers': 1, 'train.steps': 2,\n"
        "                             'data.eval_size': 0})\n"
        "tr.train()\n"
        "print('trained')\n"
    )
    p = _run(tmp_path, body, str(tiny_model_dir))
    assert p.returncode != 0 and "trained" not in p.stdout
    fix = 'put the script\'s work under `if __name__ == "__main__":`'
    assert "ConfigError: a grpokit Trainer was created while a worker process that grpokit started" in p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("grpokit.rollout.async_workers.RolloutWorkerError: rollout worker 0 (pid ")
    assert "while starting" in last and last.endswith(fix)
    assert len(list((tmp_path / "runs").iterdir())) == 1  # the script's own run; the worker made none
