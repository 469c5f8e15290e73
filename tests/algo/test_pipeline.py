"""algo/pipeline.update_inputs on hand-built tensors: each stage's effect on the update's inputs,
expected values worked out in the comments."""

import dataclasses
import math

import pytest
import torch

from grpokit.algo.pipeline import LogProbs, MismatchSettings, StepSettings, TISSettings, mask_names, needed_logprobs
from grpokit.config.sections import AlgoConfig
from grpokit.types import Episode
from helpers.pipeline_batches import run, scored

S = 1 / math.sqrt(2) + 1e-4  # unbiased std of {1, 0} plus adv_eps


def test_grpo_default_inputs():
    # rewards [1, 0]: mean 0.5, unbiased std 1/sqrt(2) -> A = +-0.5 / (0.70711 + 1e-4)
    sb, batch = scored([1.0, 0.0], 2, [2, 1])
    inp = run(AlgoConfig(), sb, batch)
    assert inp.advantages.tolist() == pytest.approx([0.5 / S, -0.5 / S], rel=1e-6)
    assert torch.equal(inp.loss_mask, batch.completion_mask)
    assert inp.old_logp is None and inp.ref_logp is None and inp.turn_ids is None and inp.seq_weights is None
    assert (
        inp.loss.kl.beta == 0.0 and inp.loss.clip.objective == "clip" and inp.norms.aggregation == "seq-mean-token-mean"
    )
    assert inp.metrics["num_zero_std_groups"] == 0.0


def test_rloo_unscaled():
    # leave-one-out, no scale: A_i = r_i - mean of the others: [1 - 0.5, 0 - 1, 1 - 0.5] = [0.5, -1, 0.5]
    sb, batch = scored([1.0, 0.0, 1.0], 3, [1, 1, 1])
    inp = run(AlgoConfig(baseline="leave_one_out", scale="none"), sb, batch)
    assert inp.advantages.tolist() == pytest.approx([0.5, -1.0, 0.5])


def test_kl_in_reward_moves_kl_out_of_the_loss():
    # k1 per token = old - ref; row 0: 2 tokens of 0.5 -> KL 1.0; row 1: 1 token of 0 -> 0.
    # beta 0.5: rewards [1 - 0.5, 1 - 0] = [0.5, 1]: mean 0.75, unbiased std 0.5 / sqrt(2) = 0.35355
    # -> A = [-0.25, 0.25] / (0.35355 + 1e-4)
    sb, batch = scored([1.0, 1.0], 2, [2, 1])
    old = torch.tensor([[-1.0, -1.0], [-1.0, 0.0]])
    ref = torch.tensor([[-1.5, -1.5], [-1.0, 0.0]])
    inp = run(AlgoConfig(beta=0.5, kl_placement="reward", kl_estimator="k1"), sb, batch, LogProbs(old, ref))
    s2 = 0.5 / math.sqrt(2) + 1e-4
    assert inp.advantages.tolist() == pytest.approx([-0.25 / s2, 0.25 / s2], rel=1e-6)
    assert inp.ref_logp is None and inp.loss.kl.beta == 0.0
    assert inp.metrics["kl"] == pytest.approx(1.0 / 3)  # KL sum 1.0 over 3 completion tokens
    inp_loss = run(AlgoConfig(beta=0.5), sb, batch, LogProbs(old, ref))  # KL in the loss: rewards untouched, flat group
    assert inp_loss.ref_logp is ref and inp_loss.loss.kl.beta == 0.5 and inp_loss.advantages.tolist() == [0.0, 0.0]


