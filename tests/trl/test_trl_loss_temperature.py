"""The sampler's temperature and the loss's, apart under grpokit.trl as in TRL 1.16: a written
``generation_config.temperature`` and a ``generation_kwargs`` temperature change sampling only, while pi_old,
pi_theta, pi_ref, the KL and the entropies keep ``GRPOConfig.temperature`` (TRL: ``self.temperature =
args.temperature`` for every log-probability; generation_kwargs reach only the GenerationConfig and vLLM's
SamplingParams). trl, when installed, runs the same cases as the oracle."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset

from grpokit.trl import GRPOConfig, GRPOTrainer
from helpers.trl_models import small_args

DATA = Dataset.from_list([{"prompt": [{"role": "user", "content": f"say {w}"}]} for w in ("ab", "cd", "ef", "gh")])


def length(completions, **kwargs):
    return [0.1 * len(c[0]["content"]) for c in completions]


def libraries():
    """grpokit.trl's classes, and trl's when it is installed (the oracle of TRL's behaviour)."""
    out = [("grpokit", GRPOConfig, GRPOTrainer)]
    try:
        import trl

        out.append(("trl", trl.GRPOConfig, trl.GRPOTrainer))
    except ImportError:
        pass
    return out


def first_log(Trainer, args, model, written=None) -> tuple[dict, object]:
    """The first step's logged metrics of a one-step run (``written``: generation_config fields a subclass's
    __init__ sets, e.g. a temperature schedule's first value) and the trainer."""

    class Sub(Trainer):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            for name, value in (written or {}).items():
                setattr(self.generation_config, name, value)

    tr = Sub(model, reward_funcs=[length], train_dataset=DATA, args=args)
    tr.train()
    return tr.state.log_history[0], tr


@pytest.mark.parametrize("cut", [{"top_k": 6}, {"top_p": 0.9}, {"min_p": 0.1}])
def test_a_written_sampler_temperature_with_a_truncating_sampler_trains_on_policy(chat_model, tmp_path, cut):
    # num_iterations 1: the first (only) pass is on-policy, so every ratio is 1 and nothing clips (TRL: its
    # old_per_token_logps are the update's own, detached). grpokit takes pi_old in a pass of its own, which
    # replays the truncated support: before, that pass ran at the written 0.5 and the update at 1.0 (ratio/mean
    # 0.845, clip_ratio/region_mean 0.0625 with top_k=6). The sampler's gap to the loss's distribution is real,
    # and mismatch/* shows it.
    for name, Config, Trainer in libraries():
        args = small_args(Config, tmp_path / name, max_steps=1, logging_steps=1, report_to="none", save_strategy="no")
        for key, value in {"learning_rate": 1e-3, "beta": 0.0, "seed": 0, **cut}.items():
            setattr(args, key, value)
        log, tr = first_log(Trainer, args, chat_model, written={"temperature": 0.5})
        assert log["clip_ratio/region_mean"] == 0.0, name
        if name == "grpokit":
            assert log["ratio/mean"] == pytest.approx(1.0, abs=1e-6)
            assert log["mismatch/logp_abs_diff_mean"] > 1e-3  # sampled at 0.5, trained at 1.0
            assert (tr._get().params.temperature, tr._get().loss_temperature) == (0.5, 1.0)


def test_a_generation_kwargs_temperature_samples_apart_and_the_loss_keeps_temperature(chat_model, tmp_path):
    # generation_kwargs={"temperature": 0.3} beside temperature=1.0: the sampler runs at 0.3 (rollout.temperature)
    # and every log-probability at 1.0 (algo.loss_temperature). The entropy metric is pi_theta's at the loss
    # temperature: this near-uniform tiny model's entropy at 1.0 is about 3.84 whatever was sampled, and at 0.3
    # about 3.775 (what the loss took before, when the key set the one temperature of both).
    entropies = {}
    for name, Config, Trainer in libraries():
        for gk in (None, {"temperature": 0.3}):
            out = tmp_path / f"{name}{gk is not None}"
            args = small_args(Config, out, max_steps=1, logging_steps=1, report_to="none", save_strategy="no")
            for key, value in {"beta": 0.04, "seed": 0, "generation_kwargs": gk}.items():
                setattr(args, key, value)
            log, tr = first_log(Trainer, args, chat_model)
            entropies[name, gk is not None] = log["entropy"]
            assert tr.temperature == 1.0 and tr.generation_config.temperature == (0.3 if gk else 1.0), name
            if name == "grpokit" and gk:
                cfg = tr._get().cfg
                assert (cfg.rollout.temperature, cfg.algo.loss_temperature, tr._get().loss_temperature) == (0.3, 1, 1)
                assert log["kl"] == 0.0 and log["clip_ratio/region_mean"] == 0.0  # step 1: ref = pi_old = pi_theta
                assert log["mismatch/logp_abs_diff_mean"] > 1e-2  # sampled at 0.3, trained at 1.0
    for name, *_ in libraries():
        assert entropies[name, True] == pytest.approx(entropies[name, False], abs=0.02), name


def test_generate_and_score_weighs_the_sampler_ratio_on_the_truncated_support(chat_model, tmp_path):
    # TRL's _generate_and_score_completions (grpokit.trl's own, which a subclass's override calls) with vLLM
    # importance sampling and top_k 6: the stand-in engine samples with the trainer's own model and reports the
    # truncated logprobs it drew with (vLLM's processed_logprobs), so on the support every token's ratio is 1 to
    # float rounding. Before, this path took pi_old without the support replay: the ratio was the kept mass < 1.
    from types import SimpleNamespace as NS

    from grpokit.rollout.vllm import VLLMColocated
    from helpers.mismatch import RecordingLLM

    args = small_args(GRPOConfig, tmp_path, max_steps=1, report_to="none", save_strategy="no", top_k=6)
    facade = GRPOTrainer(chat_model, reward_funcs=[length], train_dataset=DATA, args=args)
    tr = facade._get()
    tr.use_engine(VLLMColocated(RecordingLLM(tr, 0.0), lambda **kw: NS(**kw), tr.params, sleep=True))
    r = tr.cfg.rollout
    r.backend, r.tis_mode, r.tis_cap = "vllm", "token_truncate", 3.0  # TRL's vLLM importance sampling
    out = facade._generate_and_score_completions([DATA[0]] * 4)  # one prompt, num_generations=4 rows
    w, mask = out["importance_sampling_ratio"], out["completion_mask"].bool()
    assert mask.any() and torch.allclose(w[mask], torch.ones_like(w[mask]), atol=1e-4)
