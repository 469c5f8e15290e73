"""TRL's extension contract, call by call (grpokit/trl/contract/): each honoured method is called as often as
TRL calls it on the same run (checkpoints, evaluations, log entries, the loss and reward stages), the loss a
compute_loss returns is divided for gradient accumulation by transformers' rule (``loss_is_scaled_for_ga``),
and the values of a generation batch are cut per micro-batch as TRL cuts them (lists with the rows)."""

from __future__ import annotations

import collections
import types

import pytest
import torch
from datasets import Dataset

from grpokit.config import ConfigError
from grpokit.trl import GRPOConfig, GRPOTrainer
from grpokit.trl.contract.generation import split_rows
from grpokit.trl.contract.stages import TrlLoss, batch_rows
from helpers.trl_models import small_args

DATA = Dataset.from_list([{"prompt": [{"role": "user", "content": f"say {w}"}]} for w in ("ab", "cd", "ef", "gh")])


def short(completions, **kwargs):
    return [-len(c[0]["content"]) / 10 for c in completions]


def libraries():
    trl = pytest.importorskip("trl")
    return [(trl.GRPOConfig, trl.GRPOTrainer), (GRPOConfig, GRPOTrainer)]


# ---------------------------------------------------------------- honoured methods: where each is called

COUNTED = (
    "train evaluate log create_model_card add_callback pop_callback remove_callback save_state save_metrics "
    "log_metrics end compute_loss _compute_loss _calculate_rewards _generate_single_turn _tokenize_prompts"
).split()


def counting(base, names, counts, extra=None):
    """A subclass of ``base`` whose every method in ``names`` counts its calls and runs super()'s."""

    def wrap(name):
        def method(self, *args, **kwargs):
            counts[name] += 1
            return getattr(super(sub, self), name)(*args, **kwargs)

        return method

    sub = type("Counting", (base,), {**{n: wrap(n) for n in names}, **(extra or {})})
    return sub


def counts_of(config, trainer, model, out, names, extra=None, **kw):
    """The calls of each method in ``names`` over a 2-step run (beta 0.1) of ``trainer`` on ``model``."""
    counts: collections.Counter = collections.Counter()
    args = small_args(config, out, max_steps=2, logging_steps=1, report_to="none", seed=0, beta=0.1, **kw)
    sub = counting(trainer, names, counts, extra)
    sub(model, reward_funcs=[short], train_dataset=DATA, eval_dataset=DATA, args=args).train()
    return dict(counts)


def test_each_honoured_method_is_called_where_trl_calls_it(chat_model, tmp_path):
    """The same 2-step run (a checkpoint and an evaluation every step, beta 0.1) under trl and grpokit.trl, every
    honoured method counting its calls. By hand: train 1; add_callback 1 (transformers' __init__ adds
    PrinterCallback through it); evaluate 2; create_model_card 2 (TRL's _save_checkpoint, each checkpoint); log 5
    (2 steps, 2 evaluations, the final entry); _calculate_rewards, _tokenize_prompts, _generate_single_turn once per
    batch: 2 training batches + 2 evaluations x 4 eval batches (4 prompts x 4 completions, 4 a batch) = 10;
    compute_loss and _compute_loss once per micro-batch and eval batch: 2 + 8 = 10; the script-only ones 0.
    (grpokit.trl's _get_per_token_logps_and_entropies is compared in training only: test_trl_hooks.py.)"""
    runs = [
        counts_of(
            c,
            t,
            chat_model,
            tmp_path / str(i),
            COUNTED,
            save_strategy="steps",
            save_steps=1,
            eval_strategy="steps",
            eval_steps=1,
            per_device_eval_batch_size=4,
        )
        for i, (c, t) in enumerate(libraries())
    ]
    expected = dict(
        train=1,
        add_callback=1,
        evaluate=2,
        create_model_card=2,
        log=5,
        _calculate_rewards=10,
        _tokenize_prompts=10,
        _generate_single_turn=10,
        compute_loss=10,
        _compute_loss=10,
    )
    assert runs[0] == expected
    assert runs[1] == runs[0]


