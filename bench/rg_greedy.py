"""Greedy held-out accuracy of a model on reasoning-gym tasks (docs/TASKS.md's table).

    python bench/rg_greedy.py --model smollm2-135m-instruct --n 32 --max-new-tokens 64 \
        basic_arithmetic chain_sum leg_counting letter_counting spell_backward gcd

Each task runs with its reasoning-gym default config (basic_arithmetic: the smollm2-math preset's
two-operand addition) and grpokit's default instruction, scored by the same evaluator as training
(grpokit.train.evaluate.evaluate with the task's reasoning_gym_accuracy).
"""

from __future__ import annotations

import argparse
import json
import time

from grpokit.config import presets
from grpokit.config.sections import DataConfig, ModelConfig
from grpokit.data.prompts import to_prompts
from grpokit.data.tasks import get_task
from grpokit.rewards.runner import RewardRunner
from grpokit.rewards.spec import RewardSpec
from grpokit.rollout.sampling import SamplingParams
from grpokit.train.evaluate import evaluate
from grpokit.train.models import eos_ids, load_model, load_tokenizer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--n", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("tasks", nargs="+")
    args = p.parse_args()
    import torch

    mcfg = ModelConfig(name_or_path=args.model)
    tok = load_tokenizer(mcfg)
    model = load_model(mcfg, torch.device("cpu"), torch.float32)
    preset = presets.apply("smollm2-math").data
    for name in args.tasks:
        params = dict(preset.task_params) if name == "basic_arithmetic" else {}
        task = get_task(f"reasoning_gym:{name}", params)
        prompts = to_prompts(task.held_out_rows(args.n), tok, DataConfig())
        runner = RewardRunner([RewardSpec(fn=task.reward_fn, name="accuracy", weight=1.0)], num_workers=0)
        t = time.time()
        res = evaluate(
            model,
            tok,
            prompts,
            runner,
            params=SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0),
            eos_token_ids=eos_ids(tok, model),
        )
        print(
            json.dumps(
                {
                    "task": name,
                    "params": params,
                    "n": args.n,
                    "max_new_tokens": args.max_new_tokens,
                    "seconds": round(time.time() - t, 1),
                    **res,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
