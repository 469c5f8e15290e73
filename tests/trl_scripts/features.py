"""TRL features, each a few lines as TRL 1.16's GRPO documentation writes them, run one after another.

tests/trl/test_trl_scripts.py runs this file as it is under TRL and, with only the import line changed,
under grpokit; both write what each feature produced (step count, log_history keys per entry, the
checkpoints, losses) to GRPO_REPORT as JSON and the test compares the two. GRPO_MODEL is a tiny local
model with a character tokenizer; GRPO_OUT a scratch folder.
"""

import json
import os
import sys

from datasets import Dataset
from transformers import TrainerCallback

from trl import GRPOConfig, GRPOTrainer

MODEL, OUT = os.environ["GRPO_MODEL"], os.environ["GRPO_OUT"]
rows = [{"prompt": f"{a}+{b}=", "solution": str(a + b)} for a in range(1, 9) for b in range(1, 4)]
dataset = Dataset.from_list(rows)
report = {}


def accuracy(completions, solution, **kwargs):
    return [1.0 if c.strip() == s else 0.0 for c, s in zip(completions, solution)]


def length_reward(completions, **kwargs):
    return [len(c) / 10 for c in completions]


def config(name, **kwargs):
    base = dict(
        output_dir=os.path.join(OUT, name),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        max_steps=2,
        logging_steps=1,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
    )
    return GRPOConfig(**{**base, **kwargs})


def summary(trainer, **extra):
    return {
        "global_step": trainer.state.global_step,
        "entries": [sorted(h) for h in trainer.state.log_history],
        **extra,
    }


