"""grpokit.trl's eval loss carries the training loss's KL term (algo/pipeline.loss_settings' KLSettings)."""

from __future__ import annotations

from types import SimpleNamespace

from grpokit.config import AlgoConfig
from grpokit.train import reference
from grpokit.trl.evaluation import _kl_options


def test_the_eval_kl_is_the_training_losss(monkeypatch):
    # beta 0.04 in the loss, k1, bias correction on, kl_clamp 0 (off: None): the keywords are those of training's
    # KLSettings (before: kl_bias_correction was left out); the reference log-probabilities are the batch's.
    monkeypatch.setattr(reference, "reference_logprobs", lambda *a: "ref")
    a = AlgoConfig(beta=0.04, kl_estimator="k1", kl_bias_correction=True, kl_clamp=0.0)
    trainer = SimpleNamespace(cfg=SimpleNamespace(algo=a), model=None, ref_model=None, logprobs=None, ref_adapter=None)
    assert _kl_options(trainer, None) == dict(
        beta=0.04, kl_estimator="k1", kl_bias_correction=True, kl_clamp=None, ref_logp_NT="ref"
    )
    # kl_placement=reward: no KL term in the loss, so none in the eval loss
    trainer.cfg.algo = AlgoConfig(beta=0.04, kl_placement="reward")
    assert _kl_options(trainer, None) == {}