def tagged(seen):
    """A _generate_and_score_completions adding a per-row list and tensor, a compute_loss reading them (``seen``
    gets "generation" for each generation batch, and what each compute_loss call found)."""

    def _generate_and_score_completions(self, inputs):
        seen.append("generation")
        out = super(type(self), self)._generate_and_score_completions(inputs)
        n = out["completion_ids"].shape[0]
        return {**out, "row_tag": [f"r{i}" for i in range(n)], "row_idx": torch.arange(n), "note": None}

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        tags = sorted(int(t[1:]) for t in inputs["row_tag"])
        seen.append((len(inputs["row_tag"]), tags == sorted(inputs["row_idx"].tolist()), inputs["note"]))
        return super(type(self), self).compute_loss(model, inputs, return_outputs, num_items_in_batch)

    return dict(_generate_and_score_completions=_generate_and_score_completions, compute_loss=compute_loss)


def test_a_generation_override_is_called_as_trl_calls_it_and_its_lists_are_cut_with_the_rows(chat_model, tmp_path):
    """_generate_and_score_completions once per generation batch (2), and the lists it adds cut as TRL's
    split_tensor_dict cuts them: with steps_per_generation=2 each of the 2 steps is 2 micro-batches of 2 rows of a
    4-row generation batch, so each compute_loss call sees 2 tags, the same rows as the tensor beside them (TRL
    shuffles the rows first, grpokit keeps their order: the pairing holds in both), and None passed as it is."""
    runs = []
    for i, (config, trainer) in enumerate(libraries()):
        seen: list = []
        names = ["create_model_card", "_calculate_rewards"]
        counts = counts_of(
            config,
            trainer,
            chat_model,
            tmp_path / str(i),
            names,
            tagged(seen),
            save_strategy="steps",
            save_steps=1,
            per_device_train_batch_size=2,
            steps_per_generation=2,
            gradient_accumulation_steps=2,
            num_generations=4,
        )
        runs.append((counts, seen))
    step = ["generation", (2, True, None), (2, True, None)]
    assert runs[0] == ({"create_model_card": 2, "_calculate_rewards": 2}, step + step)
    assert runs[1] == runs[0]


# ---------------------------------------------------------------- the rows of a batch dict


def test_batch_rows_cuts_tensors_lists_and_tuples_and_keeps_the_rest():
    """TRL's split_tensor_dict (after its shuffle, which makes a tuple a list): rows 1-2 of 4."""
    batch = {
        "ids": torch.arange(8).view(4, 2),
        "tag": ["a", "b", "c", "d"],
        "pair": ("w", "x", "y", "z"),
        "num_items_in_batch": torch.tensor(7.0),
        "none": None,
        "scale": 0.5,
        "name": "run",
    }
    out = batch_rows(batch, slice(1, 3))
    assert out["ids"].tolist() == [[2, 3], [4, 5]]
    assert out["tag"] == ["b", "c"] and out["pair"] == ["x", "y"]
    assert out["num_items_in_batch"].item() == 7.0 and out["none"] is None
    assert out["scale"] == 0.5 and out["name"] == "run"
    halves = split_rows(batch | {"completion_ids": torch.zeros(4, 1)}, 2)
    assert [h["tag"] for h in halves] == [["a", "b"], ["c", "d"]]


def test_a_generation_batch_value_with_other_rows_is_refused_in_one_sentence():
    from grpokit.trl.contract.generation import _check

    out = {k: torch.zeros(4, 1) for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}
    out |= {"advantages": torch.zeros(4), "row_tag": ["a", "b", "c"]}
    with pytest.raises(ConfigError, match=r"^_generate_and_score_completions returned 'row_tag' with 3 rows for 4 "):
        _check(out, 4)