def test_overlong_and_entropy_masks_compose():
    # row 0 truncated ("length") leaves the loss; of the rest, entropies [0.1, 0.9] on row 1 with
    # top fraction 0.5 of the *remaining* tokens: quantile 0.5 of {0.1, 0.9} = 0.5 -> keeps 0.9 only
    sb, batch = scored([1.0, 0.0], 2, [2, 2], finish=["length", "eos"])
    ent = torch.tensor([[5.0, 5.0], [0.1, 0.9]])
    old = torch.zeros(2, 2)
    a = AlgoConfig(mask_truncated=True, entropy_top_fraction=0.5)
    assert mask_names(StepSettings(a)) == ["overlong", "entropy_top"]
    inp = run(a, sb, batch, LogProbs(old, None, ent))
    # the overlong mask narrows the loss mask (row 0 leaves the normalisers and the KL); the entropy mask is
    # policy-only: row 1's low-entropy token keeps its place in the loss mask, out of the policy mask only
    assert inp.loss_mask.tolist() == [[0.0, 0.0], [1.0, 1.0]]
    assert inp.policy_mask.tolist() == [[0.0, 0.0], [0.0, 1.0]]
    assert run(AlgoConfig(mask_truncated=True), sb, batch, LogProbs(old, None, ent)).policy_mask is None


def test_trls_truncation_rule_reads_the_last_token():
    # end ids {0, 2}. Row 0 stopped at the turn limit on a turn that ended with EOS (last id 2): "turns"; row 1
    # ended on its environment's reply (last id 7): "done"; row 2 was cut at the cap (last id 5): "length"; row 3
    # answered: "eos". By finish reason rows 0 and 2 leave the loss; by TRL's last-token rule rows 1 and 2 do.
    sb, batch = scored([1.0, 0.0, 1.0, 0.0], 2, [2, 2, 2, 2], finish=["turns", "done", "length", "eos"])
    sb = dataclasses.replace(
        sb, rollout=dataclasses.replace(sb.rollout, completion_ids=[[5, 2], [5, 7], [5, 5], [5, 2]])
    )
    ends = frozenset({0, 2})
    by_finish = run(AlgoConfig(mask_truncated=True), sb, batch, end_ids=ends)
    assert by_finish.loss_mask.sum(dim=1).tolist() == [0.0, 2.0, 0.0, 2.0]
    last_token = AlgoConfig(mask_truncated=True, truncated_by="last_token")
    assert run(last_token, sb, batch, end_ids=ends).loss_mask.sum(dim=1).tolist() == [2.0, 0.0, 0.0, 2.0]
    with pytest.raises(ValueError, match="needs the run's end ids"):
        run(last_token, sb, batch)


def test_turn_ids_and_lambda_weights_ride_along():
    eps = [Episode([1, 0, 1], [0, 0, 1]), Episode([1, 1, 1], [0, 1, 1])]
    sb, batch = scored([1.0, 0.0], 2, [3, 3], episodes=eps)
    inp = run(AlgoConfig(ratio_level="turn"), sb, batch)
    assert inp.turn_ids.tolist() == [[0, 0, 1], [0, 1, 1]]

    class Lam:
        def weight_fn(self, lengths_N, G):
            return lambda rows: lengths_N[rows] * G  # lengths [3, 3], G 2 -> [6, 6]

    inp = run(AlgoConfig(aggregation="lambda-grpo"), sb, batch, lam=Lam())
    assert inp.seq_weights(slice(0, 2)).tolist() == [6.0, 6.0]


def test_tis_weights_weigh_the_policy_term_not_the_advantages():
    # sampler logprobs 0 on every token; old = log 0.5 on row 0 -> w = min(0.5, cap) = 0.5; row 1 old = 0 -> w = 1.
    # The advantages stay the estimator's (+-0.5 / S): the weight is a factor of the policy term (TRL: loss * ratio)
    sb, batch = scored([1.0, 0.0], 2, [1, 1])
    old = torch.tensor([[math.log(0.5)], [0.0]])
    inp = run(AlgoConfig(), sb, batch, LogProbs(old), tis=TISSettings(cap=2.0))
    assert inp.advantages.flatten().tolist() == pytest.approx([0.5 / S, -0.5 / S], rel=1e-5)
    assert inp.policy_weight.flatten().tolist() == pytest.approx([0.5, 1.0])
    assert run(AlgoConfig(), sb, batch, LogProbs(old)).policy_weight is None  # no correction on: no weight


