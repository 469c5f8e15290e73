"""A resume continues the checkpoint's data position over the same prompts: each checkpoint keeps the training
prompts' fingerprint, and a resume over other prompts is refused in one sentence before anything is loaded or
set aside (before, a cut or edited data file resumed at exit 0 into another experiment)."""

from __future__ import annotations

import json

import pytest

from grpokit.config import ConfigError
from grpokit.data.prompts import check_same_data, fingerprint
from grpokit.train import Trainer
from grpokit.types import Prompt
from helpers.runs import ROWS, likes_a, tiny_cfg


def prompt(text, answer, **columns):
    return Prompt(text=f"<{text}>", ids=[1, 2], columns={"answer": answer, **columns}, raw=text)


def test_the_fingerprint_is_the_rows_as_given_in_order():
    rows = [prompt("2+3=", "5"), prompt("4+4=", "8")]
    same = fingerprint(rows)
    assert same["prompts"] == 2 and same == fingerprint([prompt("2+3=", "5"), prompt("4+4=", "8")])
    assert fingerprint([prompt("2+3=", "6"), rows[1]]) != same  # an answer changed
    assert fingerprint(rows[::-1]) != same  # the order is part of it: the position counts through it
    # the rendered text (system prompt, template: config changes a resume records) is not
    rendered = [Prompt(text="other", ids=[9], columns=p.columns, raw=p.raw) for p in rows]
    assert fingerprint(rendered) == same


def test_an_image_column_is_fingerprinted_by_its_pixels_not_its_address():
    from PIL import Image

    def img(color):
        return Image.new("RGB", (2, 2), color)

    a, b = fingerprint([prompt("x", "1", image=img("red"))]), fingerprint([prompt("x", "1", image=img("red"))])
    assert a == b != fingerprint([prompt("x", "1", image=img("blue"))])


def test_the_sentence_names_both_and_what_to_do():
    was = {"prompts": 40, "sha256": "a" * 64}
    check_same_data(was, dict(was), "R/checkpoints/step-000002")
    check_same_data(None, {"prompts": 1, "sha256": "b" * 64}, "R/checkpoints/step-000002")  # an older checkpoint
    with pytest.raises(ConfigError) as e:
        check_same_data(was, {"prompts": 10, "sha256": "b" * 64}, "R/checkpoints/step-000002")
    assert str(e.value) == (
        "the training data changed since checkpoint R/checkpoints/step-000002: it was trained on 40 prompts (sha256 "
        "aaaaaaaaaaaa), the run now has 10 (sha256 bbbbbbbbbbbb); its data position counts through the same prompts, "
        "so the resumed run would not continue the same experiment: restore the data and its data.* settings, or "
        "start a new run from its weights (model.name_or_path=R/checkpoints/step-000002/model)"
    )


def test_a_run_resumed_over_other_prompts_is_refused_and_over_its_own_continues(tiny_model_dir, tmp_path):
    def trainer(rows, steps, resume=None):
        cfg = tiny_cfg(tiny_model_dir, tmp_path / "run", **{"train.steps": steps, "train.save_every": 1})
        cfg.data.dataset = ""  # rows are passed directly
        return Trainer(cfg, reward_funcs=[likes_a], train_rows=rows, eval_rows=[], resume=resume, quiet=True)

    trainer(ROWS, 2).train()
    saved = json.loads((tmp_path / "run" / "checkpoints" / "step-000002" / "trainer_state.json").read_text())
    assert saved["data"]["prompts"] == len(ROWS)
    with pytest.raises(ConfigError, match=r"^the training data changed since checkpoint .*step-000002: it was trained"):
        trainer(ROWS[:4], 3, resume=tmp_path / "run")
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step-000001", "step-000002"]
    assert trainer(ROWS, 3, resume=tmp_path / "run").train()["steps"] == 3
