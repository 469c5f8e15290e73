"""What TRL's generation decides and grpokit.trl must decide alike: which completions were truncated
when the sampler did not say (a ``rollout_func`` without ``finish_reasons``, a subclass's own
``_generate_single_turn``: TRL's rule is the last token, not the length), and which sampling
settings transformers' ``generate`` runs with. The run tests run under ``trl`` too (the oracle)."""

from __future__ import annotations

import importlib

import pytest
from datasets import Dataset

from helpers.trl_models import make_chat_model, small_args

BACKENDS = ["grpokit.trl", pytest.param("trl", marks=pytest.mark.slow)]
DATA = Dataset.from_list([{"prompt": "hello there"}, {"prompt": "add 1 and 2"}])


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    return str(make_chat_model(tmp_path_factory.mktemp("chat-model")))


def first_of_four(completions, **kwargs):
    """Reward 1 for the first completion of each group of 4, else 0."""
    return [float(i % 4 == 0) for i in range(len(completions))]


def run(backend: str, model: str, out, trainer_cls=None, **kw) -> dict:
    """One step: 2 prompts x 4 completions of at most 6 tokens, in two micro-batches; the logged line."""
    trl = importlib.import_module(backend)
    args = small_args(
        trl.GRPOConfig, out, max_steps=1, max_completion_length=6, gradient_accumulation_steps=2, learning_rate=1e-5,
        logging_steps=1, save_strategy="no", report_to=[], seed=0, mask_truncated_completions=kw.pop("mask", True),
    )  # fmt: skip
    tr = (trainer_cls or trl.GRPOTrainer)(
        model=model, reward_funcs=[first_of_four], args=args, train_dataset=DATA, **kw
    )
    tr.train()
    return tr.state.log_history[0]


# Each group's rewards [1, 0, 0, 0]: mean 0.25, std 0.5, advantages (r - 0.25) / (0.5 + 1e-4) =
# [1.4997, -0.4999, -0.4999, -0.4999]. TRL's default loss (dapo, beta 0) at ratio 1 is
# -sum(A_i * tokens_i) / (tokens in the loss) over the step's 8 completions.


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mask", [True, False])
def test_a_rollout_funcs_completion_without_eos_last_is_truncated(backend, mask, chat_model, tmp_path):
    if backend == "trl":
        pytest.importorskip("trl")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(chat_model)
    abc, eos = tok("abc")["input_ids"], tok.eos_token_id

    def rollout_func(prompts, trainer):  # no finish_reasons: TRL's dict
        comps = [abc + [eos] if i % 2 == 0 else abc + abc for i in range(len(prompts))]  # 4 tokens / 6 (the cap)
        return {
            "prompt_ids": [tok(p)["input_ids"] for p in prompts],
            "completion_ids": comps,
            "logprobs": [[0.0] * len(c) for c in comps],
        }

    h = run(backend, chat_model, tmp_path / "o", rollout_func=rollout_func, mask=mask)
    assert h["completions/clipped_ratio"] == 0.5  # the odd rows end on "c", not EOS
    assert h["completions/mean_terminated_length"] == 4.0 and h["completions/mean_length"] == 5.0
    if mask:  # rows 0 and 2 of each group stay: 4 tokens each, A 1.4997 and -0.4999
        assert h["loss"] == pytest.approx(-4 * (1.4997 - 0.4999) * 2 / 16, abs=1e-3)  # -0.4999
    else:  # every row: per group 4 * 1.4997 - 6 * 0.4999 - 4 * 0.4999 - 6 * 0.4999 = -2.0, over 40 tokens
        assert h["loss"] == pytest.approx(2 * 2.0 / 40, abs=1e-3)  # 0.1


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_rollout_funcs_completions_each_train_on_their_own_prompt(backend, chat_model, tmp_path):
    """TRL pads ``prompt_ids`` row by row: completion i continues its own prompt even where the rows of a group
    were given different ones (a randomised start per episode). Before, grpokit.trl kept each group's first."""
    if backend == "trl":
        pytest.importorskip("trl")
    trl = importlib.import_module(backend)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(chat_model)
    a, eos = tok.convert_tokens_to_ids("a"), tok.eos_token_id
    seen = []

    def rollout_func(prompts, trainer):  # row i's prompt: i + 1 tokens "a"
        return {
            "prompt_ids": [[a] * (i + 1) for i in range(len(prompts))],
            "completion_ids": [[a, eos]] * len(prompts),
            "logprobs": [[0.0, 0.0]] * len(prompts),
        }

    class Seen(trl.GRPOTrainer):
        def _compute_loss(self, model, inputs):
            seen.extend(inputs["prompt_mask"].sum(dim=1).tolist())
            return super()._compute_loss(model, inputs)

    h = run(backend, chat_model, tmp_path / "o", trainer_cls=Seen, rollout_func=rollout_func)
    # 2 prompts x 4 rows: prompts of 1 .. 8 tokens (TRL shuffles the rows; before: 1, 1, 1, 1, 5, 5, 5, 5)
    assert sorted(seen) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert h["num_tokens"] == 1 + 2 + 3 + 4 + 5 + 6 + 7 + 8 + 8 * 2  # 52 (before: 4 * 1 + 4 * 5 + 16 = 40)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_rollout_funcs_extra_value_that_is_no_list_reaches_every_completion(backend, chat_model, tmp_path):
    """TRL's rule for a rollout_func's other keys: a list is one value per completion, anything else goes to
    every completion whole. Before, grpokit.trl split the string "ckpt" into its 4 letters."""
    if backend == "trl":
        pytest.importorskip("trl")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(chat_model)
    abc, eos = tok("abc")["input_ids"], tok.eos_token_id
    seen = []

    def rollout_func(prompts, trainer):
        n = len(prompts)
        return {
            "prompt_ids": [tok(p)["input_ids"] for p in prompts],
            "completion_ids": [abc + [eos]] * n,
            "logprobs": [[0.0] * 4] * n,
            "policy_tag": "ckpt",
            "version": 7,
            "hint": [float(i) for i in range(n)],
        }

    def tagged(completions, policy_tag, version, hint, **kwargs):
        seen.append((len(completions), policy_tag, version, hint))
        return [0.0] * len(completions)

    trl = importlib.import_module(backend)
    args = small_args(trl.GRPOConfig, tmp_path / "o", max_steps=1, max_completion_length=6, report_to=[])
    tr = trl.GRPOTrainer(
        model=chat_model, reward_funcs=[tagged], args=args, train_dataset=DATA, rollout_func=rollout_func
    )
    tr.train()
    n, tag, version, hint = seen[0]
    assert tag == ["ckpt"] * n and version == [7] * n and hint == [float(i) for i in range(n)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_subclass_completion_ending_on_eos_at_the_cap_is_not_truncated(backend, chat_model, tmp_path):
    if backend == "trl":
        pytest.importorskip("trl")
    trl = importlib.import_module(backend)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(chat_model)
    abcde, eos = tok("abcde")["input_ids"], tok.eos_token_id

    class OwnCompletions(trl.GRPOTrainer):
        def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, *a, **k):
            # every completion is 6 tokens, the cap; the even ones end on EOS, the odd ones on "a"
            return [abcde + [eos] if i % 2 == 0 else abcde + abcde[:1] for i in range(len(prompt_ids))], None

    h = run(backend, chat_model, tmp_path / "o", trainer_cls=OwnCompletions)
    assert h["completions/clipped_ratio"] == 0.5 and h["completions/mean_terminated_length"] == 6.0
    # rows 0 and 2 of each group stay (a length rule had masked all 8: loss 0): 6 tokens each
    assert h["loss"] == pytest.approx(-6 * (1.4997 - 0.4999) * 2 / 24, abs=1e-3)  # -0.4999


