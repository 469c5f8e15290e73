"""Ctrl-C twice ends a loaded run within a second, by construction (issue 48: once in two tries a
loaded run was still alive 15 s after the second Ctrl-C). A real `grpokit train` whose step spins in
its reward (Python in the main thread), two CPU hogs beside it, SIGINT, then SIGINT again."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

REWARD = """
import pathlib, time
calls = 0

def spins(completions, **kwargs):
    global calls
    calls += 1
    if calls >= 2:  # inside step 1 (the first call checks the function before training)
        pathlib.Path("busy").write_text("")
        end = time.monotonic() + 120
        while time.monotonic() < end:
            sum(range(1000))
    return [0.0] * len(completions)
"""


def test_the_second_ctrl_c_ends_a_loaded_run_within_a_second(tmp_path):
    (tmp_path / "spin.py").write_text(REWARD)
    rows = [{"question": f"{a}+{a}=", "solution": str(2 * a)} for a in range(10, 14)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    env.pop("GRPOKIT_DEBUG", None)
    args = [
        "data.dataset=train.jsonl",
        "data.prompt_column=question",
        "data.answer_column=solution",
        "reward.functions=[spin:spins]",
        "rollout.group_size=2",
        "train.prompts_per_step=2",
        "rollout.max_new_tokens=4",
        "train.steps=5",
        "train.stop_grace_s=300",  # the first Ctrl-C alone would wait for the step
        "record.sinks=[]",
        "record.report=false",
        "train.threads=1",
        "--out",
        "run",
    ]
    hogs: list[subprocess.Popen] = []
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpokit.cli", "train", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 240
        while not (tmp_path / "busy").exists():
            assert proc.poll() is None and time.monotonic() < deadline, (proc.poll(), out)
            time.sleep(0.1)
        hogs += [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]  # load, from here
        proc.send_signal(signal.SIGINT)
        while not any("stopping" in line for line in out):
            assert proc.poll() is None and time.monotonic() < deadline, out
            time.sleep(0.05)
        time.sleep(0.5)
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
        took = time.monotonic() - start
    finally:
        for p in (*hogs, proc):
            p.kill()
            p.wait()
    err = proc.stderr.read()
    assert code == 130, err
    assert took < 1.0, took
    assert "grpokit: interrupted again: stopped at once, without a checkpoint of the step in progress" in err
    assert "Traceback" not in err
