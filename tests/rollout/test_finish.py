"""rollout/finish.py: why a completion ended when its sampler did not say (TRL's last-token rule)."""

from grpokit.rollout.finish import end_ids, finish_by_last_token


def test_a_completion_ended_when_its_last_token_is_eos_or_pad_whatever_its_length():
    ends = end_ids({2, 3}, 0)  # EOS ids 2 and 3, pad 0
    assert ends == {0, 2, 3}
    rows = [
        [5, 6, 2],  # ends on EOS 2: "eos"
        [5, 6, 7],  # no end id last: cut, "length", though shorter than any cap
        [5, 3],  # the second EOS id counts too
        [5, 6, 0],  # the pad id counts as TRL counts it
        [2, 5],  # an EOS inside but not last: cut
        [],  # no last token: nothing ended it, so cut
    ]
    assert finish_by_last_token(rows, ends) == ["eos", "length", "eos", "eos", "length", "length"]


def test_no_pad_id_means_only_the_eos_ids_end():
    assert end_ids([2], None) == {2}
    assert finish_by_last_token([[4, 2], [4, 0]], end_ids([2], None)) == ["eos", "length"]


def test_the_rule_and_the_overlong_filter_are_algo_masks_one_rule():
    import pytest
    import torch

    from grpokit.algo.masks import ended_rows, overlong_filter

    rows, ends = [[5, 2], [5, 6], []], end_ids([2], None)
    # finish_by_last_token is ended_rows read as reasons: [True, False, False] -> eos, length, length
    assert ended_rows(rows, ends) == [True, False, False]
    assert finish_by_last_token(rows, ends) == ["eos", "length", "length"]
    assert finish_by_last_token(rows, frozenset()) == ["length"] * 3  # no end ids: nothing ended
    mask = torch.ones(3, 2)
    reasons = ["length", "eos", "eos"]  # the sampler's reasons disagree with the last tokens on purpose
    # finish: row 0 ("length") leaves; last_token: rows 1 and 2 (no end id last) leave instead
    assert overlong_filter(mask, reasons, "finish", None)[:, 0].tolist() == [0.0, 1.0, 1.0]
    assert overlong_filter(mask, reasons, "last_token", ended_rows(rows, ends))[:, 0].tolist() == [1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="needs the run's end ids"):
        overlong_filter(mask, reasons, "last_token", None)
