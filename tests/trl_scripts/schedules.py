"""Optimizers, learning-rate schedules and epoch strategies, each a few lines as a TRL 1.16 script sets them.

tests/trl/test_trl_scripts.py runs this file as it is under TRL and, with only the import line changed,
under grpokit; both write per feature the step count, the log_history keys, the learning rate and
epoch of every logged step, the evaluated steps and (with a save_strategy) the checkpoints to GRPO_REPORT as JSON, and
the test compares the two. GRPO_MODEL is a tiny local model with a character tokenizer; GRPO_OUT a scratch folder.
"""

import json
import os
import sys

from datasets import Dataset

from trl import GRPOConfig, GRPOTrainer

MODEL, OUT = os.environ["GRPO_MODEL"], os.environ["GRPO_OUT"]
rows = [{"prompt": f"{a}+{b}=", "solution": str(a + b)} for a in range(1, 9) for b in range(1, 4)]
report = {}


def accuracy(completions, solution, **kwargs):
    return [1.0 if c.strip() == s else 0.0 for c, s in zip(completions, solution)]


def config(name, **kwargs):
    base = dict(
        output_dir=os.path.join(OUT, name),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=4,
        max_steps=4,
        logging_steps=1,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        learning_rate=1e-3,
        bf16=False,
    )
    return GRPOConfig(**{**base, **kwargs})


def summary(trainer, **extra):
    history = trainer.state.log_history
    return {
        "global_step": trainer.state.global_step,
        "entries": [sorted(h) for h in history],
        "lr": [[h["step"], h["learning_rate"]] for h in history if "learning_rate" in h],
        "epochs": [[h["step"], round(h["epoch"], 6)] for h in history if "epoch" in h],
        "evals": [h["step"] for h in history if any(k.startswith("eval_") for k in h)],
        **extra,
    }


def train(name, dataset=None, eval_dataset=None, **kwargs):
    t = GRPOTrainer(
        MODEL,
        reward_funcs=accuracy,
        train_dataset=dataset or Dataset.from_list(rows),
        eval_dataset=eval_dataset,
        args=config(name, **kwargs),
    )
    t.train()
    saved = sorted(d for d in os.listdir(t.args.output_dir) if d.startswith("checkpoint-"))
    report[name] = summary(
        t, **({"checkpoints": saved} if t.args.save_strategy != "no" else {})
    )  # grpokit always saves the end


# 1. learning-rate schedules, as open-r1's GRPO recipes set them and as transformers offers them
train(
    "cosine_with_min_lr",
    lr_scheduler_type="cosine_with_min_lr",
    lr_scheduler_kwargs={"min_lr_rate": 0.1},
    warmup_steps=1,
)
train("constant_warmup_ignored", lr_scheduler_type="constant", warmup_steps=2)  # transformers' constant has no warm-up
train(
    "warmup_stable_decay",
    lr_scheduler_type="warmup_stable_decay",
    warmup_steps=1,
    lr_scheduler_kwargs={"num_decay_steps": 2, "min_lr_ratio": 0.1},
)
train(
    "polynomial", lr_scheduler_type="polynomial", warmup_steps=0.25, lr_scheduler_kwargs={"power": 2.0, "lr_end": 1e-5}
)
train("iterations_schedule", num_iterations=2, lr_scheduler_type="cosine")  # 4 TRL steps, 2 sampling rounds, 4 rates

# 2. optimizers other than AdamW
train("adafactor", optim="adafactor", max_steps=2)
train("sgd", optim="sgd", optim_args="momentum=0.9,nesterov=True", max_steps=2)

# 3. epoch strategies: 5 rows, 2 prompts (x G 2 = 4 completions) a step: 2 whole generation batches an epoch
# (the 5th row is dropped, as RepeatSampler does), so 1.5 epochs are ceil(1.5 * 2) = 3 steps: epoch ends at
# steps 2 and 3 (the end)
small = Dataset.from_list(rows[:5])
epochs = dict(dataset=small, max_steps=-1, num_train_epochs=1.5, num_generations=2)
train("save_epoch", save_strategy="epoch", **epochs)
train(
    "eval_log_epoch",
    eval_dataset=Dataset.from_list(rows[:4]),
    eval_strategy="epoch",
    logging_strategy="epoch",
    per_device_eval_batch_size=4,
    **epochs,
)
train("epochs_iterations", save_strategy="epoch", **{**epochs, "num_iterations": 2, "num_train_epochs": 1})

json.dump(report, open(os.environ["GRPO_REPORT"], "w"), indent=1)
sys.exit(0)
