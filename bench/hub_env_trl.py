"""One verifiers environment trained by grpokit and by TRL 1.16's ``environment_factory``.

The environment is bench/hub_verifiers_calc.py's (a verifiers Taskset of two-digit
multiplications, its ``@vf.reward`` ``correct``, its ``@vf.tool`` ``calculator`` Toolset), passed the
same way to both trainers: the tasks as a chat dataset (``taskset_rows``, the prompt as one user
message), the rubric as the reward functions (``rubric_rewards``), the toolset as the
``environment_factory`` class (``toolset_environment``). Both train the same pre-warmed
chat-template model (bench/calc_chat_model.py, built on first use) from the same ``GRPOConfig``
arguments: ``trl.GRPOTrainer`` is TRL, ``grpokit.trl.GRPOTrainer`` is grpokit behind TRL's API.

Each run is its own process (imports and start-up counted in its wall time), in the order given;
held-out success before and after is measured by one evaluator for both sides (grpokit's greedy
episode loop, the chat template's tool calls, the rubric's ``correct``).

    PYTHONPATH=src python bench/hub_env_trl.py [--steps 60] [--runs grpokit:0,trl:0,trl:1,grpokit:1]

Prints one JSON line per run and a summary line, with the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def shared_args(steps: int, seed: int, out: str) -> dict:
    """The GRPOConfig arguments both trainers get: P=16 prompts of G=8 episodes a step, one
    optimizer step per batch, AdamW at 3e-4 (TRL's linear decay), temperature 1, an episode of at
    most 32 tokens (tool replies included, TRL's max_completion_length) and 3 tool rounds."""
    return dict(
        output_dir=out,
        per_device_train_batch_size=128,
        num_generations=8,
        gradient_accumulation_steps=1,
        learning_rate=3e-4,
        max_steps=steps,
        temperature=1.0,
        max_completion_length=32,
        max_tool_calling_iterations=3,
        gradient_checkpointing=False,
        seed=seed,
        logging_steps=5,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        disable_tqdm=True,
    )


def environment(steps: int, seed: int, n_held_out: int):
    """(train rows, held-out rows, reward functions, environment class): the verifiers environment."""
    from grpokit.data.tasks import calculator as calc
    from grpokit.env.hubs.verifiers_env import rubric_rewards, taskset_rows, toolset_environment
    from hub_verifiers_calc import Calculator, taskset

    def chat(ts):
        return [{**r, "prompt": [{"role": "user", "content": r["prompt"]}]} for r in taskset_rows(ts)]

    train, held_out = taskset(calc.train_rows(steps * 16, seed=seed)), taskset(calc.held_out_rows(n_held_out))
    return chat(train), chat(held_out), rubric_rewards(train), toolset_environment(Calculator)


def evaluate(model, tok, rows, reward, env_cls) -> dict:
    """Greedy held-out success (the rubric's ``correct`` is 1), tool use and turns: grpokit's
    episode loop with the chat template's calls, up to 4 turns and 32 tokens an episode."""
    import torch

    from grpokit.config.io import apply_overrides
    from grpokit.config.sections import Config
    from grpokit.data import to_prompts
    from grpokit.rewards import RewardRunner, RewardSpec
    from grpokit.rollout.sampling import SamplingParams
    from grpokit.train import episode_setup
    from grpokit.train.evaluate import evaluate as run_eval

    cfg = apply_overrides(
        Config(), ["data.task=", "env.tool_format=chat_template", "env.max_turns=4", "env.max_episode_tokens=32"]
    )
    runner = episode_setup.episode_runner(cfg, tok, None, env_cls)
    prompts = to_prompts(rows, tok, cfg.data)
    with RewardRunner([RewardSpec(fn=reward, name="correct")], num_workers=0) as rr, torch.no_grad():
        res = run_eval(
            model,
            tok,
            prompts,
            rr,
            params=SamplingParams(max_new_tokens=32, temperature=0.0),
            eos_token_ids={tok.eos_token_id},
            episodes=runner,
        )
    return {k: round(res[k], 3) for k in ("accuracy", "tool_use_rate", "turns_mean")}


def one_run(side: str, steps: int, seed: int, folder: Path, n_held_out: int) -> dict:
    """Train ``side`` once; its held-out figures before and after, and its training wall time."""
    import datasets
    from transformers import AutoModelForCausalLM

    from calc_chat_model import load_tokenizer

    if side == "trl":
        from trl import GRPOConfig, GRPOTrainer
    else:
        from grpokit.trl import GRPOConfig, GRPOTrainer
    train_rows, held_out, rewards, env_cls = environment(steps, seed, n_held_out)
    tok = load_tokenizer(folder)
    before = evaluate(AutoModelForCausalLM.from_pretrained(folder), tok, held_out, rewards[0], env_cls)
    start = time.time()
    trainer = GRPOTrainer(
        model=str(folder),
        reward_funcs=rewards,
        args=GRPOConfig(**shared_args(steps, seed, f"/tmp/envcmp/{side}-{seed}")),
        train_dataset=datasets.Dataset.from_list(train_rows),
        processing_class=tok,
        environment_factory=env_cls,
    )
    trainer.train()
    train_s = time.time() - start
    after = evaluate(trainer.model, tok, held_out, rewards[0], env_cls)
    curve = [  # [step, mean reward, tool calls per episode] of the training batches, as each trainer logged them
        [e["step"], round(e["reward"], 3), round(e.get("tools/call_frequency", float("nan")), 3)]
        for e in trainer.state.log_history
        if "reward" in e
    ]
    return {
        "side": side,
        "seed": seed,
        "steps": steps,
        "train_wall_s": round(train_s, 1),
        "before": before,
        "after": after,
        "train_reward_curve": curve,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--runs", default="grpokit:0,trl:0,trl:1,grpokit:1", help="side:seed, in order")
    p.add_argument("--held-out", type=int, default=500, help="held-out tasks evaluated before and after")
    p.add_argument("--model", type=Path, default=None, help="model folder (default: built by calc_chat_model)")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # side:seed, in this process
    a = p.parse_args()
    from calc_chat_model import DEFAULT_DIR, ensure

    folder = a.model or ensure(DEFAULT_DIR)
    if a.one:
        side, seed = a.one.split(":")
        print(json.dumps(one_run(side, a.steps, int(seed), folder, a.held_out)), flush=True)
        return
    load_start, results = os.getloadavg(), []
    for run in a.runs.split(","):
        start = time.time()
        cmd = [sys.executable, str(Path(__file__).resolve()), "--steps", str(a.steps), "--model", str(folder)]
        cmd += ["--held-out", str(a.held_out)]
        proc = subprocess.run(cmd + ["--one", run], capture_output=True, text=True, env={**os.environ})
        if proc.returncode != 0:
            print(json.dumps({"run": run, "error": proc.stderr.strip().splitlines()[-1:]}), flush=True)
            results.append({"run": run, "failed": proc.stderr[-4000:]})
            continue
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        res["process_wall_s"] = round(time.time() - start, 1)
        print(json.dumps(res), flush=True)
        results.append(res)
    print(json.dumps({"load_avg_start": load_start, "load_avg_end": os.getloadavg(), "runs": len(results)}))


if __name__ == "__main__":
    main()
