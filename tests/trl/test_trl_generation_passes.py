"""A GRPOTrainer subclass's ``_generate_and_score_completions`` (calling super()) takes the step's passes before
the update as the loop does, once a step (train/trainer_forwards.py step_logprobs): pi_old where a slice is
trained after an update (TRL's old_per_token_logps), the reference, the teacher's top-k."""

from __future__ import annotations

import pytest
from datasets import Dataset

from grpokit.config import ConfigError
from grpokit.config.io import set_field
from grpokit.trl import GRPOConfig, GRPOTrainer
from helpers.trl_models import make_chat_model, small_args

DATA = Dataset.from_list([{"prompt": [{"role": "user", "content": f"say {i}"}]} for i in range(8)])
CLIPS = ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "loss", "kl")
# a generation batch of 4 slices (steps_per_generation) of 2 completions, 2 slices an update (A0 A1 | A2 A3):
# A2 and A3 are trained after the first update; lr 0.2 moves the tiny model, epsilon 0.01 clips what moved
ROUND = dict(
    num_generations=2,
    per_device_train_batch_size=2,
    steps_per_generation=4,
    gradient_accumulation_steps=2,
    learning_rate=0.2,
    epsilon=0.01,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
    seed=0,
)


def short(completions, **kwargs):
    return [-len(c[0]["content"]) / 10 for c in completions]


class Own(GRPOTrainer):
    def _generate_and_score_completions(self, inputs):
        return super()._generate_and_score_completions(inputs)


def counted(tr, calls: dict[str, int]):
    """``tr`` with its run's pi_old pass (old_logprobs) and its other no-grad passes (logprobs: the reference's)
    counting their calls in ``calls``."""
    t = tr._get()
    for name in ("old_logprobs", "logprobs"):
        method = getattr(t, name)

        def count(*a, _name=name, _method=method, **k):
            calls[_name] = calls.get(_name, 0) + 1
            return _method(*a, **k)

        setattr(t, name, count)
    return tr


def clips(tr) -> list[dict[str, float]]:
    return [{k: e[k] for k in CLIPS if k in e} for e in tr.state.log_history if "loss" in e]


def test_an_override_trains_later_slices_against_pi_old_and_takes_each_pass_once_a_step(chat_model, tmp_path):
    """max_steps 4 = 2 rounds of 2 updates (grpokit steps). Step 1 (A0 A1) is trained by the policy that
    sampled it: ratio exactly 1, nothing clipped. Step 2 (A2 A3) comes after step 1's update: its ratio is to
    pi_old, so some tokens fall outside [0.99, 1.01]. Before: the override's dict carried no
    old_per_token_logps (its passes lacked the loop's stale-slice rule), the loss took logps.detach() as pi_old:
    ratio 1, no clipping on step 2 (its clip metrics 0 where the plain run's were not); and pi_old and the
    reference ran twice a round (the override's passes, then the loop's again): 4 and 4, now 2 and 2."""
    logs, passes = {}, {}
    for name, cls in (("plain", GRPOTrainer), ("own", Own)):
        args = small_args(GRPOConfig, tmp_path / name, max_steps=4, beta=0.04, **ROUND)
        tr = counted(cls(chat_model, reward_funcs=[short], train_dataset=DATA, args=args), passes.setdefault(name, {}))
        tr.train()
        logs[name] = clips(tr)
    # the same run, the override's dict trained through TRL's loss path (its micro-batches summed in another
    # order: float noise, grown by 3 updates at lr 0.2)
    assert logs["own"] == [pytest.approx(e, rel=1e-3, abs=1e-6) for e in logs["plain"]]
    first, second = logs["own"][0], logs["own"][1]
    assert first["clip_ratio/region_mean"] == 0.0 and second["clip_ratio/region_mean"] > 0.0
    assert passes["own"] == passes["plain"] == {"old_logprobs": 2, "logprobs": 2}  # one each a round


def test_trl_clips_the_later_slices_of_the_same_round(chat_model, tmp_path):
    """The oracle of the test above: TRL 1.16 with the same arguments, its own override calling super(): no
    clipping on step 1, some on step 2 (its sampler's draws differ from grpokit's, so only the signs compare)."""
    trl = pytest.importorskip("trl")

    class TrlOwn(trl.GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            return super()._generate_and_score_completions(inputs)

    args = small_args(trl.GRPOConfig, tmp_path / "trl", max_steps=2, **ROUND)
    tr = TrlOwn(chat_model, reward_funcs=[short], train_dataset=DATA, args=args)
    tr.train()
    first, second = clips(tr)
    assert first["clip_ratio/region_mean"] == 0.0 and second["clip_ratio/region_mean"] > 0.0


class OwnLoss(GRPOTrainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


@pytest.mark.parametrize("cls", [Own, OwnLoss], ids=["generate_and_score", "compute_loss"])
def test_the_teachers_top_k_with_trls_loss_path_is_refused_in_one_sentence(tmp_path, chat_model, cls):
    """algo.distill_top_k's forward KL is a term of grpokit's own loss (train/update.py), which TRL's
    compute_loss does not compute. Before: with _generate_and_score_completions a traceback (update_inputs:
    no teacher top-k taken); with compute_loss the term was dropped and the step trained on loss 0."""
    teacher = str(make_chat_model(tmp_path / "teacher", seed=1))
    args = small_args(GRPOConfig, tmp_path / "run", max_steps=1, beta=0.0, report_to="none", save_strategy="no")
    tr = cls(chat_model, reward_funcs=[short], train_dataset=DATA, args=args)
    for field, value in {"algo.distill_teacher": teacher, "algo.distill_coef": 1.0, "algo.distill_top_k": 4}.items():
        set_field(tr.cfg, field, value)
    with pytest.raises(ConfigError, match=r"^algo.distill_top_k's forward KL to the teacher is a term of grpokit's"):
        tr.train()
