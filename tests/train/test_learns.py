"""The embedded default learns: a short run of the built-in task on the shipped demo model."""

import json

from grpokit.config import Config
from grpokit.config.io import apply_overrides
from grpokit.train import Trainer


def test_builtin_task_reward_and_accuracy_rise(tmp_path):
    cfg = apply_overrides(
        Config(), ["train.steps=20", "data.eval_size=200", "record.sinks=[]", f"train.out={tmp_path / 'run'}"]
    )
    summary = Trainer(cfg, quiet=True).train()
    lines = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    first, last = lines[0]["reward"], sum(l["reward"] for l in lines[-3:]) / 3
    assert summary["eval_before"]["accuracy"] <= 0.5  # the demo model starts honestly imperfect
    assert last > first + 0.2, (first, last)
    assert summary["eval_after"]["accuracy"] >= 0.8, summary
    assert (tmp_path / "run" / "report.html").exists()


def test_trainer_evaluator_equals_the_hf_generate_reference():
    """Fast equals naive: the trainer's greedy evaluation (own decode loop, shared prompt cache,
    finished rows dropped) gives the same accuracy and lengths as the task's model.generate one."""
    from grpokit.config import ModelConfig
    from grpokit.data import to_prompts
    from grpokit.data.tasks import get_task
    from grpokit.rewards import RewardRunner, RewardSpec
    from grpokit.rollout.sampling import SamplingParams
    from grpokit.train.evaluate import evaluate
    from grpokit.train.models import eos_ids, load_model, load_tokenizer

    task = get_task("arithmetic")
    rows = task.held_out_rows(200)
    tok = load_tokenizer(ModelConfig())
    model = load_model(ModelConfig(), "cpu", __import__("torch").float32)
    reference = task.evaluate(model, tok, rows, max_new_tokens=8)
    with RewardRunner([RewardSpec(fn=task.reward_fn, name="acc", weight=1.0)], num_workers=0) as runner:
        ours = evaluate(
            model,
            tok,
            to_prompts(rows, tok, Config().data),
            runner,
            params=SamplingParams(max_new_tokens=8, temperature=0.0),
            eos_token_ids=eos_ids(tok, model),
            batch_size=64,
        )
    assert ours["accuracy"] == reference["accuracy"] and ours["mean_length"] == reference["mean_length"]