# ---------------------------------------------------------------- loss_is_scaled_for_ga


def test_transformers_rule_for_a_loss_scaled_for_accumulation():
    """transformers' Trainer.training_step: the flag when set; None: scaled only when a compute_loss_func
    computed the loss (TRL's training step passes num_items_in_batch=None, so the model's own scaling never counts)."""

    def scaled(flag, compute_loss_func=None):
        return TrlLoss(types.SimpleNamespace(loss_is_scaled_for_ga=flag, compute_loss_func=compute_loss_func))._scaled()

    assert scaled(True) and scaled(True, object())  # the flag, whatever else is set
    assert not scaled(False, object())
    assert scaled(None, object())  # None: a compute_loss_func scaled it
    assert not scaled(None)  # None and no compute_loss_func: transformers divides


def loss_stage_run(flag, own=None):
    """TrlLoss over 4 rows, 2 a micro-batch (2 micro-batches, one update), compute_loss returning w (w = 3.0):
    flag False divides each by 2, so the gradient is 1/2 + 1/2 = 1 and the logged loss 3/2 + 3/2 = 3;
    flag True keeps them: gradient 2, loss 6."""
    from grpokit.algo.pipeline import UpdateInputs, loss_settings
    from grpokit.config import AlgoConfig
    from grpokit.train.update import Accumulator, Forwards
    from grpokit.types import TokenBatch

    model = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.constant_(model.weight, 3.0)
    facade = types.SimpleNamespace(
        args=types.SimpleNamespace(per_device_train_batch_size=2),
        state=types.SimpleNamespace(global_step=0),
        accelerator=types.SimpleNamespace(sync_gradients=True),
        _generation_batch=None,
        _micro_at=(-1, 0),
        loss_is_scaled_for_ga=flag,
        compute_loss=lambda m, batch, num_items_in_batch=None: m.weight.sum(),
    )
    ids, mask = torch.ones(4, 3, dtype=torch.long), torch.ones(4, 2)
    settings, norms = loss_settings(AlgoConfig())
    inputs = UpdateInputs(
        TokenBatch(ids, ids, ids, ids[:, 1:], mask), torch.zeros(4), mask, None, None, loss=settings, norms=norms
    )
    acc = Accumulator()
    TrlLoss(facade, own=own)(model, torch.optim.SGD(model.parameters(), lr=0.0), inputs, acc, Forwards())
    return (None if model.weight.grad is None else model.weight.grad.item()), acc.loss


def test_a_loss_not_scaled_for_accumulation_is_divided_by_the_updates_micro_batches():
    assert loss_stage_run(False) == (1.0, 3.0)
    assert loss_stage_run(None) == (1.0, 3.0)  # transformers' rule with TRL's num_items_in_batch=None
    assert loss_stage_run(True) == (2.0, 6.0)
    own = []
    assert loss_stage_run(True, own=lambda *a, **k: own.append("grpokit's")) == (None, 0.0)
    assert own == ["grpokit's"]  # no loss override, TRL's scaling: grpokit's own stage runs instead
    assert loss_stage_run(False, own=lambda *a, **k: own.append("grpokit's")) == (1.0, 3.0) and len(own) == 1


def moved(config, trainer, out, flag, chat_model):
    """A compute_loss of value 1.0 (gradient 1 on one embedding weight), gradient_accumulation_steps=2, SGD at
    lr 0.1 without clipping: (the weight's move, the step's logged loss)."""

    class One(trainer):
        loss_is_scaled_for_ga = flag

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            w = model.get_input_embeddings().weight[1, 0]
            return w - w.detach() + 1.0

    args = small_args(
        config,
        out,
        max_steps=1,
        logging_steps=1,
        report_to="none",
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        optim="sgd",
        learning_rate=0.1,
        max_grad_norm=0.0,
        lr_scheduler_type="constant",
        weight_decay=0.0,
    )
    tr = One(chat_model, reward_funcs=[short], train_dataset=DATA, args=args)
    before = tr.model.get_input_embeddings().weight[1, 0].item()
    tr.train()
    return round(before - tr.model.get_input_embeddings().weight[1, 0].item(), 5), tr.state.log_history[0]["loss"]


