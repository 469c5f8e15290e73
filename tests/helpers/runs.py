"""A tiny trainer on a local model: the toy reward, rows and config shared by end-to-end tests, and a run
cut short as if killed (for resume tests)."""

import shutil
from pathlib import Path

from grpokit.config import Config
from grpokit.config.io import apply_overrides
from grpokit.train import Trainer


def likes_a(prompts, completions, **kwargs):
    """1.0 per letter 'a' in the completion, capped at 1 (a toy verifiable reward)."""
    return [min(1.0, c.count("a") / 3) for c in completions]


def has_a(prompts, completions, **kwargs):
    """A binary verifier: 1 when the completion holds an 'a' (ROWS' gold answer), else 0."""
    return [1.0 if "a" in c else 0.0 for c in completions]


def half(prompts, completions, **kwargs):
    """A format bonus every completion earns: 0.5."""
    return [0.5 for _ in completions]


def gold_answer(answer):
    """EDGE-GRPO's renderer (algo.error_correction_fn): the row's gold answer as the completion."""
    return str(answer)


ROWS = [{"prompt": p, "answer": "a"} for p in ("ab", "cd", "ef", "gh", "ij", "12", "34", "56")]


def tiny_cfg(model_dir, out, **over):
    cfg = Config()
    apply_overrides(
        cfg,
        [
            f"model.name_or_path={model_dir}",
            "data.task=",
            "data.dataset=unused.jsonl",
            "reward.functions=[]",
            "rollout.group_size=4",
            "rollout.max_new_tokens=6",
            "train.prompts_per_step=2",
            "train.steps=2",
            "optim.lr=1e-2",
            f"train.out={out}",
            "record.sinks=[]",
            "record.report=false",
            "train.threads=1",
        ]
        + [f"{k}={v}" for k, v in over.items()],
    )
    return cfg


def make(model_dir, out, **over):
    cfg = tiny_cfg(model_dir, out, **over)
    cfg.data.dataset = ""  # rows are passed directly
    return Trainer(cfg, reward_funcs=[likes_a], train_rows=ROWS, eval_rows=ROWS[:4], quiet=True)


def killed_copy(run: Path, to: Path, last_step: int = 4, kept_step: int = 2) -> Path:
    """A copy of the finished ``run`` at ``to`` as if it had been killed after ``kept_step``: the final
    checkpoint (``last_step``) and summary removed, metrics.jsonl cut to its first ``kept_step`` lines."""
    shutil.copytree(run, to)
    shutil.rmtree(to / "checkpoints" / f"step-{last_step:06d}")
    (to / "metrics.jsonl").write_text("".join((to / "metrics.jsonl").read_text().splitlines(keepends=True)[:kept_step]))
    (to / "summary.json").unlink()
    return to
