"""Real `grpokit train` processes for the fault tests (signals, kills, a second writer): a tiny
deterministic run on the 2-layer test model, started as a subprocess, waited on by its records."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from safetensors.torch import load_file

REWARD = """
import os, pathlib, time

def likes_a(prompts, completions, **kwargs):
    hang = os.environ.get("HANG_AT_CALL")  # a rollout that hangs: the victim of a preemption test
    if hang:
        marker = pathlib.Path("calls")
        calls = int(marker.read_text()) + 1 if marker.exists() else 1
        marker.write_text(str(calls))
        if calls == int(hang):
            pathlib.Path("hanging").write_text("")
            time.sleep(600)
    return [min(1.0, c.count("a") / 3) for c in completions]
"""
VOLATILE = ("time/", "tokens_per_second", "rollout/tokens_per_second")
STEPS = 6


def write_setup(tmp: Path, model_dir: Path, rollout: dict | None = None, **train) -> Path:
    """A config for a 6-step deterministic run (one reward call per step) that saves only at its end;
    ``rollout`` adds fields to its rollout section (e.g. ``{"async_staleness": 1}``)."""
    (tmp / "myrewards.py").write_text(REWARD)
    data = tmp / "train.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": p, "answer": "a"}) + "\n" for p in ("ab", "cd", "ef", "gh", "ij", "12"))
    )
    opts = {
        "steps": STEPS,
        "prompts_per_step": 2,
        "save_every": 1000,
        "threads": 1,
        "deterministic": True,
        "micro_batch_size": 4,
        **train,
    }
    cfg = tmp / "cfg.yaml"
    cfg.write_text(f"""
model: {{name_or_path: "{model_dir}"}}
data: {{task: "", dataset: "{data}", eval_size: 0}}
reward: {{functions: ["myrewards:likes_a"], timeout_s: 300}}
rollout: {json.dumps({"group_size": 4, "max_new_tokens": 6, **(rollout or {})})}
algo: {{beta: 0.04, num_iterations: 2}}
optim: {{lr: 0.01, warmup_steps: 2, schedule: cosine}}
train: {json.dumps(opts)}
record: {{sinks: [], report: false}}
""")
    return cfg


def _default_stop_signals() -> None:
    """In the child before exec: the stop signals at their default action, as a shell starts a command
    (a suite run under ``nohup`` would otherwise hand every run an ignored SIGHUP, which grpokit keeps)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def start(args, tmp: Path, env: dict | None = None, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{tmp}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **(env or {})}
    kw.setdefault("preexec_fn", _default_stop_signals)
    return subprocess.Popen(
        [sys.executable, "-m", "grpokit.cli", "train", *args],
        env=env,
        cwd=tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def wait_for(predicate, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert proc.poll() is None, f"the run ended first: {proc.communicate()[1][-2000:]}"
        assert time.time() < deadline, "timed out waiting for the run"
        time.sleep(0.02)


def logged_steps(run: Path) -> list[int]:
    f = run / "metrics.jsonl"
    return [json.loads(line)["step"] for line in f.read_text().splitlines()] if f.exists() else []


def final_state(run: Path, step: int = STEPS):
    weights = load_file(str(run / "checkpoints" / f"step-{step:06d}" / "model" / "model.safetensors"))
    metrics = [
        {k: v for k, v in json.loads(line).items() if not k.startswith(VOLATILE)}
        for line in (run / "metrics.jsonl").read_text().splitlines()
    ]
    return weights, metrics


def grpokit_train(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m grpokit train *args`` run to its end in ``cwd``, which is importable (a reward or
    environment module written there is found by its dotted name); stdout and stderr captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "grpokit", "train", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), *sys.path])},
    )
