"""A two-stage project as published TRL projects are written (not downloaded: none on PyPI trains on TRL 1.16):
one module that does ``import trl`` and uses ``trl.SFTConfig`` / ``trl.SFTTrainer`` then ``trl.GRPOConfig`` /
``trl.GRPOTrainer``, the GRPO stage starting from the SFT stage's saved model. bench/trl_projects.py runs it
as published (side trl) and with ``import trl`` changed to ``import grpokit.trl as trl`` (side grpokit)."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import TrainerCallback

import trl


class StageLogger(TrainerCallback):
    """The project's own record: each stage's logged losses, written to ``stages.json`` at the end."""

    def __init__(self, stage: str, record: dict):
        self.stage, self.record = stage, record

    def on_train_begin(self, args, state, control, **kwargs):
        self.record[self.stage] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.record[self.stage].append(round(float(logs["loss"]), 6))

    def on_train_end(self, args, state, control, **kwargs):
        Path(args.output_dir, "stages.json").write_text(json.dumps(self.record))


def correct(completions, answer, **kwargs):
    return [float(c[0]["content"].strip() == a) for c, a in zip(completions, answer)]


def run(model_path: str, sft_data, grpo_data, out: Path, steps: int = 2):
    """SFT on ``sft_data``, save, then GRPO from the saved model on ``grpo_data``: the GRPO trainer."""
    record: dict = {}
    common = dict(max_steps=steps, logging_steps=1, report_to="none", use_cpu=True, bf16=False, save_strategy="no")
    sft = trl.SFTTrainer(
        model=model_path,
        train_dataset=sft_data,
        args=trl.SFTConfig(output_dir=str(out / "sft"), per_device_train_batch_size=2, max_length=64, **common),
        callbacks=[StageLogger("sft", record)],
    )
    sft.train()
    sft.save_model(str(out / "sft"))
    grpo = trl.GRPOTrainer(
        model=str(out / "sft"),
        reward_funcs=[correct],
        train_dataset=grpo_data,
        args=trl.GRPOConfig(
            output_dir=str(out / "grpo"),
            per_device_train_batch_size=2,
            num_generations=2,
            max_completion_length=8,
            gradient_checkpointing=False,
            **common,
        ),
        callbacks=[StageLogger("grpo", record)],
    )
    grpo.train()
    return grpo
