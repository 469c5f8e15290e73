"""Prompts longer than the model can hold are refused at start, or cut as TRL cuts.

Before, 8 prompts of 40,000 characters on the demo model (64 positions) ran over 4 minutes without a step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from grpokit.config.sections import Config, ConfigError
from grpokit.data.prompt_length import limit_prompts, prompt_limit
from grpokit.types import Prompt


def _p(n: int) -> Prompt:
    return Prompt(text="t" * n, ids=list(range(n)))


def test_long_prompts_are_refused_in_one_sentence_naming_the_longest():
    with pytest.raises(ConfigError) as err:
        limit_prompts([_p(3), _p(9), _p(12), _p(5)], 8, "rollout.max_prompt_tokens=8", False, "training")
    assert str(err.value) == (
        "2 of 4 training prompts are longer than rollout.max_prompt_tokens=8 (the longest, row 2, "
        "has 12 tokens); shorten them, raise rollout.max_prompt_tokens within the model's context, "
        "or set rollout.truncate_prompts=true to keep each one's last tokens"
    )


def test_truncation_keeps_the_last_tokens_as_trl_and_counts_the_cut_prompts(caplog):
    # TRL's max_prompt_length: ids[-limit:]; prompt 1 (0..8) keeps 1..8, prompt 2 (0..11) keeps 4..11
    prompts = [_p(3), _p(9), _p(12), _p(8)]
    out, cut = limit_prompts(prompts, 8, "rollout.max_prompt_tokens=8", True, "training")
    assert cut == 2
    assert [p.ids for p in out] == [[0, 1, 2], list(range(1, 9)), list(range(4, 12)), list(range(8))]
    assert out[2].text == prompts[2].text  # rewards still see the whole prompt
    assert "2 of 4 training prompts are longer than rollout.max_prompt_tokens=8 and were cut" in caplog.text
    assert limit_prompts(prompts, 0, "", False, "training") == (prompts, 0)  # no known limit: as given


def test_the_limit_is_the_field_else_the_models_context():
    class Model:
        class config:
            max_position_embeddings = 64

    cfg = Config()
    assert prompt_limit(cfg, Model()) == (64, "the model's context of 64 tokens")
    cfg.rollout.max_prompt_tokens = 20
    assert prompt_limit(cfg, Model()) == (20, "rollout.max_prompt_tokens=20")


def test_grpokit_train_refuses_40000_character_prompts_at_start(tmp_path):
    rows = [{"question": "x" * 40_000 + f"{a}+{a}=", "solution": str(2 * a)} for a in range(8)]
    (tmp_path / "long.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cmd = [
        sys.executable,
        "-m",
        "grpokit",
        "train",
        "data.dataset=long.jsonl",
        "data.prompt_column=question",
        "data.answer_column=solution",
        "reward.functions=[math_accuracy]",
        "train.steps=1",
        "record.report=false",
        "--out",
        "run",
    ]
    start = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env={**os.environ})
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        "grpokit: error: 8 of 8 training prompts are longer than the model's context of 64 tokens (the longest, row 0, "
        "has 40004 tokens); shorten them, raise rollout.max_prompt_tokens within the model's context, or set "
        "rollout.truncate_prompts=true to keep each one's last tokens"
    )
    assert time.monotonic() - start < 120
