"""Sampling one token per row (rollout/sampling.py ``sample_tokens``).

Without top-k, top-p, min-p or a repetition penalty (the GRPO default) a draw is argmax(p / q) over
p = softmax(logits / T) and q ~ Exp(1), torch.multinomial's one-sample draw; with them, the general
path draws argmax(log p - log q) over ``process_logits``' filtered log-probabilities. Both take the same
noise from the generator, so they choose the same tokens (argmax(p / q) = argmax(log p - log q) in exact
arithmetic) and report log p of that token to the rounding of the dtype.
"""

from __future__ import annotations

import math

import pytest
import torch

from grpokit.rollout import sampling
from grpokit.rollout.sampling import SamplingParams, draw_softmax, filtered, process_logits, sample_tokens


def general_draw(x_NV: torch.Tensor, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The general path on logits already divided by the temperature: log_softmax, argmax(log p - log q)."""
    logp = torch.log_softmax(x_NV, dim=-1)
    noise = torch.empty_like(logp).exponential_(1, generator=generator)
    tok = torch.sub(logp, noise.log_(), out=noise).argmax(dim=-1)
    return tok, logp.gather(1, tok[:, None])[:, 0]


def test_a_draw_by_hand():
    # p = [0.5, 0.3, 0.2]; with the noise q of the seeded generator the token is argmax(p / q) and
    # its log-probability log p[token]: log 0.5 = -0.693, log 0.3 = -1.204 or log 0.2 = -1.609
    x = torch.log(torch.tensor([[0.5, 0.3, 0.2]] * 4))
    q = torch.empty_like(x).exponential_(1, generator=torch.Generator().manual_seed(7))
    tok, logp = draw_softmax(x, torch.Generator().manual_seed(7))
    assert tok.tolist() == (torch.tensor([0.5, 0.3, 0.2]) / q).argmax(-1).tolist()
    for t, lp in zip(tok.tolist(), logp.tolist()):
        assert lp == pytest.approx(math.log([0.5, 0.3, 0.2][t]), abs=1e-6)
    assert len(set(tok.tolist())) > 1  # four rows, more than one token drawn: the noise decides


@pytest.mark.parametrize("shape", [(16, 49152), (3, 7), (1, 151936)])
def test_the_draws_noise_is_torchs_exponential_to_the_bit_and_leaves_the_generator_where_it_would(shape):
    """sampling.exponential_noise: on a CPU in float32, uniform float64 draws and a vectorised logarithm in
    place of torch's one-number-at-a-time exponential_ kernel: the same numbers, the same generator state."""
    assert sampling._same_as_exponential()  # this torch: the fast path is taken, and checked here
    for seed in range(4):
        a, b = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        want = torch.empty(shape).exponential_(1, generator=a)
        got = sampling.exponential_noise(torch.empty(shape), b)
        assert got.dtype == torch.float32 and torch.equal(got, want), seed
        assert torch.equal(a.get_state(), b.get_state())


def test_the_draws_noise_falls_back_to_exponential_where_the_probe_disagrees(monkeypatch):
    monkeypatch.setattr(sampling, "_same_as_exponential", lambda: False)
    monkeypatch.setattr(sampling, "_vectorised_exponential", lambda *a: pytest.fail("the probe said no"))
    want = torch.empty(4, 100).exponential_(1, generator=torch.Generator().manual_seed(1))
    assert torch.equal(sampling.exponential_noise(torch.empty(4, 100), torch.Generator().manual_seed(1)), want)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_softmax_draw_chooses_what_the_general_path_chooses(dtype, tol, temperature, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(64, 5000, generator=g, dtype=dtype) * (1 + 4 * torch.rand(64, 1, generator=g, dtype=dtype))
    x = logits / temperature
    tok, logp = draw_softmax(x, torch.Generator().manual_seed(100 + seed))
    want_tok, want_logp = general_draw(x, torch.Generator().manual_seed(100 + seed))
    assert torch.equal(tok, want_tok)
    assert logp.dtype == dtype and (logp - want_logp).abs().max() < tol
    # and it is torch.multinomial's draw, to the bit: the same algorithm over the same p and noise
    want = torch.multinomial(torch.softmax(x, -1), 1, generator=torch.Generator().manual_seed(100 + seed))[:, 0]
    assert torch.equal(tok, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sample_tokens_takes_the_softmax_draw_only_without_filters(dtype):
    logits = (torch.randn(32, 3000, generator=torch.Generator().manual_seed(3)) * 3).to(dtype)
    for params in (SamplingParams(), SamplingParams(temperature=0.7)):
        assert not filtered(params)
        tok, logp = sample_tokens(logits, params, torch.Generator().manual_seed(9))
        x = logits.float() / params.temperature
        want_tok, want_logp = general_draw(x, torch.Generator().manual_seed(9))
        assert torch.equal(tok, want_tok) and torch.allclose(logp, want_logp, atol=1e-5)
    for params in (  # the general path, unchanged: process_logits' log-probabilities to the bit
        SamplingParams(top_k=50),
        SamplingParams(top_p=0.9),
        SamplingParams(min_p=0.05),
        SamplingParams(repetition_penalty=1.2),  # penalised by the caller; the general path as before
    ):
        assert filtered(params)
        tok, logp = sample_tokens(logits, params, torch.Generator().manual_seed(9))
        want = process_logits(logits, params)
        noise = torch.empty_like(want).exponential_(1, generator=torch.Generator().manual_seed(9))
        assert torch.equal(tok, (want - noise.log()).argmax(-1))
        assert torch.equal(logp, want.gather(1, tok[:, None])[:, 0])


def test_a_nan_logit_gives_a_nan_log_probability_and_hidden_tokens_are_never_drawn():
    logits = torch.zeros(3, 6)
    logits[1, 4] = float("nan")  # row 1: a NaN (a diverged model): its log-probability must be NaN for _record
    logits[:, :2] = -1e4  # hidden placeholders (data/vision.hide_placeholders): p = 0
    logits[2, 3] = float("-inf")
    for _ in range(20):
        tok, logp = sample_tokens(logits, SamplingParams(), torch.Generator().manual_seed(_))
        assert math.isnan(logp[1].item()) and math.isnan(sum(logp.tolist()))  # what _record checks
        assert tok[0] >= 2 and tok[2] >= 2 and tok[2] != 3
        assert logp[0].item() == pytest.approx(math.log(1 / 4)) and logp[2].item() == pytest.approx(math.log(1 / 3))