def test_policy_weights_multiply():
    # sampler logprob -1 on both rows; pi_old / pi_sampler = 0.4 on row 0, 1.5 on row 1.
    # TIS (cap 2): [0.4, 1.5]; IcePop ([0.5, 2]): 0.4 is outside -> [0, 1]; the policy weight is the product [0, 1.5]
    sb, batch = scored([1.0, 0.0], 2, [1, 1])
    for row in sb.rollout.sampling_logprobs:
        row[:] = [-1.0]
    old = torch.tensor([[-1.0 + math.log(0.4)], [-1.0 + math.log(1.5)]])
    tis, icepop = TISSettings(cap=2.0), MismatchSettings("token")
    assert run(AlgoConfig(), sb, batch, LogProbs(old), tis=tis).policy_weight.flatten().tolist() == pytest.approx(
        [0.4, 1.5]
    )
    inp = run(AlgoConfig(), sb, batch, LogProbs(old), tis=tis, mismatch=icepop)
    assert inp.policy_weight.flatten().tolist() == pytest.approx([0.0, 1.5])
    assert inp.advantages.flatten().tolist() == pytest.approx([0.5 / S, -0.5 / S], rel=1e-5)  # unweighted


def test_needed_logprobs_follow_the_declarations_of_the_running_stages():
    # (old, ref, entropy)
    assert needed_logprobs(StepSettings(AlgoConfig())) == (False, False, False)
    assert needed_logprobs(StepSettings(AlgoConfig(num_iterations=2))) == (True, False, False)
    assert needed_logprobs(StepSettings(AlgoConfig(beta=0.1))) == (False, True, False)
    assert needed_logprobs(StepSettings(AlgoConfig(beta=0.1, kl_placement="reward"))) == (True, True, False)
    assert needed_logprobs(StepSettings(AlgoConfig(entropy_advantage=True))) == (True, False, True)
    assert needed_logprobs(StepSettings(AlgoConfig(), tis=TISSettings(cap=2.0))) == (True, False, False)
    # a slice trained after an update (TRL's steps_per_generation > gradient_accumulation_steps) needs pi_old
    assert needed_logprobs(StepSettings(AlgoConfig(), stale_slices=True)) == (True, False, False)
    assert needed_logprobs(StepSettings(AlgoConfig(), mismatch=MismatchSettings(mode="token"))) == (True, False, False)
    # estimators and masks declare what they read (registry.StageSpec); entropies imply pi_old
    assert needed_logprobs(StepSettings(AlgoConfig(advantage="gigpo"))) == (False, False, False)
    assert needed_logprobs(StepSettings(AlgoConfig(advantage="gtpo"))) == (True, False, True)
    assert needed_logprobs(StepSettings(AlgoConfig(entropy_top_fraction=0.5))) == (True, False, True)
    assert needed_logprobs(StepSettings(AlgoConfig(mask_truncated=True))) == (False, False, False)
    # a plugin that declared nothing gets every log-probability
    assert needed_logprobs(StepSettings(AlgoConfig(advantage="my_module:adv"))) == (True, False, True)
    assert needed_logprobs(StepSettings(AlgoConfig(token_masks=["my_module:mask"]))) == (True, False, True)


def test_mo_grpo_then_edge_stages():
    # MO-GRPO: components [[1, 0], [0, 1]] (rows x functions), weights (1, 0.5). Within the group each
    # component is z-scored: function 0 [1, 0] -> +-0.5 / S = +-0.70700; function 1 [0, 1] -> -+0.70700.
    # Weighted sums: row 0 = 0.70700 - 0.5 * 0.70700 = 0.35350, row 1 = -0.35350.
    # GRPO on those: mean 0, unbiased std sqrt(2 * 0.35350^2) = 0.49993 -> A = +-0.35350 / (0.49993 + 1e-4)
    sb, batch = scored([1.0, 0.5], 2, [1, 1])
    sb.rewards_NF = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    z = 0.5 / S
    summed = z - 0.5 * z
    a_mo = summed / (math.sqrt(2) * summed + 1e-4)
    inp = run(AlgoConfig(), sb, batch, component_weights=(1.0, 0.5))
    assert inp.advantages.tolist() == pytest.approx([a_mo, -a_mo], rel=1e-5)
    # EDGE after it: token entropies 0.5 and 1.5 (one token each), batch mean 1.0 -> scales 2 and 2/3
    lp = LogProbs(torch.zeros(2, 1), None, torch.tensor([[0.5], [1.5]]))
    inp = run(AlgoConfig(entropy_advantage=True), sb, batch, lp, component_weights=(1.0, 0.5))
    assert inp.advantages.tolist() == pytest.approx([2 * a_mo, -a_mo * 2 / 3], rel=1e-5)
    assert inp.metrics["eda/scale/max"] == pytest.approx(2.0)


