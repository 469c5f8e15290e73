"""The teacher of on-policy distillation (algo.distill_teacher, algo/distill.py): loaded once, frozen,
in the reference model's place, after its tokenizer is checked against the student's.

A teacher scores the student's own token ids, so both must read the same ids the same way: a teacher
with another vocabulary is refused in one sentence (mapping tokens between vocabularies is another
method). The teacher is a model folder (a checkpoint's ``model/``), a named model, or a LoRA adapter
folder (``adapter_config.json``: its base with the adapter merged).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from grpokit.config.base import named_as
from grpokit.config.sections import Config, ConfigError

from .lora import merge_adapters
from .models import load_model, load_tokenizer, model_path


def check_same_tokenizer(teacher_tok, student_tok, name: str) -> None:
    """Refuse a teacher whose vocabulary (token -> id) differs from the student's."""
    t, s = teacher_tok.get_vocab(), student_tok.get_vocab()
    if t != s:
        differ = sum(1 for k, v in s.items() if t.get(k) != v) + sum(1 for k in t if k not in s)
        raise ConfigError(
            f"algo.distill_teacher={name!r} has a different tokenizer ({len(t)} tokens against the student's "
            f"{len(s)}, {differ} differing); a teacher must share the student's tokenizer"
        )


def load_teacher(
    cfg: Config, device: torch.device, dtype: torch.dtype, student_tok, field: str = "algo.distill_teacher"
):
    """The frozen teacher of ``algo.distill_teacher`` on ``device``; its errors name ``field``, the setting
    that gave it (a stage's teacher: ``train.stages[i].teacher``), not the student's model.name_or_path."""
    name = cfg.algo.distill_teacher
    m = dataclasses.replace(
        cfg.model, name_or_path=name, lora_rank=0, gradient_checkpointing=False, quantization="none", compile=False
    )
    with named_as({"model.name_or_path": field, "algo.distill_teacher": field}):  # the loaders speak of the student
        check_same_tokenizer(load_tokenizer(m), student_tok, name)
        path = Path(model_path(name))
        if (path / "adapter_config.json").is_file():
            from peft import AutoPeftModelForCausalLM

            model = merge_adapters(AutoPeftModelForCausalLM.from_pretrained(str(path), dtype=dtype)).to(device)
        else:
            model = load_model(m, device, dtype)
    model.eval()
    for p in model.parameters():  # frozen in place (a copy, as frozen_copy makes of the policy, would double it)
        p.requires_grad_(False)
    return model
