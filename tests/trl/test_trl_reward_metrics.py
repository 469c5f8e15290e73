"""TRL's reward metrics (grpokit/trl/reward_stats.py): rewards/<f>/mean and /std, reward, reward_std and
frac_reward_zero_std as TRL 1.16 computes them over a generation batch, worked out by hand; and one
grpokit.trl step logs them."""

import math

import pytest
import torch

from grpokit.trl.reward_stats import nanstd, trl_reward_metrics

NAN = float("nan")
# three groups of G=2; f and g weighted 1 and 2; row 2 is unscorable (both None)
REWARDS_NF = torch.tensor([[1.0, 0.0], [3.0, NAN], [NAN, NAN], [2.0, 1.0], [2.0, 1.0], [2.0, 1.0]])


def test_reward_metrics_by_hand():
    got = trl_reward_metrics(REWARDS_NF, [1.0, 2.0], ["f", "g"], group_size=2)
    # f: 1, 3, 2, 2, 2 -> mean 2, squared deviations 1 + 1 = 2 over 5 - 1: std sqrt(0.5)
    # g: 0, 1, 1, 1 -> mean 0.75, squared deviations 0.5625 + 3 * 0.0625 = 0.75 over 3: std 0.5
    # total (f + 2g, NaN for the unscorable row): 1, 3, 4, 4, 4 -> mean 3.2, squared deviations
    # 4.84 + 0.04 + 3 * 0.64 = 6.8 over 4: std sqrt(1.7)
    # groups' stds: sqrt(2); NaN (one value); 0 -> 2 of 6 completions in a zero-std group
    want = {
        "rewards/f/mean": 2.0,
        "rewards/f/std": math.sqrt(0.5),
        "rewards/g/mean": 0.75,
        "rewards/g/std": 0.5,
        "reward": 3.2,
        "reward_std": math.sqrt(1.7),
        "frac_reward_zero_std": 1 / 3,
    }
    assert got == pytest.approx(want)


def test_batch_scaling_and_normalize_then_sum_count_zero_std_over_the_batch():
    # scale_rewards=batch: the batch std sqrt(1.7) is not 0, so no completion counts
    assert trl_reward_metrics(REWARDS_NF, [1.0, 2.0], ["f", "g"], 2, "batch")["frac_reward_zero_std"] == 0.0
    flat_and_not = torch.tensor([[1.0], [1.0], [0.0], [2.0]])  # one flat group, one not
    assert trl_reward_metrics(flat_and_not, [1.0], ["f"], 2)["frac_reward_zero_std"] == 0.5
    # normalize_then_sum: z-scores 0, 0, -1/(sqrt 2 + 1e-4), +1/(sqrt 2 + 1e-4): their batch std is not 0
    got = trl_reward_metrics(flat_and_not, [1.0], ["f"], 2, "group", "normalize_then_sum")
    assert got["frac_reward_zero_std"] == 0.0
    both_flat = torch.tensor([[1.0], [1.0], [2.0], [2.0]])  # every z-score 0: the batch std is 0
    assert trl_reward_metrics(both_flat, [1.0], ["f"], 2, "group", "normalize_then_sum")["frac_reward_zero_std"] == 1.0
    # reward_std is the batch's Bessel std: 1, 1, 2, 2 -> mean 1.5, squared deviations 4 * 0.25 = 1 over 3;
    # grpokit's native reward_std, the mean of the groups' stds, would be 0
    assert trl_reward_metrics(both_flat, [1.0], ["f"], 2)["reward_std"] == pytest.approx(math.sqrt(1 / 3))


def test_a_failed_item_is_no_value_of_its_function_but_counts_in_the_total():
    # f failed on row 1 (it holds failure_value 0; row 2 is unscorable): f's own values 1, 2, 2, 2 -> mean 1.75,
    # squared deviations 0.5625 + 3 * 0.0625 = 0.75 over 3: std 0.5; counted as 0 the mean would be 7 / 5 = 1.4.
    # The total keeps the 0 as trained: 1, 0, NaN (unscorable), 4, 4, 4 -> reward 13 / 5 = 2.6
    r = REWARDS_NF.clone()
    r[1, 0], r[1, 1] = 0.0, NAN
    failed = torch.zeros_like(r, dtype=torch.bool)
    failed[1, 0] = True
    got = trl_reward_metrics(r, [1.0, 2.0], ["f", "g"], 2, failed_NF=failed)
    assert got["rewards/f/mean"] == pytest.approx(1.75) and got["rewards/f/std"] == pytest.approx(0.5)
    assert got["reward"] == pytest.approx(2.6)
    assert trl_reward_metrics(r, [1.0, 2.0], ["f", "g"], 2)["rewards/f/mean"] == pytest.approx(1.4)  # unmasked


def test_nanstd_is_trls():
    trl_utils = pytest.importorskip("trl.trainer.utils")
    x = torch.tensor([[1.0, NAN, 4.0, 2.0], [NAN, NAN, 5.0, NAN]])
    for dim in (None, 0, 1):
        kw = {} if dim is None else {"dim": dim}
        assert torch.allclose(nanstd(x, **kw), trl_utils.nanstd(x, **kw), equal_nan=True)


def test_one_grpokit_trl_step_logs_trls_reward_std(tmp_path):
    """8 completions of one step scored by their length: the logged reward_std and rewards/lenr/std are the
    Bessel-corrected std of the 8 values the function returned (TRL's), not grpokit's mean of group stds."""
    from datasets import Dataset

    from grpokit.trl import GRPOConfig, GRPOTrainer
    from helpers.trl_models import make_chat_model, small_args

    got = []

    def lenr(completions, **kw):
        r = [float(len(c[0]["content"])) for c in completions]
        got.extend(r)
        return r

    data = Dataset.from_list([{"prompt": [{"role": "user", "content": f"say {w}"}]} for w in ("ab", "cd", "ef")])
    args = small_args(
        GRPOConfig, tmp_path / "out", max_steps=1, logging_steps=1, per_device_train_batch_size=8, report_to="none"
    )
    trainer = GRPOTrainer(str(make_chat_model(tmp_path / "m")), reward_funcs=[lenr], train_dataset=data, args=args)
    trainer.train()
    entry = trainer.state.log_history[0]
    want = torch.tensor(got).std().item()  # torch's default is Bessel-corrected
    assert entry["reward_std"] == pytest.approx(want) and entry["rewards/lenr/std"] == pytest.approx(want)


def test_reward_functions_get_trls_trainer_state(tmp_path):
    """num_iterations=2, max_steps=4, logging_steps=1: TRL samples before step 1 (global_step 0, nothing
    logged) and again before step 3 (two optimizer steps done, each logged); trainer_state is TRL's
    TrainerState (optimizer steps, max_steps 4), not grpokit's sampling rounds (0 then 1, of 2)."""
    from datasets import Dataset

    from grpokit.trl import GRPOConfig, GRPOTrainer
    from helpers.trl_models import make_chat_model, small_args

    calls = []

    def sched(completions, trainer_state, **kw):
        calls.append((trainer_state.global_step, trainer_state.max_steps, len(trainer_state.log_history)))
        return [float(len(c[0]["content"])) for c in completions]

    data = Dataset.from_list([{"prompt": [{"role": "user", "content": f"say {w}"}]} for w in ("ab", "cd")])
    args = small_args(GRPOConfig, tmp_path / "out", max_steps=4, num_iterations=2, logging_steps=1, report_to="none")
    GRPOTrainer(str(make_chat_model(tmp_path / "m")), reward_funcs=[sched], train_dataset=data, args=args).train()
    assert calls == [(0, 4, 0), (2, 4, 2)]
