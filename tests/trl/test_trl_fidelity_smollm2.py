"""grpokit.trl equals TRL 1.16 on a real model's first step: SmolLM2-135M-Instruct, a fixed batch.

Both libraries run their own GRPOTrainer for one step on the same two chat prompts, with the same fixed
completions from a ``rollout_func`` (one ends on EOS, two are cut at the token limit, one is shorter and
padded with the pad token, which is also the EOS token) and
the same reward (the completion's length in tokens), in float32 (each run loads the model afresh; gradient
checkpointing, TRL's default, in the grpo run only). Compared:

* the per-token log-probabilities of the completion tokens in the update's forward (grpokit's chunked,
  prompt-sharing ``completion_logprobs`` against TRL's ``_get_per_token_logps_and_entropies``),
* the first step's loss and its gradient norm (before clipping) as each logs them,

for TRL's ``grpo``, ``dapo`` and ``dr_grpo`` loss types and GSPO (``importance_sampling_level="sequence"``).
Tolerance: log-probabilities within 2e-4 absolute (float32 over 30 layers and a 49,152-token softmax,
summed in a different order), loss and gradient norm within 1e-3 relative. At the first step the ratio
is 1, so the loss is minus the aggregated advantages and the gradient is the aggregation's weighting
of each token's log-probability gradient: a wrong aggregation or normaliser moves the gradient norm by
far more (dapo's token mean against grpo's per-sequence mean differ here by ~10%; asserted below).
"""

from __future__ import annotations

import importlib

import pytest
import torch

pytest.importorskip("trl")

PROMPTS = [
    [{"role": "user", "content": "What is 47 + 38? Give the final answer as a number."}],
    [{"role": "user", "content": "Name a prime number between 10 and 20."}],
]
COMPLETIONS = {
    0: ["47 + 38 = 85. The answer is 85.", "Let me think step by step about this sum"],
    1: ["13", "A prime number between 10 and 20 is 11, and also"],
}
MAX_LEN = 10  # "13" + EOS is 3 tokens; the first of prompt 0 (+ EOS) and the second of prompt 1 are cut at 10; "Let me
# think ..." is 9 tokens without EOS, so TRL pads it with the pad id, which is SmolLM2's EOS id
# grpo runs with TRL's default gradient checkpointing; the others without it (the same values, a third less
# work: the recomputed forward of every layer)
NO_CHECKPOINTING = dict(gradient_checkpointing=False)
VARIANTS = {
    "grpo": dict(loss_type="grpo"),
    "dapo": dict(loss_type="dapo", **NO_CHECKPOINTING),
    "dr_grpo": dict(loss_type="dr_grpo", **NO_CHECKPOINTING),
    "gspo": dict(loss_type="grpo", importance_sampling_level="sequence", **NO_CHECKPOINTING),
}


def length_reward(completions, completion_ids, **kwargs):
    return [float(len(ids)) for ids in completion_ids]


def rollout_func(prompts, trainer):
    """The fixed completions of each prompt (by its text), templated as the trainer's tokenizer does."""
    tok = trainer.processing_class
    prompt_ids, completion_ids, seen = [], [], {}
    for p in prompts:
        k = next(i for i, q in enumerate(PROMPTS) if q[0]["content"] == p[0]["content"])
        j = seen[k] = seen.get(k, -1) + 1
        prompt_ids.append(tok.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=False))
        ids = tok(COMPLETIONS[k][j % 2], add_special_tokens=False)["input_ids"]
        completion_ids.append((ids + [tok.eos_token_id])[:MAX_LEN] if j % 2 == 0 else ids[:MAX_LEN])
    return {
        "prompt_ids": prompt_ids,
        "completion_ids": completion_ids,
        "logprobs": [[0.0] * len(c) for c in completion_ids],
    }


def _capture(store):
    """A wrapper that keeps the first grad-enabled call's (completion ids, mask, log-probs)."""

    def wrap(inner, pick):
        def call(*args, **kw):
            out = inner(*args, **kw)
            if torch.is_grad_enabled() and "logp" not in store:
                store.update(pick(args, kw, out))
            return out

        return call

    return wrap


