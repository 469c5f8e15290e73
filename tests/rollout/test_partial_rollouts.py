"""Partial rollouts (rollout/partial.py): a completion's first tokens drawn by version v, the rest by v + 1,
each token with its version and sampler logprob; the ratio per token; the staleness bound per token; a
3-step asynchronous run with them on; the kept-versus-recomputed cache difference, measured."""

import json
import math
import re

import pytest
import torch

from grpokit.algo.tis import tis_weights
from grpokit.rollout.partial import generate_partial, segment_version
from grpokit.rollout.sampling import SamplingParams
from grpokit.rollout.staleness import check_staleness, token_staleness
from grpokit.types import Rollout
from helpers.config_errors import section_error
from helpers.models import tiny_llama
from helpers.runs import make

PROMPTS = [[1, 5, 6, 7], [1, 9]]


def _logp_of(model, prompt: list[int], completion: list[int]) -> list[float]:
    """The oracle: log p(completion[t] | prompt + completion[:t]) by one full forward, no cache."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double().log_softmax(-1)
    return [logits[len(prompt) + t - 1, tok].item() for t, tok in enumerate(completion)]


def test_first_tokens_from_v_the_rest_from_v_plus_1():
    """K = 3 of T = 7: tokens 0-2 by version 4 (model_v), 3-5 by 5, 6 by 5 (the cap: batch index 5).
    Each token's sampler logprob is its own version's (checked against a cache-free forward of that
    version), and the trainer at step 5 (pi_old = version 5) gets ratio 1 on version-5 tokens and
    exp(log p5 - log p4) on version-4 tokens."""
    model_v, model_w = tiny_llama(seed=0), tiny_llama(seed=1)
    models = {4: model_v, 5: model_w}
    calls = []

    def version_model(m):
        v = segment_version(5, m, 4)  # batch 5 of a run with staleness 1 starts at version 4
        calls.append(v)
        return models[v], v

    params = SamplingParams(max_new_tokens=7, temperature=1.0)
    ro = generate_partial(
        version_model,
        PROMPTS,
        2,
        params,
        3,
        eos_token_ids=set(),
        pad_token_id=0,
        generator=torch.Generator().manual_seed(0),
        engine="dynamic",
    )
    assert calls == [4, 5, 5]
    assert ro.sampling_versions == [[4, 4, 4, 5, 5, 5, 5]] * 4
    assert ro.finish_reasons == ["length"] * 4
    old_rows, sampler_rows = [], []
    for i, toks in enumerate(ro.completion_ids):
        prompt = PROMPTS[i // 2]
        lp_v, lp_w = _logp_of(model_v, prompt, toks), _logp_of(model_w, prompt, toks)
        expected = lp_v[:3] + lp_w[3:]  # each token's own version
        assert ro.sampling_logprobs[i] == pytest.approx(expected, abs=1e-4)
        old_rows.append(lp_w)
        sampler_rows.append(ro.sampling_logprobs[i])
    old, sampler = torch.tensor(old_rows), torch.tensor(sampler_rows)
    w, _ = tis_weights(old, sampler, torch.ones_like(old), cap=1e9)
    for i in range(4):
        for t in range(7):
            want = 1.0 if t >= 3 else math.exp(old_rows[i][t] - sampler_rows[i][t])
            assert w[i, t].item() == pytest.approx(want, rel=1e-4)
    assert (w[:, :3] != 1).all()  # two different models: the version-4 tokens are reweighted


def test_the_staleness_bound_holds_per_token():
    """The rule: segment m of batch j is drawn by min(j - s + m, j) >= j - s, for every j, s and m."""
    for s in (1, 2, 3):
        for j in range(8):
            start = max(0, j - s)
            vs = [segment_version(j, m, start) for m in range(6)]
            assert vs == sorted(vs) and vs[0] == start and vs[-1] <= j
            assert all(j - v <= s for v in vs)
    ro = Rollout([[1]], [[3, 4, 5]], [[-1.0] * 3], ["length"], 1, sampling_versions=[[2, 3, 4]])
    assert token_staleness(ro, 4) == [2, 1, 0]
    assert check_staleness(ro, 4, 2) == (3, 3, 2)  # 3 tokens, ages summing 2 + 1 + 0, the oldest 2
    with pytest.raises(RuntimeError, match="drawn 3 steps ago, more than rollout.async_staleness=2"):
        check_staleness(ro, 5, 2)


def test_a_stop_string_across_a_segment_boundary_ends_the_completion():
    """The stop "ab" completed by the first token of a segment, the "a" being the last of the previous."""
    text = {3: "a", 4: "b", 5: "c"}
    decode = lambda ids: "".join(text.get(t, "?") for t in ids)
    tokens, logps, versions, reasons = [[5, 3, 4, 5]], [[-1.0] * 4], [[0, 0, 1, 1]], ["length"]
    from grpokit.rollout.partial import _cut_at_stop

    _cut_at_stop(0, 2, tokens, logps, versions, reasons, ("ab",), decode)
    assert tokens == [[5, 3, 4]] and versions == [[0, 0, 1]] and reasons == ["stop"] and len(logps[0]) == 3


def test_three_async_steps_with_partial_rollouts_train_and_log(tiny_model_dir, tmp_path):
    tr = make(
        tiny_model_dir,
        tmp_path / "run",
        **{
            "rollout.async_staleness": 1,
            "rollout.async_partial_tokens": 2,
            "train.steps": 3,
            "data.eval_size": 0,
        },
    )
    seen = []
    tr.on_sampled.append(lambda sb: seen.append(sb.rollout.sampling_versions))
    before = {k: v.clone() for k, v in tr.model.state_dict().items()}
    tr.train()
    assert any(not torch.equal(before[k], v) for k, v in tr.model.state_dict().items())
    steps = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if '"reward"' in l]
    assert len(steps) == 3 and len(seen) == 3
    for j, (versions, row) in enumerate(zip(seen, steps)):
        for vs in versions:  # max_new_tokens 6, segments of 2: version j-1 for tokens 0-1, then j
            assert vs == ([max(0, j - 1)] * 2 + [j] * 4)[: len(vs)], (j, vs)
        ages = [j - v for vs in versions for v in vs]
        assert row["rollout/staleness"] == pytest.approx(sum(ages) / len(ages))
        assert row["rollout/staleness_max"] == max(ages)
        assert "tis/ratio_max" in row
    assert steps[0]["rollout/staleness_max"] == 0 and steps[2]["rollout/staleness_max"] == 1
    assert 0 < steps[2]["rollout/staleness"] < 1  # two versions in one batch


def test_kept_cache_against_recomputed_cache_measured():
    """What keeping the old version's keys/values costs: the continuation's logprobs under version v + 1
    read through version v's cache of the prefix, against a full recompute under v + 1. Version v + 1
    is version v after one Adam step (lr 1e-3) on a random batch; the number goes to docs/SCALING.md."""
    torch.manual_seed(0)
    model_v = tiny_llama(seed=0)
    model_w = tiny_llama(seed=0).train()
    opt = torch.optim.Adam(model_w.parameters(), lr=1e-3)
    batch = torch.randint(3, 32, (4, 24))
    model_w(input_ids=batch, labels=batch).loss.backward()
    opt.step()
    model_w.eval()
    seq = torch.randint(3, 32, (1, 64))
    prefix, cont = seq[:, :32], seq[:, 32:]
    with torch.no_grad():
        kept = model_v(input_ids=prefix, use_cache=True).past_key_values  # the old version's cache
        logits_kept = model_w(input_ids=cont, past_key_values=kept).logits[0, :-1].double().log_softmax(-1)
        logits_full = model_w(input_ids=seq).logits[0, 32:-1].double().log_softmax(-1)
        logits_old = model_v(input_ids=seq).logits[0, 32:-1].double().log_softmax(-1)
    pick = lambda logits: logits.gather(-1, cont[0, 1:, None])[:, 0]
    diff = (pick(logits_kept) - pick(logits_full)).abs()
    update = (pick(logits_old) - pick(logits_full)).abs()  # what the update itself moves, for scale
    print(
        f"kept vs recomputed cache: |dlogp| mean {diff.mean():.2e} max {diff.max():.2e}; "
        f"the update itself: mean {update.mean():.2e} max {update.max():.2e}"
    )
    assert 0 < diff.mean().item() < update.mean().item()


@pytest.mark.parametrize(
    "rollout, env, message",
    [
        ({"async_partial_tokens": -1, "async_staleness": 1}, {}, r"^rollout.async_partial_tokens=-1 must be >= 0"),
        ({"async_partial_tokens": 2}, {}, r"^rollout.async_partial_tokens=2 needs rollout.async_staleness >= 1$"),
        (
            {"async_partial_tokens": 2, "async_staleness": 1},
            {"tools": ["python"]},
            r"^rollout.async_partial_tokens samples one-turn completions, not episodes",
        ),
    ],
)
def test_what_partial_rollouts_cannot_do_is_one_sentence(rollout, env, message):
    assert re.search(message, section_error(rollout=rollout, env=env))