def test_a_stage_with_its_own_switch_runs_with_no_name_list_to_edit():
    # a token mask registered with its switch (StageSpec.active) runs whenever the switch is on, after the
    # built-in ones; it declared no needs, so no log-probabilities are taken for it
    from grpokit.algo import registry

    spec = registry.StageSpec(active=lambda s: s.algo.max_sampling_rounds == 7)

    @registry.register_token_mask("zz_first_token", spec)
    def first_token(ctx):
        keep = torch.zeros_like(ctx.mask_NT)
        keep[:, 0] = 1
        return ctx.mask_NT * keep

    try:
        assert mask_names(StepSettings(AlgoConfig())) == []
        on = AlgoConfig(max_sampling_rounds=7, mask_truncated=True)
        assert mask_names(StepSettings(on)) == ["overlong", "zz_first_token"]
        assert needed_logprobs(StepSettings(on)) == (False, False, False)
        sb, batch = scored([1.0, 0.0], 2, [2, 2])  # both rows end with eos: overlong keeps them
        assert run(on, sb, batch).loss_mask.tolist() == [[1.0, 0.0], [1.0, 0.0]]
    finally:
        del registry.TOKEN_MASKS["zz_first_token"], registry.STAGE_SPECS["token mask"]["zz_first_token"]


def test_a_policy_only_plugin_mask_narrows_the_policy_term_alone():
    # StageSpec(policy_only=True): the mask's tokens leave the policy term only (UpdateInputs.policy_mask);
    # the loss mask, which the normalisers and the KL read, keeps them
    from grpokit.algo import registry

    @registry.register_token_mask("zz_last_token_only", registry.StageSpec(policy_only=True))
    def last_token(ctx):
        keep = torch.zeros_like(ctx.mask_NT)
        keep[:, -1] = 1
        return ctx.mask_NT * keep

    try:
        sb, batch = scored([1.0, 0.0], 2, [2, 2])
        inp = run(AlgoConfig(token_masks=["zz_last_token_only"]), sb, batch)
        assert inp.loss_mask.tolist() == [[1.0, 1.0], [1.0, 1.0]]
        assert inp.policy_mask.tolist() == [[0.0, 1.0], [0.0, 1.0]]
    finally:
        del registry.TOKEN_MASKS["zz_last_token_only"], registry.STAGE_SPECS["token mask"]["zz_last_token_only"]


def test_row_advantages_cross_to_the_cpu_once_a_step_one_number_a_row(monkeypatch):
    """samples.jsonl and grpokit.trl's _logs["advantages"] show each row's advantage: a token-level (N, T) one is
    averaged over the row where it lives, so N numbers cross to the CPU, not N * T, and once for the step's batch
    (both readers read the same inputs). Rows [1, 2, 3] and [0, 0, 3]: means 2 and 1."""
    from grpokit.algo.pipeline import UpdateInputs

    copied: list[tuple[int, ...]] = []
    cpu = torch.Tensor.cpu

    def spy(self, *args, **kwargs):
        copied.append(tuple(self.shape))
        return cpu(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "cpu", spy)
    adv = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 3.0]], dtype=torch.bfloat16)
    inp = UpdateInputs(batch=None, advantages=adv, loss_mask=torch.ones(2, 3), old_logp=None, ref_logp=None)
    assert inp.row_advantages.tolist() == [2.0, 1.0] and inp.row_advantages.dtype == torch.float32
    assert copied == [(2,)]  # before: (2, 3) copied, then averaged; and again for each reader
    seq = UpdateInputs(batch=None, advantages=torch.tensor([0.5, -0.5]), loss_mask=None, old_logp=None, ref_logp=None)
    assert seq.row_advantages.tolist() == [0.5, -0.5]