def test_loss_is_scaled_for_ga_false_divides_the_loss_as_under_trl(chat_model, tmp_path):
    """Two micro-batches of 1.0 each: False divides each by 2, so the gradient is 1.0 and the weight moves
    0.1 * 1.0 = 0.1, the logged loss 0.5 + 0.5 = 1.0 (True, TRL's default: 0.2 and 2.0), as under trl."""
    (trl_config, trl_trainer), _ = libraries()
    theirs = moved(trl_config, trl_trainer, tmp_path / "trl", False, chat_model)
    ours = moved(GRPOConfig, GRPOTrainer, tmp_path / "ours", False, chat_model)
    assert ours == pytest.approx((0.1, 1.0)) and theirs == pytest.approx(ours)
    assert moved(GRPOConfig, GRPOTrainer, tmp_path / "scaled", True, chat_model) == pytest.approx((0.2, 2.0))


def test_loss_is_scaled_for_ga_false_without_a_loss_override_halves_the_update(chat_model, tmp_path):
    """TRL's own loss is already divided by gradient_accumulation_steps (2); set False (here on the instance,
    once the run is built) transformers divides it again: with SGD and no clipping the weights move half as far
    (the same seed samples the same completions)."""
    kw = dict(
        max_steps=1,
        logging_steps=1,
        report_to="none",
        seed=0,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        optim="sgd",
        learning_rate=0.5,
        max_grad_norm=0.0,
    )
    deltas = []
    for name, flag in (("plain", True), ("halved", False)):
        tr = GRPOTrainer(
            chat_model, reward_funcs=[short], train_dataset=DATA, args=small_args(GRPOConfig, tmp_path / name, **kw)
        )
        before = {k: v.clone() for k, v in tr.model.state_dict().items()}  # the run is built here
        tr.loss_is_scaled_for_ga = flag  # read at each slice: set after the build, it still counts
        tr.train()
        deltas.append(torch.cat([(v - before[k]).flatten() for k, v in tr.model.state_dict().items()]))
    assert deltas[0].abs().max() > 0
    torch.testing.assert_close(deltas[1], deltas[0] / 2, atol=1e-6, rtol=1e-4)


# ---------------------------------------------------------------- the model card


def test_create_model_card_writes_trls_names_into_the_card(chat_model, tmp_path):
    """TRL's create_model_card(model_name, dataset_name, tags): the name heads the card and is its metadata's
    model_name, the dataset its datasets and its training data, the tags join grpokit's (a string is one tag)."""
    import yaml

    args = small_args(GRPOConfig, tmp_path / "run", max_steps=1, report_to="none")
    tr = GRPOTrainer(chat_model, reward_funcs=[short], train_dataset=DATA, args=args)
    path = tr.create_model_card(model_name="tiny-grpo", dataset_name="me/sums", tags=["math", "grpo"])
    assert path == tmp_path / "run" / "README.md"
    text = path.read_text()
    meta = yaml.safe_load(text.split("---")[1])
    assert meta["model_name"] == "tiny-grpo" and meta["datasets"] == ["me/sums"]
    assert meta["tags"] == ["grpokit", "grpo", "reinforcement-learning", "math"]
    assert "\n# tiny-grpo trained with GRPO" in text and "- training data: `me/sums`" in text
    tr.create_model_card(tags="solo")
    assert yaml.safe_load(path.read_text().split("---")[1])["tags"][-1] == "solo"
    with pytest.raises(TypeError):  # TRL's parameters only, as TRL's create_model_card
        tr.create_model_card(language="en")
