"""A TRL 1.16 vision-language GRPO script (dataset with an image column, a processor as
processing_class) runs under grpokit.trl with only the import changed, and under TRL itself."""

from __future__ import annotations

import importlib

import pytest

from helpers.vision_spy import spy_image_forwards


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


def _evaluate_script(module: str, tmp_path, **extra):
    """A VLM script with image rows as eval_dataset: ``evaluate()``'s metrics and every forward's
    (image tokens, pixel rows) while it ran (before: grpokit.trl's evaluate() refused the rows with
    "the model has no image processor", the processor given as processing_class notwithstanding)."""
    from datasets import Dataset
    from transformers import AutoModelForImageTextToText

    from grpokit.data.tasks import shapes
    from grpokit.data.vision import load_processor

    trl = importlib.import_module(module)
    path = str(shapes.shapes_model_path())
    model = AutoModelForImageTextToText.from_pretrained(path)
    with pytest.MonkeyPatch.context() as mp:
        seen = spy_image_forwards(mp, type(model))
        args = trl.GRPOConfig(
            output_dir=str(tmp_path / module),
            per_device_train_batch_size=4,
            per_device_eval_batch_size=4,
            num_generations=2,
            max_completion_length=6,
            report_to=[],
            use_cpu=True,
            save_strategy="no",
            **{"max_steps": 1, **extra},
        )
        trainer = trl.GRPOTrainer(
            model=model,
            reward_funcs=[shapes.shapes_reward],
            args=args,
            train_dataset=Dataset.from_list(shapes.train_rows(4)),
            eval_dataset=Dataset.from_list(shapes.held_out_rows(4)),
            processing_class=load_processor(path),
        )
        metrics = trainer.train() and trainer.state.log_history if extra else trainer.evaluate()
    return metrics, seen


@pytest.mark.parametrize("module", ["grpokit.trl", "trl"])
def test_evaluate_on_image_rows_sends_the_images(module, tmp_path):
    if module == "trl":
        pytest.importorskip("trl")
    metrics, seen = _evaluate_script(module, tmp_path)
    if module == "grpokit.trl":  # (TRL's generate() hands the images to the model by another route)
        # 4 eval rows, 2 prompts per batch of 4 completions: each prefill 2 x 16 image tokens, 64 patches an image
        assert seen and all(n == 4 * t for t, n in seen if t) and (32, 128) in seen
    assert {"eval_loss", "eval_reward", "eval_rewards/shapes_reward/mean"} <= set(metrics)
    assert 0.0 <= metrics["eval_reward"] <= 1.0


def test_eval_strategy_steps_evaluates_image_rows_at_every_step(tmp_path):
    log, seen = _evaluate_script("grpokit.trl", tmp_path, max_steps=2, eval_strategy="steps", eval_steps=1)
    assert [e["step"] for e in log if "eval_reward" in e] == [1, 2]  # before: the run died after step 1
    assert all(n == 4 * t for t, n in seen if t)


def test_generate_and_score_completions_called_directly_on_image_rows(tmp_path):
    """A subclass calling _generate_and_score_completions itself with TRL's rows (each prompt
    num_generations times): the rows' images go through the processor given as processing_class."""
    from datasets import Dataset
    from transformers import AutoModelForImageTextToText

    from grpokit.data.tasks import shapes
    from grpokit.data.vision import load_processor
    from grpokit.trl import GRPOConfig, GRPOTrainer

    path = str(shapes.shapes_model_path())
    trainer = GRPOTrainer(
        model=AutoModelForImageTextToText.from_pretrained(path),
        reward_funcs=[shapes.shapes_reward],
        args=GRPOConfig(
            output_dir=str(tmp_path / "direct"),
            per_device_train_batch_size=4,
            num_generations=2,
            max_completion_length=4,
            report_to=[],
            use_cpu=True,
        ),
        train_dataset=Dataset.from_list(shapes.train_rows(4)),
        processing_class=load_processor(path),
    )
    rows = [r for r in shapes.train_rows(2, seed=9) for _ in range(2)]
    out = trainer._generate_and_score_completions(rows)
    # 2 prompts x 2 samples, each prompt 16 image tokens (before: "the model has no image processor")
    assert out["completion_ids"].shape[0] == 4
    assert (out["prompt_ids"] == trainer.model.config.image_token_id).sum(dim=1).tolist() == [16] * 4


