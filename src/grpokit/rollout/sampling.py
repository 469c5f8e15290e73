"""How one token per row is drawn from a decode step's logits (stage 2), for every engine of hf.py.

The controls (``SamplingParams``, TRL's and vLLM's names), transformers' order of the repetition
penalty, temperature, top-k, top-p and min-p (``process_logits``), and the draw itself: the
model's distribution at a temperature by ``draw_softmax`` (or nn/vocab.py's Triton kernel where
``model.vocab_kernels`` marked the model), a filtered one by Gumbel-max over the processed
log-probabilities. Each draw returns the token and its log-probability under the distribution it
was drawn from (with top-k, top-p or min-p: the truncated distribution, renormalised over the kept
tokens): what the sampler/trainer mismatch metrics and TIS compare. ``support_log_mass`` replays the
truncation on the trainer's logits, so that the trainer's side of that ratio is renormalised over the
same kind of support (train/logprobs.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from grpokit.nn import vocab

if TYPE_CHECKING:
    from grpokit.config.rollout import RolloutConfig


@dataclass(frozen=True)
class SamplingParams:
    """Sampling controls; temperature 0 means greedy decoding."""

    max_new_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    stop: tuple[str, ...] = ()
    repetition_penalty: float = 1.0


def sampling_params(r: "RolloutConfig") -> SamplingParams:
    """The sampling settings of a rollout section: the one construction training, the held-out evaluation
    (train/evaluate.py, greedy) and ``grpokit eval`` share."""
    return SamplingParams(
        max_new_tokens=r.max_new_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        min_p=r.min_p,
        stop=tuple(r.stop),
        repetition_penalty=r.repetition_penalty,
    )


def penalize_repetition(logits_NV: torch.Tensor, seen_NV: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL's repetition penalty (Keskar et al., 2019) as transformers' RepetitionPenaltyLogitsProcessor:
    a token already seen (``seen_NV`` True: in the prompt or the completion so far) has its logit
    divided by ``penalty`` when positive, multiplied by it when not. ``penalty`` 1 changes nothing."""
    x = logits_NV.float()
    penalised = torch.where(x > 0, x / penalty, x * penalty)
    return torch.where(seen_NV, penalised, x)


