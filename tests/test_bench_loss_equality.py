"""grpokit's policy_loss equals TRL's GRPO loss on one fixed batch (TRL used as an oracle only).

The batch (bench/trl_oracle.fixed_batch) has ragged lengths, ratios both inside and outside
[0.8, 1.2] and advantages of both signs, so clipping, the k3 KL term (beta = 0.04) and each
aggregation are all exercised. Skipped when trl is not installed.
"""

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from trl_oracle import TRL_TO_GRPOKIT, fixed_batch, grpokit_loss, trl_loss  # noqa: E402


def test_fixed_batch_exercises_clipping():
    logp, old, _, adv, mask = fixed_batch()
    ratio = torch.exp(logp - old)[mask.bool()]
    assert (ratio < 0.8).any() and (ratio > 1.2).any() and (adv > 0).any() and (adv < 0).any()


@pytest.mark.parametrize("loss_type", sorted(TRL_TO_GRPOKIT))
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_loss_and_gradient_equal_trl(loss_type, beta):
    logp, old, ref, adv, mask = fixed_batch()
    a = logp.clone().requires_grad_(True)
    b = logp.clone().requires_grad_(True)
    ours = grpokit_loss(a, old, ref, adv, mask, loss_type=loss_type, beta=beta, max_completion_length=9)
    theirs = trl_loss(b, old, ref, adv, mask, loss_type=loss_type, beta=beta, max_completion_length=9)
    assert torch.allclose(ours, theirs, atol=1e-7, rtol=1e-6)
    ours.backward()
    theirs.backward()
    assert torch.allclose(a.grad, b.grad, atol=1e-7, rtol=1e-6)
