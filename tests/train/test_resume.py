"""A run killed with SIGKILL and resumed ends bit-exactly where an uninterrupted run ends."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

REWARD = """
def likes_a(prompts, completions, **kwargs):
    return [min(1.0, c.count("a") / 3) for c in completions]
"""
VOLATILE = ("time/", "tokens_per_second", "rollout/tokens_per_second")


def write_setup(tmp: Path, model_dir: Path) -> Path:
    (tmp / "myrewards.py").write_text(REWARD)
    data = tmp / "train.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": p, "answer": "a"}) + "\n" for p in ("ab", "cd", "ef", "gh", "ij", "12"))
    )
    cfg = tmp / "cfg.yaml"
    cfg.write_text(f"""
model: {{name_or_path: "{model_dir}"}}
data: {{task: "", dataset: "{data}", eval_size: 0}}
reward: {{functions: ["myrewards:likes_a"]}}
rollout: {{group_size: 4, max_new_tokens: 6}}
algo: {{beta: 0.04, num_iterations: 2}}
optim: {{lr: 0.01, warmup_steps: 2, schedule: cosine}}
train: {{steps: 6, prompts_per_step: 2, save_every: 1, threads: 1, deterministic: true, micro_batch_size: 4}}
record: {{sinks: [], report: false}}
""")
    return cfg


def run_cli(args, tmp, **kw):
    env = {**os.environ, "PYTHONPATH": f"{tmp}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen(
        [sys.executable, "-m", "grpokit.cli", "train", *args],
        env=env,
        cwd=tmp,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        **kw,
    )


def final_state(run: Path):
    weights = load_file(str(run / "checkpoints" / "step-000006" / "model" / "model.safetensors"))
    metrics = [
        {k: v for k, v in json.loads(l).items() if not k.startswith(VOLATILE)}
        for l in (run / "metrics.jsonl").read_text().splitlines()
    ]
    return weights, metrics


@pytest.mark.slow
@pytest.mark.parametrize("kill_after_step, extra_delay", [(2, 0.0), (4, 0.35)])
def test_sigkill_then_resume_is_bit_exact(tiny_model_dir, tmp_path, kill_after_step, extra_delay):
    cfg = write_setup(tmp_path, tiny_model_dir)
    ref = run_cli(["--config", str(cfg), "--out", str(tmp_path / "ref")], tmp_path)
    assert ref.wait(timeout=240) == 0, ref.stderr.read().decode()[-2000:]

    victim = run_cli(["--config", str(cfg), "--out", str(tmp_path / "killed")], tmp_path)
    marker = tmp_path / "killed" / "checkpoints" / f"step-{kill_after_step:06d}"
    deadline = time.time() + 240
    while not marker.exists() and victim.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    time.sleep(extra_delay)  # somewhere inside the next step (or its checkpoint write)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL, "the run finished before it could be killed; kill earlier"

    resumed = run_cli(["--resume", str(tmp_path / "killed")], tmp_path)
    assert resumed.wait(timeout=240) == 0, resumed.stderr.read().decode()[-2000:]

    w_ref, m_ref = final_state(tmp_path / "ref")
    w_res, m_res = final_state(tmp_path / "killed")
    assert w_ref.keys() == w_res.keys()
    for k in w_ref:
        assert torch.equal(w_ref[k], w_res[k]), k
    assert m_res == m_ref
