"""Real TRL GRPOTrainer runs at CPU size, for the doctor's tests (trainer_state.json, DoctorCallback).

`python tests/helpers/trl_runs.py` regenerates tests/golden/trl_trainer_state.json: TRL's own
trainer_state.json of a 2-step run of the tiny chat model (tests/helpers/trl_models.py) with a reward
that varies (completion length) beside a 0/1 one, kept so the reader's test needs no training run.
"""

from __future__ import annotations

import sys
from pathlib import Path

from datasets import Dataset

PROMPTS = [
    {"prompt": [{"role": "user", "content": f"add {a} and {b}"}], "solution": str(a + b)}
    for a in range(1, 9)
    for b in (1, 2)
]


def exact(completions, solution, **kwargs):
    return [1.0 if c[0]["content"].strip() == s else 0.0 for c, s in zip(completions, solution)]


def brevity(completions, **kwargs):
    return [-0.01 * len(c[0]["content"]) for c in completions]


def always_zero(completions, **kwargs):
    return [0.0 for _ in completions]


def run_trl(model: Path, out: Path, reward_funcs, callbacks=(), steps: int = 2):
    """A real trl.GRPOTrainer run: 4 prompts x 4 completions of 8 tokens per step, on the CPU."""
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        learning_rate=1e-5,
        logging_steps=1,
        use_cpu=True,
        save_strategy="no",
        report_to=[],
        seed=0,
    )
    trainer = GRPOTrainer(
        model=str(model),
        reward_funcs=list(reward_funcs),
        args=args,
        train_dataset=Dataset.from_list(PROMPTS),
        callbacks=list(callbacks),
    )
    trainer.train()
    trainer.state.save_to_json(str(out / "trainer_state.json"))
    return trainer


if __name__ == "__main__":
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from helpers.paths import TESTS
    from helpers.trl_models import make_chat_model

    with tempfile.TemporaryDirectory() as tmp:
        model = make_chat_model(Path(tmp) / "model")
        run_trl(model, Path(tmp) / "run", [exact, brevity])
        text = (Path(tmp) / "run" / "trainer_state.json").read_text()
    (TESTS / "golden" / "trl_trainer_state.json").write_text(text)
    print(TESTS / "golden" / "trl_trainer_state.json")
