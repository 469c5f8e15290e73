"""grpokit's advantages under grpokit.trl's mapping equal TRL 1.16's own advantage code (bench/trl_oracle.py's
``trl_advantages`` runs TRL's block unchanged) for every scale_rewards and multi_objective_aggregation, with
reward functions answering None for some completions, and every function None for one (an unscorable
completion: TRL leaves it out of its group's and the batch's statistics and gives it advantage 0).
Skipped without trl."""

import sys

import pytest
import torch

pytest.importorskip("trl")
from helpers.paths import ROOT
from helpers.pipeline_batches import scored

sys.path.insert(0, str(ROOT / "bench"))
from grpokit.algo.pipeline import LogProbs, StepSettings, update_inputs  # noqa: E402
from grpokit.trl import GRPOConfig  # noqa: E402
from grpokit.trl.mapping import to_config  # noqa: E402
from trl_oracle import trl_advantages  # noqa: E402

NAN = float("nan")
WEIGHTS = [1.0, 0.5]
CASES = {  # two groups of 4, two reward functions
    "scored": [[1, 0.2], [0, 0.5], [1, 0.9], [0, 0.1], [0, 0.3], [1, 0.3], [1, 0.8], [0, 0.6]],
    "one None": [[1, NAN], [0, 0.5], [1, 0.9], [0, 0.1], [0, 0.3], [1, NAN], [1, 0.8], [0, 0.6]],
    "unscorable": [[1, 0.2], [NAN, NAN], [1, 0.9], [0, 0.1], [0, 0.3], [1, 0.3], [1, 0.8], [0, 0.6]],
    "two unscorable": [[NAN, NAN], [NAN, NAN], [NAN, NAN], [0, 0.1], [0, 0.3], [NAN, NAN], [1, 0.8], [0, 0.6]],
}
SCALINGS = [
    ("group", "sum_then_normalize"),
    ("batch", "sum_then_normalize"),
    ("none", "sum_then_normalize"),
    ("group", "normalize_then_sum"),
]


def grpokit_advantages(rewards_NF: torch.Tensor, scale: str, aggregation: str, tmp_path) -> torch.Tensor:
    """The pipeline's advantages (what a grpokit.trl step trains on) with the mapped config."""
    args = GRPOConfig(
        output_dir=str(tmp_path),
        scale_rewards=scale,
        multi_objective_aggregation=aggregation,
        reward_weights=WEIGHTS,
        use_cpu=True,
        report_to=[],
        per_device_train_batch_size=4,
        num_generations=4,
    )
    cfg = to_config(args, num_rows=8, world_size=1)
    total = (rewards_NF * torch.tensor(WEIGHTS)).nansum(dim=1)  # the runner's weighted sum: 0 for an unscorable row
    sb, batch = scored(total.tolist(), 4, [3] * len(total))
    sb.rewards_NF = rewards_NF
    weights = tuple(WEIGHTS) if cfg.reward.normalize_components else None
    return update_inputs(StepSettings(cfg.algo, component_weights=weights), sb, batch, LogProbs()).advantages


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("scaling", SCALINGS, ids=["-".join(s) for s in SCALINGS])
def test_advantages_equal_trl(case, scaling, tmp_path):
    r = torch.tensor(CASES[case], dtype=torch.float32)
    theirs, ours = trl_advantages(r, WEIGHTS, 4, *scaling), grpokit_advantages(r, *scaling, tmp_path)
    assert torch.allclose(ours, theirs, atol=1e-5), (ours, theirs)
    unscorable = r.isnan().all(dim=1)
    assert torch.equal(ours[unscorable], torch.zeros(int(unscorable.sum())))


def test_unscorable_completion_by_hand(tmp_path):
    # group [1, 1, None, 0]: TRL's mean and std over the three scored rewards, 2/3 and sqrt(1/3) (Bessel);
    # (1 - 2/3) / (0.57735 + 1e-4) = 0.57725, (0 - 2/3) / 0.57745 = -1.15450; the unscorable one gets 0.
    # Counted as a 0 it would give [0.866, 0.866, -0.866, -0.866]
    r = torch.tensor([[1.0, NAN], [1.0, NAN], [NAN, NAN], [0.0, NAN], [1.0, NAN], [0.0, NAN], [1.0, NAN], [0.0, NAN]])
    ours = grpokit_advantages(r, "group", "sum_then_normalize", tmp_path)
    assert ours[:4].tolist() == pytest.approx([0.57725, 0.57725, 0.0, -1.15450], abs=1e-5)
