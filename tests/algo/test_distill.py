"""On-policy distillation (algo/distill.py, train/teacher.py): the per-token reward by hand, a teacher equal
to the student scoring zero KL in a real run, another teacher a positive one, and what is refused."""

import json
import math

import pytest
import torch

from grpokit.algo.distill import distill_token_rewards
from grpokit.config import Config
from grpokit.config.io import apply_overrides
from grpokit.config.sections import ConfigError
from grpokit.data.tasks.chartok import build_char_tokenizer
from grpokit.train import Trainer
from helpers.models import ALPHABET, char_tokenizer, save_tiny_model
from helpers.runs import ROWS, likes_a, tiny_cfg


def test_token_rewards_by_hand():
    old = torch.tensor([[math.log(0.5), math.log(0.25), 0.0]])
    teacher = torch.tensor([[math.log(0.25), math.log(0.5), 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    # k1: reward = log teacher - log old = [-ln 2, +ln 2, masked 0]
    assert torch.allclose(
        distill_token_rewards(old, teacher, mask, "k1"), torch.tensor([[-math.log(2), math.log(2), 0.0]])
    )
    # k3: -(e^d - d - 1), d = -ln 2 -> -(0.5 + ln 2 - 1); d = ln 2 -> -(2 - ln 2 - 1)
    want = torch.tensor([[-(0.5 + math.log(2) - 1), -(1 - math.log(2)), 0.0]])
    assert torch.allclose(distill_token_rewards(old, teacher, mask, "k3"), want)


def run(model_dir, out, teacher, **over):
    cfg = tiny_cfg(model_dir, out, **{"algo.distill_teacher": teacher, "algo.distill_coef": 0.5, **over})
    cfg.data.dataset = ""
    trainer = Trainer(cfg, reward_funcs=[likes_a], train_rows=ROWS, eval_rows=[], quiet=True)
    return trainer, trainer.train_step()


def test_a_teacher_equal_to_the_student_adds_nothing(tiny_model_dir, tmp_path):
    _, m = run(tiny_model_dir, tmp_path / "run", str(tiny_model_dir))
    assert m["distill/reverse_kl"] == 0.0 and m["distill/coef"] == 0.5


def test_another_teacher_scores_a_positive_k3(tiny_model_dir, tmp_path):
    other = save_tiny_model(tmp_path / "teacher", char_tokenizer(), seed=1)
    _, m = run(tiny_model_dir, tmp_path / "run", str(other), **{"algo.distill_estimator": "k3"})
    assert m["distill/reverse_kl"] > 0


def test_a_teacher_with_another_tokenizer_is_refused(tiny_model_dir, tmp_path):
    tok = build_char_tokenizer(ALPHABET[::-1], (), padding_side="right", model_max_length=None)
    other = save_tiny_model(tmp_path / "teacher", tok)
    with pytest.raises(ConfigError, match="has a different tokenizer .* a teacher must share the student's tokenizer"):
        run(tiny_model_dir, tmp_path / "run", str(other))


def test_a_teacher_that_cannot_be_loaded_is_named_by_its_own_setting(tiny_model_dir, tmp_path):
    """The teacher is loaded through the student's loader; its errors name algo.distill_teacher or the stage's
    teacher, never model.name_or_path (the student, which loaded fine)."""
    missing, empty = tmp_path / "no-such-model", tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match=rf"^algo.distill_teacher='{missing}' is a path that does not exist"):
        run(tiny_model_dir, tmp_path / "run", str(missing))
    with pytest.raises(ConfigError, match=rf"^algo.distill_teacher='{empty}' is a folder without config.json"):
        run(tiny_model_dir, tmp_path / "run", str(empty))
    stages = f"[{{steps: 1}}, {{steps: 1, teacher: '{missing}'}}]"
    with pytest.raises(ConfigError, match=rf"^train.stages\[1\].teacher='{missing}' is a path that does not exist"):
        run(tiny_model_dir, tmp_path / "run", str(tiny_model_dir), **{"train.stages": stages})


@pytest.mark.parametrize(
    "over, message",
    [
        ({"algo.distill_top_k": -1}, "algo.distill_top_k=-1 must be >= 0"),
        ({"algo.distill_top_k": 5, "algo.distill_coef": 0.0}, "algo.distill_top_k=5 needs algo.distill_coef > 0"),
        ({"algo.distill_coef": 0.0}, "is set but unused"),
        ({"algo.distill_estimator": "k2"}, "algo.distill_estimator='k2' is not valid; valid: k1, k3"),
        ({"algo.distill_teacher": "", "algo.distill_coef": 1.0}, "algo.distill_coef=1.0 needs a teacher"),
    ],
)
def test_bad_settings_are_one_sentence(tiny_model_dir, tmp_path, over, message):
    cfg = Config()
    apply_overrides(
        cfg, [f"model.name_or_path={tiny_model_dir}", f"algo.distill_teacher={tiny_model_dir}", "algo.distill_coef=0.5"]
    )
    apply_overrides(cfg, [f"{k}={v}" for k, v in over.items()])
    from grpokit.train.build import settle_config

    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        settle_config(cfg, own_rows=False)


def test_each_stage_distils_its_own_teacher(tiny_model_dir, tmp_path):
    """Rounds with a teacher each (the domain experts): the student's own weights first (zero KL), then
    another model (a positive k3); a stage teacher without algo.distill_teacher is refused."""
    other = save_tiny_model(tmp_path / "teacher", char_tokenizer(), seed=1)
    stages = f"[{{steps: 1}}, {{steps: 1, teacher: '{other}'}}]"
    cfg = tiny_cfg(
        tiny_model_dir,
        tmp_path / "run",
        **{
            "algo.distill_teacher": str(tiny_model_dir),
            "algo.distill_coef": 0.5,
            "algo.distill_estimator": "k3",
            "train.stages": stages,
        },
    )
    cfg.data.dataset = ""
    Trainer(cfg, reward_funcs=[likes_a], train_rows=ROWS, eval_rows=[], quiet=True).train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["distill/reverse_kl"] == 0.0 and rows[1]["distill/reverse_kl"] > 0
    bad = Config()
    apply_overrides(bad, [f"model.name_or_path={tiny_model_dir}", f"train.stages={stages}"])
    from grpokit.train.build import settle_config

    with pytest.raises(ConfigError, match=r"train.stages\[1\].teacher=.* needs distillation on"):
        settle_config(bad, own_rows=False)


def test_forward_kl_on_the_teachers_top_k_trains_two_steps(tiny_model_dir, tmp_path):
    """algo.distill_top_k: a teacher equal to the student gives a zero forward KL (the teacher's top-k
    log-probabilities are the student's own), another a positive one that joins the loss; both train."""
    for name, teacher, positive in [("same", str(tiny_model_dir), False), ("other", None, True)]:
        if teacher is None:
            teacher = str(save_tiny_model(tmp_path / "teacher", char_tokenizer(), seed=1))
        cfg = tiny_cfg(
            tiny_model_dir,
            tmp_path / name,
            **{"algo.distill_teacher": teacher, "algo.distill_coef": 0.5, "algo.distill_top_k": 4, "train.steps": 2},
        )
        cfg.data.dataset = ""
        Trainer(cfg, reward_funcs=[likes_a], train_rows=ROWS, eval_rows=[], quiet=True).train()
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        assert len(rows) == 2 and "distill/reverse_kl" not in rows[0]  # the reward stage is off with top-k
        kl = [r["distill/forward_kl"] for r in rows]
        assert all(0 < r["distill/top_k_mass"] <= 1 + 1e-6 for r in rows)
        assert all(v > 1e-3 for v in kl) if positive else kl[0] == pytest.approx(0.0, abs=1e-6)
