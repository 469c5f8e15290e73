"""TRL's extension contract where a subclass's override reaches more than the stage it replaces
(grpokit/trl/contract/): the log-probability override feeds pi_old and the reference as TRL's, a loss
override keeps the update's metrics, and the trainer's state reads as TRL's at the points subclasses read it."""

from __future__ import annotations

import pytest
from datasets import Dataset

from grpokit.trl import GRPOConfig, GRPOTrainer
from helpers.trl_models import small_args

DATA = Dataset.from_list([{"prompt": [{"role": "user", "content": f"say {w}"}]} for w in ("ab", "cd", "ef", "gh")])
LOSS_KEYS = {"kl", "ratio/mean", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"}


def short(completions, **kwargs):
    return [-len(c[0]["content"]) / 10 for c in completions]


def entries(tr, key):
    return [e[key] for e in tr.state.log_history if key in e]


def shifted(base):
    class Shifted(base):
        """A model-specific forward stand-in: every log-probability lowered by 0.5."""

        def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *a, **k):
            logps, ents, aux = super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, *a, **k
            )
            return logps - 0.5, ents, aux

    return Shifted


def run(base, model, out, **kw):
    args = small_args(GRPOConfig, out, **kw)
    tr = base(model, reward_funcs=[short], train_dataset=DATA, args=args)
    tr.train()
    return tr


def shift_args(iterations):
    return dict(max_steps=2, logging_steps=1, report_to="none", beta=0.1, num_iterations=iterations, seed=0)


@pytest.mark.parametrize("iterations", [1, 2])
def test_a_logps_override_gives_pi_old_and_the_reference_too(chat_model, tmp_path, iterations):
    """TRL computes old_per_token_logps and ref_per_token_logps with the same method: a shift of -0.5 on
    all three cancels in the ratio exp(logp - old) and in the KL's logp - ref, so the KL is 0 exactly
    (k3 = exp(0) - 0 - 1) and the loss is the run's without the override (before: the reference was not
    shifted, kl = exp(0.5) - 0.5 - 1 = 0.1487 per token and the loss 0.1 * 0.1487 = 0.0149 higher)."""
    kw = dict(shift_args(iterations), learning_rate=1e-9)
    plain = run(GRPOTrainer, chat_model, tmp_path / "plain", **kw)
    moved = run(shifted(GRPOTrainer), chat_model, tmp_path / "shifted", **kw)
    assert entries(moved, "kl") == pytest.approx([0.0, 0.0], abs=1e-6)
    assert entries(moved, "loss") == pytest.approx(entries(plain, "loss"), abs=1e-5)


def test_a_logps_override_gives_trls_kl(chat_model, tmp_path):
    trl = pytest.importorskip("trl")
    args = small_args(trl.GRPOConfig, tmp_path / "trl", learning_rate=1e-9, **shift_args(1))
    tr = shifted(trl.GRPOTrainer)(chat_model, reward_funcs=[short], train_dataset=DATA, args=args)
    tr.train()
    ours = run(shifted(GRPOTrainer), chat_model, tmp_path / "ours", learning_rate=1e-9, **shift_args(1))
    assert entries(ours, "kl") == pytest.approx(entries(tr, "kl"), abs=1e-6) == [0.0, 0.0]