def process_logits(logits_NV: torch.Tensor, p: SamplingParams, seen_NV: torch.Tensor | None = None) -> torch.Tensor:
    """Log-probabilities after the repetition penalty (needs ``seen_NV``, the tokens of prompt and
    completion so far), then temperature, top-k, top-p and min-p (removed tokens get -inf): HF's order."""
    x = logits_NV.float()
    if p.repetition_penalty != 1.0 and seen_NV is not None:
        x = penalize_repetition(x, seen_NV, p.repetition_penalty)
    if p.temperature != 1.0:  # at 1 the division is a whole (rows x vocabulary) pass that changes nothing
        x = x / p.temperature
    if p.top_k > 0 and p.top_k < x.shape[-1]:
        kth = torch.topk(x, p.top_k, dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    logp = torch.log_softmax(x, dim=-1)
    if p.min_p > 0:
        cut = logp.max(dim=-1, keepdim=True).values + torch.log(torch.tensor(p.min_p))
        logp = logp.masked_fill(logp < cut, float("-inf"))
    if p.top_p < 1.0:
        sorted_logp, order = torch.sort(logp, dim=-1, descending=True)
        cum = sorted_logp.exp().cumsum(dim=-1)
        drop_sorted = (cum - sorted_logp.exp()) >= p.top_p  # keep tokens until the mass reaches top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logp = logp.masked_fill(drop, float("-inf"))
    if p.top_k > 0 or p.min_p > 0 or p.top_p < 1.0:
        logp = torch.log_softmax(logp, dim=-1)  # renormalise over the kept tokens
    return logp


def seen_tokens(prompt_ids: list[list[int]], G: int, vocab: int, device) -> torch.Tensor:
    """(N, V) tokens of each row's prompt, for the repetition penalty (completion tokens are added as sampled)."""
    seen = torch.zeros((len(prompt_ids) * G, vocab), dtype=torch.bool, device=device)
    for i, p in enumerate(prompt_ids):
        seen[i * G : (i + 1) * G, torch.tensor(p, dtype=torch.long, device=device)] = True
    return seen


def sample_tokens(
    logits: torch.Tensor, params: SamplingParams, generator, triton: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row (greedy at temperature 0) and its log-probability under the sampling distribution.
    ``triton``: the model's distribution at a temperature is drawn by one Triton kernel (nn/vocab.py) where
    it can read the logits; the same distribution, another random stream than torch's."""
    if params.temperature == 0:
        tok = logits.argmax(dim=-1)
        return tok, torch.log_softmax(logits.float(), dim=-1).gather(1, tok[:, None])[:, 0]
    if not filtered(params):  # the GRPO default: the model's distribution at a temperature
        if triton and vocab.usable(logits):
            return vocab.sample(logits, params.temperature, generator)
        x = logits.float()
        return draw_softmax(x / params.temperature if params.temperature != 1.0 else x, generator)
    logp = process_logits(logits, params)  # penalised by the caller: no seen_NV passed, no second penalty
    # Gumbel-max: argmax(log p - log q), q ~ Exp(1), is what torch.multinomial computes for one sample
    # (argmax of p / q, from the same draws of the same generator), without the probability tensor and
    # the validity checks it makes first (three more passes over the (rows x vocabulary) tensor and two
    # host syncs a step). The generator lives on `device`.
    noise = exponential_noise(logp, generator)
    tok = torch.sub(logp, noise.log_(), out=noise).argmax(dim=-1)
    return tok, logp.gather(1, tok[:, None])[:, 0]


def truncates(p: SamplingParams) -> bool:
    """Whether ``p`` samples from a truncated support: top-k, top-p or min-p remove tokens (the repetition
    penalty and the temperature reshape the distribution but keep every token)."""
    return p.top_k > 0 or p.top_p < 1.0 or p.min_p > 0


def support_log_mass(
    logits_KV: torch.Tensor, targets_K: torch.Tensor, p: SamplingParams, *, temperature: float
) -> torch.Tensor:
    """``(K,)`` log of the probability mass, under ``softmax(logits / temperature)``, of the tokens that
    ``p``'s top-k, top-p and min-p keep from these logits at ``p.temperature`` (``process_logits``' support: the
    sampler's), the target token always counted in (a token the sampler drew is on its support even where the
    trainer's logits rank it just outside). ``log p(target) - support_log_mass`` is the target's
    log-probability under the truncated, renormalised distribution: what the sampler recorded (Keep Sampling
    Mask, DeepSeek-V3.2, arXiv:2512.02556 section 3.1; TRL 1.17 renormalises the trainer's side the same way).
    0 where ``p`` truncates nothing.
    Two temperatures, named apart because they can differ: ``p.temperature`` is the sampler's and decides which
    tokens are kept (top-p and min-p depend on it); ``temperature`` is the trained distribution's (the loss's
    pi_old, algo.loss_temperature), under which the kept tokens' mass is measured, so ``log pi_old - mass`` is
    pi_old renormalised over the sampler's support and a temperature gap between the two stays visible.
    The repetition penalty is not replayed (it needs each position's seen tokens)."""
    x = logits_KV.double() if logits_KV.dtype == torch.float64 else logits_KV.float()
    if not truncates(p) or p.temperature == 0:  # greedy records the untruncated distribution (sample_tokens)
        return torch.zeros(x.shape[0], dtype=x.dtype, device=x.device)
    cut = SamplingParams(temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, min_p=p.min_p)  # no penalty
    kept = torch.isfinite(process_logits(x, cut))  # (K, V)
    kept[torch.arange(x.shape[0], device=x.device), targets_K] = True
    logp = torch.log_softmax(x / temperature if temperature != 1.0 else x, dim=-1)
    return torch.logsumexp(logp.masked_fill(~kept, float("-inf")), dim=-1)


def filtered(p: SamplingParams) -> bool:
    """Whether ``p`` changes the distribution beyond the temperature: top-k, top-p, min-p (``process_logits``
    then removes tokens and renormalises) or a repetition penalty."""
    return p.top_k > 0 or p.top_p < 1.0 or p.min_p > 0 or p.repetition_penalty != 1.0


def draw_softmax(x_NV: torch.Tensor, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row from ``softmax(x_NV)`` (float32 or float64 logits, already divided by the
    temperature) and its log-probability.

    torch.multinomial's one-sample draw: argmax of p / q, q ~ Exp(1) (the same draws from the same
    generator as the general path's argmax(log p - log q)); the token's log-probability is log p[token].
    One kernel over the (rows x vocabulary) tensor fewer than the general path: no log of the noise (a
    read and a write); the softmax costs what the log_softmax did, the division what the subtraction
    did. log p = x - logsumexp(x) would not do better: torch.logsumexp is four kernels over the
    tensor (amax, x - max written out, exp, sum), more work than one softmax.

    Against the general path: the same token unless two candidates' p / q tie to the float rounding
    (argmax(p / q) and argmax(log p - log q) are one choice in exact arithmetic); log-probabilities
    equal to the rounding of the dtype (tests/rollout/test_sampling.py). A NaN logit makes its row's
    probabilities NaN, so the drawn token's log-probability is NaN and hf.py's ``_record`` stops the rollout;
    tokens at -inf (or -1e4, hidden placeholders) have p = 0 and are never drawn."""
    p = torch.softmax(x_NV, dim=-1)  # (N, V)
    noise = exponential_noise(p, generator)
    tok = torch.div(p, noise, out=noise).argmax(dim=-1)
    return tok, p.gather(1, tok[:, None])[:, 0].log()


VECTORISED_NOISE = True  # False: exponential_ everywhere (bench/decode_profile.py --ab compares the two)


def exponential_noise(like: torch.Tensor, generator) -> torch.Tensor:
    """Exp(1) draws shaped like ``like``: ``torch.empty_like(like).exponential_(1, generator=generator)``,
    the same float32 numbers and the same generator state after them.

    Why not that call on a CPU: torch's CPU kernel draws each number and takes its logarithm one at a
    time on one core (17 ms for 16 rows of SmolLM2's 49,152 tokens, a sixth of a decode step; bench/RESULTS.md).
    It computes ``-log1p(-u)`` in float64 for a uniform ``u`` made of 53 bits of one 64-bit draw, and rounds
    that to float32. ``torch.rand`` in float64 makes the same uniforms from the same draws, one at a time
    too but without the logarithm, which then runs vectorised on every thread (5 + 5 ms on one thread).

    The vectorised float64 logarithm is not the C library's: 8.4 % of its results differ in the last
    place. Rounded to float32 they agree: none of 63 million draws differed (20 seeds of 64 x 49,152; a
    last-place difference changes the float32 only where the float64 lies within it of a rounding
    boundary, about 1 draw in 6 x 10^9). So float32 on a CPU takes this path where a probe agrees
    (``_same_as_exponential``: once per process, 4,096 draws from two copies of one generator, values and
    generator state); float64, other dtypes, CUDA and a torch whose kernel differs call ``exponential_``.
    """
    if VECTORISED_NOISE and like.device.type == "cpu" and like.dtype == torch.float32 and _same_as_exponential():
        return _vectorised_exponential(like.shape, generator)
    return torch.empty_like(like).exponential_(1, generator=generator)


def _vectorised_exponential(shape, generator) -> torch.Tensor:
    u = torch.rand(shape, dtype=torch.float64, generator=generator)
    return torch.log1p(u.neg_(), out=u).neg_().float()


@functools.lru_cache(maxsize=1)
def _same_as_exponential() -> bool:
    """Whether ``_vectorised_exponential`` equals torch's CPU ``exponential_`` in this torch on a probe."""
    a, b = torch.Generator().manual_seed(20261130), torch.Generator().manual_seed(20261130)
    want = torch.empty(2, 2048).exponential_(1, generator=a)
    got = _vectorised_exponential((2, 2048), b)
    return torch.equal(want, got) and torch.equal(a.get_state(), b.get_state())
