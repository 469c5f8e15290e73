"""Shared by the tests of the environment adapters (tests/env/test_hubs_*.py): a tiny tag-format
model with a printable character vocabulary (observations of games and servers are prose), a
scripted sampler that plays the model (its turns are text, the episode loop, the environments and
the update are real), and a Trainer for two steps of GRPO on given rows."""

from __future__ import annotations

import string

from grpokit.config.io import apply_overrides
from grpokit.config.sections import Config
from grpokit.data.tasks.calculator import TAGS
from grpokit.data.tasks.chartok import build_char_tokenizer
from grpokit.env.parse import CALL_CLOSE
from grpokit.train import Trainer
from grpokit.types import Rollout
from helpers.models import save_tiny_model

TOK = build_char_tokenizer(string.ascii_letters + string.digits + string.punctuation + " \n", TAGS)


def save_tag_model(path) -> None:
    save_tiny_model(path, TOK, max_positions=4096)


def ids(text: str) -> list[int]:
    return list(TOK(text, add_special_tokens=False)["input_ids"])


class Scripted:
    """Plays the model: ``reply(context_text, g) -> text`` (ending "<eos>" to answer)."""

    def __init__(self, reply):
        self.reply, self.contexts = reply, []

    def __call__(self, contexts, group_size, params):
        comps, logps, reasons = [], [], []
        for ctx in contexts:
            for g in range(group_size):
                text = self.reply(TOK.decode(ctx), g if group_size > 1 else None)
                self.contexts.append(TOK.decode(ctx))
                t = ids(text[:-5]) + [TOK.eos_token_id] if text.endswith("<eos>") else ids(text)
                comps.append(t)
                logps.append([-0.5] * len(t))
                reasons.append("eos" if text.endswith("<eos>") else "stop" if text.endswith(CALL_CLOSE) else "length")
        return Rollout([list(c) for c in contexts], comps, logps, reasons, group_size)


def hub_trainer(model_dir, out, rows, *, reward_funcs=None, environment_factory=None, tools=None, over=()):
    cfg = apply_overrides(
        Config(),
        [
            f"model.name_or_path={model_dir}",
            "data.task=",
            "reward.functions=[]",
            "rollout.group_size=2",
            "rollout.max_new_tokens=16",
            "train.prompts_per_step=2",
            "train.steps=2",
            f"train.out={out}",
            "record.sinks=[]",
            "record.report=false",
            "record.samples_every=1",
            "train.threads=1",
            "data.eval_size=0",
            "env.max_turns=4",
            "reward.num_workers=0",
            *over,
        ],
    )
    return Trainer(
        cfg,
        reward_funcs=reward_funcs,
        train_rows=rows,
        eval_rows=[],
        quiet=True,
        tools=tools,
        environment_factory=environment_factory,
    )


def scripted(tr, reply):
    sampler = Scripted(reply)
    tr.turn_sampler = lambda model, generator=None: sampler
    return sampler