def one_step_trainer(lib, model_dir, out, variant):
    """``lib``'s (TRL's or grpokit.trl's) GRPOTrainer for one step of ``variant`` on PROMPTS, its
    completions given by ``rollout_func``, float32 on the CPU."""
    from datasets import Dataset

    mod = importlib.import_module(lib)
    args = mod.GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=4,
        num_generations=2,
        max_steps=1,
        max_completion_length=MAX_LEN,
        learning_rate=1e-6,
        beta=0.0,
        bf16=False,
        use_cpu=True,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
        **VARIANTS[variant],
    )
    return mod.GRPOTrainer(
        str(model_dir),
        reward_funcs=length_reward,
        args=args,
        rollout_func=rollout_func,
        train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS]),
    )


def run_trl(model_dir, tmp_path, variant):
    t = one_step_trainer("trl", model_dir, tmp_path / "trl", variant)
    store = {}

    def pick(args, kw, out):  # (model, input_ids, attention_mask, logits_to_keep, ...)
        ids, mask = args[1][:, -args[3] :], args[2][:, -args[3] :]
        return {"ids": [row[: int(m.sum())] for row, m in zip(ids.tolist(), mask)], "logp": out[0].detach()}

    t._get_per_token_logps_and_entropies = _capture(store)(t._get_per_token_logps_and_entropies, pick)
    t.train()
    return t.state.log_history[0], store


def run_grpokit(model_dir, tmp_path, variant):
    import grpokit.train.update as update

    t = one_step_trainer("grpokit.trl", model_dir, tmp_path / "grpokit", variant)
    store = {}

    def pick(args, kw, out):  # (model, batch, ...)
        batch = args[1]
        ids = [row[: int(m.sum())] for row, m in zip(batch.completion_ids.tolist(), batch.completion_mask)]
        return {"ids": ids, "logp": out[0].detach()}

    original = update.completion_logprobs
    update.completion_logprobs = _capture(store)(original, pick)
    try:
        t.train()
    finally:
        update.completion_logprobs = original
    return t.state.log_history[0], store


def _by_completion(store):
    """``{completion ids (its mask's tokens): log-probs of those tokens}``: rows matched by content, not
    order. The mask, not the first EOS: the pad token is the EOS token, so a cut row padded with it would
    read as one that ended on EOS."""
    return {tuple(ids): logp[: len(ids)] for ids, logp in zip(store["ids"], store["logp"])}


@pytest.fixture(scope="module")
def results(smollm2_dir, tmp_path_factory):
    out = {}
    for variant in VARIANTS:
        tmp = tmp_path_factory.mktemp(variant)
        (ours, s_ours), (trl, s_trl) = run_grpokit(smollm2_dir, tmp, variant), run_trl(smollm2_dir, tmp, variant)
        out[variant] = (ours, trl, _by_completion(s_ours), _by_completion(s_trl))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_first_step_equals_trl_on_smollm2(results, variant):
    ours, trl, lp_ours, lp_trl = results[variant]
    assert set(lp_ours) == set(lp_trl) and len(lp_ours) == 4  # the same four completions, the same masked tokens
    assert sorted(len(k) for k in lp_ours) == [
        3,
        9,
        MAX_LEN,
        MAX_LEN,
    ]  # "13" + EOS, one of 9 tokens, two cut at the limit
    assert (
        sum(k[-1] == 2 for k in lp_ours) == 1
    )  # the EOS of "13" is in the loss; the 9-token row's EOS-id padding is not
    for ids, logp in lp_trl.items():
        assert torch.allclose(lp_ours[ids], logp, atol=2e-4, rtol=0), (ids, (lp_ours[ids] - logp).abs().max())
    assert ours["reward"] == pytest.approx(trl["reward"], rel=1e-6)
    assert ours["loss"] == pytest.approx(trl["loss"], rel=1e-3, abs=1e-6)
    assert ours["grad_norm"] == pytest.approx(trl["grad_norm"], rel=1e-3)


@pytest.mark.slow
def test_the_loss_types_give_different_gradients_here(results):
    # the comparison above can tell the aggregations apart: on this batch their gradient norms differ
    norms = {v: results[v][1]["grad_norm"] for v in VARIANTS}
    assert abs(norms["dapo"] / norms["grpo"] - 1) > 0.02 and abs(norms["dr_grpo"] / norms["grpo"] - 1) > 0.02, norms
