"""A TRL GRPO quickstart-style script: conversational prompts, reward functions written for TRL
(``c[0]["content"]``), extra dataset columns, reward weights, trainer_state and log_metric.

tests/trl/test_trl_scripts.py runs this file as it is under TRL and, with only the import line changed,
under grpokit. GRPO_MODEL / GRPO_OUT / GRPO_PROBE point it at a tiny local model, a run folder and
a JSON file that records what the reward functions received.
"""

import json
import os

from datasets import Dataset

from trl import GRPOConfig, GRPOTrainer

MODEL = os.environ.get("GRPO_MODEL", "Qwen/Qwen2-0.5B-Instruct")
PROBE = os.environ.get("GRPO_PROBE")

rows = [
    {"prompt": [{"role": "user", "content": f"add {a} and {b}"}], "solution": str(a + b), "level": a % 3}
    for a in range(1, 9)
    for b in range(1, 4)
]
dataset = Dataset.from_list(rows)


def accuracy(completions, solution, **kwargs):
    if PROBE and not os.path.exists(PROBE):  # record what TRL's convention hands a reward function
        with open(PROBE, "w") as f:
            json.dump(
                {
                    "keys": sorted(kwargs) + ["completions", "solution"],
                    "completion": completions[0],
                    "prompt": kwargs["prompts"][0],
                    "solution": solution[0],
                    "level": kwargs["level"][0],
                    "n": len(completions),
                    "global_step": kwargs["trainer_state"].global_step,
                    "completion_ids": isinstance(kwargs["completion_ids"][0], list),
                },
                f,
            )
    return [1.0 if c[0]["content"].strip() == s else 0.0 for c, s in zip(completions, solution)]


def brevity(completions, log_metric, **kwargs):
    lengths = [len(c[0]["content"]) for c in completions]
    log_metric("brevity/mean_chars", sum(lengths) / len(lengths))
    return [-0.01 * n for n in lengths]


def level_bonus(prompts, completions, level, **kwargs):
    assert prompts[0][-1]["role"] == "user"
    return [0.1 * lv for lv in level]


training_args = GRPOConfig(
    output_dir=os.environ.get("GRPO_OUT", "Qwen2-0.5B-GRPO"),
    max_steps=2,
    per_device_train_batch_size=4,
    num_generations=4,
    max_completion_length=8,
    learning_rate=1e-5,
    logging_steps=1,
    use_cpu=True,
    reward_weights=[1.0, 0.5, 0.2],
)
trainer = GRPOTrainer(
    model=MODEL,
    reward_funcs=[accuracy, brevity, level_bonus],
    args=training_args,
    train_dataset=dataset,
)
trainer.train()
trainer.save_model(training_args.output_dir)
