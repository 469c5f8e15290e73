"""A TRL GRPO LoRA script: plain-text prompts (no chat template, as TRL), the quickstart's
length reward, a PEFT LoraConfig.

tests/trl/test_trl_scripts.py runs this file as it is under TRL and, with only the import line changed,
under grpokit (GRPO_MODEL and GRPO_OUT point it at a tiny local model and a run folder).
"""

import os

from datasets import Dataset
from peft import LoraConfig

from trl import GRPOConfig, GRPOTrainer

MODEL = os.environ.get("GRPO_MODEL", "Qwen/Qwen2-0.5B-Instruct")

dataset = Dataset.from_dict({"prompt": [f"{a}+{b}=" for a in range(10) for b in range(3)]})


def reward_len(completions, **kwargs):
    return [-abs(5 - len(completion)) for completion in completions]


training_args = GRPOConfig(
    output_dir=os.environ.get("GRPO_OUT", "Qwen2-0.5B-GRPO-LoRA"),
    max_steps=2,
    per_device_train_batch_size=4,
    num_generations=4,
    max_completion_length=8,
    learning_rate=1e-4,
    logging_steps=1,
    use_cpu=True,
)
peft_config = LoraConfig(
    r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"
)
trainer = GRPOTrainer(
    model=MODEL,
    reward_funcs=reward_len,
    args=training_args,
    train_dataset=dataset,
    peft_config=peft_config,
)
trainer.train()
trainer.save_model(training_args.output_dir)