class Passthrough(GRPOTrainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


def test_a_loss_override_keeps_the_updates_kl_and_clip_metrics(chat_model, tmp_path):
    """compute_loss calling only super() logs what the run without it logs: kl, ratio/mean, clip_ratio/*
    with the same values (the same seed samples the same completions; the loss is the same math)."""
    kw = dict(max_steps=1, logging_steps=1, report_to="none", beta=0.1, seed=0)
    plain = run(GRPOTrainer, chat_model, tmp_path / "plain", **kw)
    through = run(Passthrough, chat_model, tmp_path / "through", **kw)
    first = through.state.log_history[0]
    assert LOSS_KEYS <= set(first)
    assert first["ratio/mean"] == pytest.approx(1.0)  # one iteration: pi_old is the policy itself
    for key in LOSS_KEYS:
        assert first[key] == pytest.approx(plain.state.log_history[0][key], abs=1e-6), key


class PlusFive(GRPOTrainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch) + 5.0


def evaluated(base, model, out, **kw):
    args = small_args(GRPOConfig, out, max_steps=1, report_to="none", seed=0, per_device_eval_batch_size=4, **kw)
    return base(model, reward_funcs=[short], train_dataset=DATA, eval_dataset=DATA, args=args).evaluate()


def test_a_compute_loss_override_is_the_eval_loss_as_trls_prediction_step(chat_model, tmp_path):
    """TRL's prediction_step takes eval_loss from self.compute_loss: + 5.0 there is + 5.0 in eval_loss
    (the same seed samples the same eval completions; 4 eval batches of one group each, each + 5)."""
    plain = evaluated(GRPOTrainer, chat_model, tmp_path / "plain")
    five = evaluated(PlusFive, chat_model, tmp_path / "five")
    assert five["eval_loss"] == pytest.approx(plain["eval_loss"] + 5.0, abs=1e-5)
    assert five["eval_reward"] == plain["eval_reward"]


def test_evaluate_with_a_generate_and_score_override_stops_in_one_sentence(chat_model, tmp_path):
    class Own(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            return super()._generate_and_score_completions(inputs)

    with pytest.raises(Exception, match=r"^GRPOTrainer subclass overrides _generate_and_score_completions, .*evaluate"):
        evaluated(Own, chat_model, tmp_path / "own")


def test_eval_loss_carries_beta_times_the_kl_and_logs_eval_kl(chat_model, tmp_path):
    """TRL adds beta * KL in every mode and logs kl: before any update the policy is the reference, so
    eval_kl = exp(0) - 0 - 1 = 0 and eval_loss is beta=0's; after 3 steps at lr 0.05 the policy moved,
    eval_kl > 0."""
    plain = evaluated(GRPOTrainer, chat_model, tmp_path / "plain")
    kl0 = evaluated(GRPOTrainer, chat_model, tmp_path / "kl0", beta=0.5)
    assert "eval_kl" not in plain and kl0["eval_kl"] == pytest.approx(0.0, abs=1e-6)
    assert kl0["eval_loss"] == pytest.approx(plain["eval_loss"], abs=1e-6)
    args = small_args(GRPOConfig, tmp_path / "moved", max_steps=3, report_to="none", seed=0, beta=0.5)
    args.per_device_eval_batch_size, args.learning_rate = 4, 0.05
    tr = GRPOTrainer(chat_model, reward_funcs=[short], train_dataset=DATA, eval_dataset=DATA, args=args)
    tr.train()
    assert tr.evaluate()["eval_kl"] > 1e-4


def small(model, out, **kw):
    args = small_args(GRPOConfig, out, max_steps=1, logging_steps=1, report_to="none", seed=0)
    return GRPOTrainer(model, reward_funcs=[short], train_dataset=DATA, args=args, **kw)


def test_methods_patched_on_the_instance_are_honoured_or_refused(chat_model, tmp_path):
    """A method assigned on the instance is the subclass override it stands for: _calculate_rewards returning
    5.0 for every completion makes the logged reward 5.0 (one function of weight 1); training_step is refused."""
    import types

    import torch

    from grpokit.config import ConfigError

    tr = small(chat_model, tmp_path / "rewards")
    tr._calculate_rewards = types.MethodType(lambda self, i, p, c, ids: torch.full((len(p), 1), 5.0), tr)
    tr.train()
    assert entries(tr, "reward") == [5.0]
    other = small(chat_model, tmp_path / "step")
    with pytest.raises(ConfigError, match=r"^GRPOTrainer instance has a patched training_step, "):
        other.training_step = types.MethodType(lambda self, *a: None, other)


def test_rollout_func_assigned_after_construction_is_the_sampler(chat_model, tmp_path):
    """TRL reads self.rollout_func at each generation: one assigned later is the one called (4 prompts a step
    of one group of G=4: one call with the prompt repeated 4 times)."""
    calls = []

    def fixed(prompts, trainer):
        calls.append(len(prompts))
        ids = trainer.processing_class(["xy"] * len(prompts), add_special_tokens=False)["input_ids"]
        prompt_ids = trainer.processing_class(["p"] * len(prompts), add_special_tokens=False)["input_ids"]
        return {"prompt_ids": prompt_ids, "completion_ids": ids, "logprobs": [[0.0] * len(i) for i in ids]}

    tr = small(chat_model, tmp_path / "late")
    tr.rollout_func = fixed
    tr.train()
    assert calls == [4] and entries(tr, "completions/mean_length") == [2.0]


def test_machinery_grpokit_does_not_read_is_refused_when_assigned(chat_model, tmp_path):
    from grpokit.config import ConfigError

    tr = small(chat_model, tmp_path / "tmpl")
    with pytest.raises(ConfigError, match=r"^GRPOTrainer.chat_template is TRL machinery .*processing_class"):
        tr.chat_template = "{{ messages }}"
    tr.chat_template = None  # TRL's own value stays assignable