def _trained(module: str, tmp_path, peft_config=None):
    """One step of a VLM script: (names of the parameters that changed, names of the LoRA-adapted modules)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForImageTextToText

    from grpokit.data.tasks import shapes
    from grpokit.data.vision import load_processor

    trl = importlib.import_module(module)
    path = str(shapes.shapes_model_path())
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(path)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / module),
        max_steps=2,  # measured: after one step TRL 1.16 had moved none of the tower here, after two all of it
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=8,
        report_to=[],
        learning_rate=1e-2,
        use_cpu=True,
        save_strategy="no",
        temperature=1.5,  # varied completions: rewards differ within groups, so there is a gradient
    )
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=[shapes.shapes_reward],
        args=args,
        train_dataset=Dataset.from_list(shapes.train_rows(8)),
        processing_class=load_processor(path),
        peft_config=peft_config,
    )
    adapted = sorted(
        n.replace("base_model.model.", "") for n, _ in trainer.model.named_modules() if n.endswith("lora_A")
    )
    if peft_config is not None:
        return None, adapted
    trainer.train()
    after = dict(trainer.model.named_parameters())
    return {n for n, p in before.items() if not torch.equal(p, after[n].detach())}, adapted


@pytest.mark.parametrize("module", ["grpokit.trl", "trl"])
def test_full_fine_tuning_trains_the_vision_tower_as_trl_does(module, tmp_path):
    """TRL freezes nothing: the tower's 31 parameters change with the rest (before: grpokit.trl froze the
    tower of the user's own model, model.freeze_vision's native default)."""
    if module == "trl":
        pytest.importorskip("trl")
    changed, _ = _trained(module, tmp_path)
    assert sum("visual" in n for n in changed) == 31 and sum("visual" not in n for n in changed) == 26


def test_lora_all_linear_adapts_the_modules_trl_adapts(tmp_path):
    """peft_config LoraConfig(target_modules="all-linear"): the same 24 modules as TRL 1.16 (14 in the
    language model, 10 in the vision tower; before: the language model's 14 only)."""
    pytest.importorskip("trl")
    from peft import LoraConfig

    _, ours = _trained("grpokit.trl", tmp_path, LoraConfig(r=4, target_modules="all-linear"))
    _, theirs = _trained("trl", tmp_path, LoraConfig(r=4, target_modules="all-linear"))
    assert ours == theirs and len(ours) == 24 and sum("visual" in n for n in ours) == 10


@pytest.mark.parametrize("flag", [False, None])
def test_trls_loss_path_with_image_rows_is_refused_before_the_first_step_samples(tmp_path, flag):
    """loss_is_scaled_for_ga not True sends the loss through TRL's path, which cannot rebuild pixel_values: the
    class attribute is known when the run is built, so train() stops before any completion is sampled or scored
    (before: after step 1 had sampled and scored its batch)."""
    from datasets import Dataset
    from transformers import AutoModelForImageTextToText

    from grpokit.config import ConfigError
    from grpokit.data.tasks import shapes
    from grpokit.data.vision import load_processor
    from grpokit.trl import GRPOConfig, GRPOTrainer
    from grpokit.trl.contract.stages import NO_IMAGES

    class Divided(GRPOTrainer):
        loss_is_scaled_for_ga = flag

    scored = []
    path = str(shapes.shapes_model_path())
    trainer = Divided(
        model=AutoModelForImageTextToText.from_pretrained(path),
        reward_funcs=[lambda completions, **kw: scored.append(1) or [0.0] * len(completions)],
        args=GRPOConfig(
            output_dir=str(tmp_path / "out"),
            max_steps=1,
            per_device_train_batch_size=4,
            num_generations=4,
            max_completion_length=4,
            report_to=[],
            use_cpu=True,
            save_strategy="no",
        ),
        train_dataset=Dataset.from_list(shapes.train_rows(4)),
        processing_class=load_processor(path),
    )
    with pytest.raises(ConfigError) as e:
        trainer.train()
    assert str(e.value) == NO_IMAGES and scored == []
