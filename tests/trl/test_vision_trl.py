"""A TRL 1.16 vision-language GRPO script (dataset with an image column, a processor as
processing_class) runs under grpokit.trl with only the import changed, and under TRL itself."""

from __future__ import annotations

import importlib

import pytest


def _run_script(module: str, tmp_path) -> int:
    from datasets import Dataset
    from transformers import AutoModelForImageTextToText

    from grpokit.data.tasks import shapes
    from grpokit.data.vision import load_processor

    trl = importlib.import_module(module)  # the one line a user changes
    path = str(shapes.shapes_model_path())
    ds = Dataset.from_list(shapes.train_rows(8))  # PIL images become a datasets Image column
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / module),
        max_steps=1,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        report_to=[],
        learning_rate=1e-3,
        use_cpu=True,
        save_strategy="no",
    )
    trainer = trl.GRPOTrainer(
        model=AutoModelForImageTextToText.from_pretrained(path),
        reward_funcs=[shapes.shapes_reward],
        args=args,
        train_dataset=ds,
        processing_class=load_processor(path),
    )
    return trainer.train().global_step


def test_vlm_script_runs_under_grpokit_trl(tmp_path):
    assert _run_script("grpokit.trl", tmp_path) == 1


def test_same_vlm_script_runs_under_trl_itself(tmp_path):
    pytest.importorskip("trl")
    assert _run_script("trl", tmp_path) == 1