class Steps(TrainerCallback):
    def __init__(self):
        self.ends, self.logs = [], []

    def on_step_end(self, args, state, control, **kwargs):
        self.ends.append(state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(state.global_step)


# 1. num_iterations: every update is a step, as are logging and callbacks
steps = Steps()
t = GRPOTrainer(
    MODEL,
    reward_funcs=[accuracy, length_reward],
    args=config("iterations", num_iterations=2),
    train_dataset=dataset,
    callbacks=[steps],
)
t.train()
report["iterations"] = summary(t, step_ends=steps.ends, logs=steps.logs)

# 2. logging every 2 steps, the first step too; run_name and non-reentrant checkpointing
t = GRPOTrainer(
    MODEL,
    reward_funcs=accuracy,
    train_dataset=dataset,
    args=config(
        "logging",
        max_steps=3,
        logging_steps=2,
        logging_first_step=True,
        run_name="tiny-run",
        gradient_checkpointing_kwargs={"use_reentrant": False},
    ),
)
t.train()
report["logging"] = summary(t)

# 3. evaluation during training and on demand, with its own batch size
eval_dataset = Dataset.from_list(rows[:4])
t = GRPOTrainer(
    MODEL,
    reward_funcs=accuracy,
    train_dataset=dataset,
    eval_dataset=eval_dataset,
    args=config("eval", eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=4),
)
t.train()
metrics = t.evaluate()
report["eval"] = summary(t, evaluate=sorted(metrics))

# 4. checkpoints every step
t = GRPOTrainer(
    MODEL, reward_funcs=accuracy, train_dataset=dataset, args=config("save", save_strategy="steps", save_steps=1)
)
t.train()
report["save"] = summary(
    t,
    checkpoints=sorted(d for d in os.listdir(t.args.output_dir) if d.startswith("checkpoint-")),
    state_steps=json.load(open(os.path.join(t.args.output_dir, "checkpoint-2", "trainer_state.json")))["global_step"],
)


# 5. a rollout_func with fixed completions: both libraries see the same tokens, so the first loss is the same
def rollout_func(prompts, trainer):
    tok = trainer.processing_class
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    texts = ["1", "22", "333", "4444"]
    comps = [tok(texts[i % 4], add_special_tokens=False)["input_ids"] for i in range(len(prompts))]
    return {"prompt_ids": ids, "completion_ids": comps, "logprobs": [[-1.0] * len(c) for c in comps]}


t = GRPOTrainer(
    MODEL,
    reward_funcs=length_reward,
    train_dataset=dataset,
    rollout_func=rollout_func,
    args=config("rollout", max_steps=1, bf16=False),
)  # TRL's default autocasts to bfloat16 even on the CPU
t.train()
first = t.state.log_history[0]
report["rollout"] = summary(t, loss=first["loss"], grad_norm=first["grad_norm"], reward=first["reward"])

# 6. TRL's trainer surface after training
cb = t.pop_callback(Steps)
t.add_callback(Steps)
t.remove_callback(Steps)
t.log({"custom": 1.0})
report["surface"] = {"last": sorted(t.state.log_history[-1]), "popped": cb is None}

# 7. one generation batch feeds two optimizer steps (a group of 4 split over two steps of 2 completions)
t = GRPOTrainer(
    MODEL,
    reward_funcs=accuracy,
    train_dataset=dataset,
    args=config("generation", per_device_train_batch_size=2, steps_per_generation=2, max_steps=4),
)
t.train()
report["steps_per_generation"] = summary(t)
t = GRPOTrainer(
    MODEL,
    reward_funcs=accuracy,
    train_dataset=dataset,
    args=config("generation_batch", per_device_train_batch_size=2, generation_batch_size=8, max_steps=4),
)
t.train()
report["generation_batch_size"] = summary(t)

# 9. TRL 1.16's other loss types and reward aggregation, on the fixed completions of 5: the same first loss
for name, kwargs in {
    "luspo": dict(loss_type="luspo", importance_sampling_level="sequence"),
    "vespo": dict(loss_type="vespo"),
    "delta": dict(delta=1.5),
    "normalize_then_sum": dict(multi_objective_aggregation="normalize_then_sum"),
}.items():
    t = GRPOTrainer(
        MODEL,
        reward_funcs=[length_reward, accuracy],
        train_dataset=dataset,
        rollout_func=rollout_func,
        args=config(name, max_steps=1, bf16=False, **kwargs),
    )
    t.train()
    first = t.state.log_history[0]
    report[name] = summary(t, loss=first["loss"], reward=first["reward"])

# 10. more TRL arguments (adaptive entropy, NEFTune, best model, ...): the same steps and log_history keys
# (the first loss too where the math is shared)
for name, kwargs in {
    "adaptive_entropy": dict(use_adaptive_entropy=True),
    "cast_lm_head_to_fp32": dict(cast_lm_head_to_fp32=True),
    "cispo_default_cap": dict(loss_type="cispo"),
}.items():
    t = GRPOTrainer(
        MODEL,
        reward_funcs=[length_reward, accuracy],
        train_dataset=dataset,
        rollout_func=rollout_func,
        args=config(name, max_steps=1, bf16=False, **kwargs),
    )
    t.train()
    first = t.state.log_history[0]
    report[name] = summary(t, loss=first["loss"], reward=first["reward"])
t = GRPOTrainer(MODEL, reward_funcs=accuracy, train_dataset=dataset, args=config("neftune", neftune_noise_alpha=5.0))
t.train()
report["neftune"] = summary(t)  # the noise is random: steps and keys only
t = GRPOTrainer(
    MODEL,
    reward_funcs=accuracy,
    train_dataset=dataset,
    args=config("save_only_model", save_strategy="steps", save_steps=1, save_only_model=True),
)
t.train()
ckpt = os.path.join(t.args.output_dir, "checkpoint-2")
report["save_only_model"] = summary(
    t,
    checkpoints=sorted(d for d in os.listdir(t.args.output_dir) if d.startswith("checkpoint-")),
    optimizer_saved=any(f.startswith("optimizer") for f in os.listdir(ckpt)),
)
t = GRPOTrainer(
    MODEL,
    reward_funcs=accuracy,
    train_dataset=dataset,
    eval_dataset=eval_dataset,
    args=config(
        "best",
        eval_strategy="steps",
        eval_steps=1,
        save_strategy="steps",
        save_steps=1,
        per_device_eval_batch_size=4,
        load_best_model_at_end=True,
        metric_for_best_model="reward",
    ),
)
t.train()  # the tiny model never answers right: every eval_reward is 0, so the first checkpoint stays the best
report["load_best_model_at_end"] = summary(t, best=os.path.basename(t.state.best_model_checkpoint or ""))
t = GRPOTrainer(
    MODEL,
    reward_funcs=accuracy,
    train_dataset=dataset,
    eval_dataset=eval_dataset,
    args=config(
        "eval_delay", max_steps=3, eval_strategy="steps", eval_steps=1, eval_delay=2, per_device_eval_batch_size=4
    ),
)
t.train()
report["eval_delay"] = summary(t)


# 11. steps_per_generation not a multiple of gradient_accumulation_steps: an optimizer step spans two generation
# batches (A0 A1 A2 | A3 B0 B1 | B2 B3 C0); the callbacks' order and steps, and where max_steps ends the run
class Events(TrainerCallback):
    def __init__(self):
        self.seen = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.seen.append(["begin", state.global_step])

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.seen.append(["optimizer", state.global_step])

    def on_step_end(self, args, state, control, **kwargs):
        self.seen.append(["end", state.global_step])


for max_steps in (2, 3):
    steps, events = Steps(), Events()
    t = GRPOTrainer(
        MODEL,
        reward_funcs=accuracy,
        train_dataset=dataset,
        callbacks=[steps, events],
        args=config(
            f"rolling{max_steps}",
            per_device_train_batch_size=2,
            steps_per_generation=4,
            gradient_accumulation_steps=3,
            max_steps=max_steps,
        ),
    )
    t.train()
    report[f"rolling_window_{max_steps}"] = summary(t, step_ends=steps.ends, logs=steps.logs, events=events.seen)
steps, events = Steps(), Events()  # one generation batch a micro-step, two an optimizer step: A0 B0 | C0 D0
t = GRPOTrainer(
    MODEL,
    reward_funcs=accuracy,
    train_dataset=dataset,
    callbacks=[steps, events],
    args=config("rolling_two_batches", steps_per_generation=1, gradient_accumulation_steps=2),
)
t.train()
report["rolling_window_two_batches"] = summary(t, step_ends=steps.ends, logs=steps.logs, events=events.seen)

# 8. a value no run can use
try:
    GRPOTrainer(MODEL, reward_funcs=accuracy, train_dataset=dataset, args=config("bad", num_generations=1))
    report["bad"] = "accepted"
except Exception as e:
    report["bad"] = "ValueError" if isinstance(e, ValueError) else type(e).__name__

json.dump(report, open(os.environ["GRPO_REPORT"], "w"), indent=1)
sys.exit(0)