@pytest.mark.parametrize(
    "kwargs", [{"no_repeat_ngram_size": 3}, {"num_beams": 2}, {"do_sample": False}, {"typical_p": 0.9}]
)
def test_generate_runs_with_trls_sampling_settings(kwargs, chat_model, tmp_path):
    """generation_kwargs that pick rollout.engine=generate: transformers gets TRL's settings (top_k 0, top_p 1.0
    when off, not None, which generate would fill from the model's generation_config.json or its top_k 50)."""
    trl = pytest.importorskip("trl")
    from grpokit.rollout.hf_generate import generation_config
    from grpokit.rollout.sampling import sampling_params
    from grpokit.trl import GRPOConfig
    from grpokit.trl.mapping import to_config

    theirs = trl.GRPOTrainer(
        model=chat_model,
        reward_funcs=[first_of_four],
        args=small_args(trl.GRPOConfig, tmp_path / "t", generation_kwargs=kwargs, report_to=[]),
        train_dataset=DATA,
    ).generation_config
    cfg = to_config(small_args(GRPOConfig, tmp_path / "g", generation_kwargs=kwargs, report_to=[]), num_rows=2)
    assert cfg.rollout.engine == "generate"
    ours = generation_config(sampling_params(cfg.rollout), cfg.rollout.generation_kwargs, {1}, 0)
    assert ours.do_sample == theirs.do_sample and ours.max_new_tokens == theirs.max_new_tokens
    names = ["num_beams", "repetition_penalty", *kwargs]
    if theirs.do_sample:  # greedy reads no warper setting (grpokit then passes none)
        names += ["temperature", "top_k", "top_p", "min_p"]
    # TRL leaves num_beams None: transformers' default 1 for a model whose generation_config.json has none
    defaults = theirs._get_default_generation_params()
    assert {n: getattr(ours, n) for n in names} == {
        n: defaults.get(n) if getattr(theirs, n) is None else getattr(theirs, n) for n in names
    }


def test_trls_generation_kwargs_with_a_key_generate_does_not_read_is_refused_in_trls_words():
    """TRL hands generation_kwargs to GenerationConfig(**kwargs), which keeps a misspelt key unread: refused."""
    from grpokit.config import ConfigError
    from grpokit.trl.config import GRPOConfig
    from grpokit.trl.mapping import to_config

    with pytest.raises(ConfigError) as e:
        to_config(GRPOConfig("o", generation_kwargs={"num_beam": 2}), num_rows=4)
    assert str(e.value) == (
        "GRPOConfig argument generation_kwargs key 'num_beam' is not a setting of transformers' GenerationConfig "
        "(generate() would ignore it); did you mean 'num_beams'?"
    )
    cfg = to_config(GRPOConfig("o", generation_kwargs={"num_beams": 2}), num_rows=4)
    assert (cfg.rollout.engine, cfg.rollout.generation_kwargs) == ("generate", {"num_beams": 2})
