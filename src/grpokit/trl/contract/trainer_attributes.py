"""transformers' Trainer's attributes on grpokit.trl's GRPOTrainer: each honoured or refused in one sentence.

TRL's GRPOTrainer is a transformers ``Trainer``, whose ``__init__`` sets ``train_dataset``, ``optimizer``,
``data_collator`` ... and whose ``train()`` reads them, so a script may assign one between construction and
``train()`` (``trainer.train_dataset = d2``, ``trainer.optimizer = SGD(...)``). grpokit.trl runs grpokit's
loop, so none is left a plain attribute that nothing reads: ``train_dataset`` assigned before ``train()``
is the one trained on (the GRPOConfig read again with it, a built but untrained run built anew, as for
``model``); ``eval_dataset`` and ``args`` stay plain attributes, read by ``evaluate()`` and ``train()``;
every other one is a property holding what TRL's trainer holds on such a run, whose assignment is refused
in one sentence saying what to set instead (``REFUSED``). tests/trl/test_trl_trainer_attributes.py reads
transformers' and TRL's ``__init__`` so that a new attribute is classified here before it can go unread.
"""

from __future__ import annotations

from typing import Any, Callable

from grpokit.config.sections import ConfigError

_OPTIMIZER = (
    "grpokit builds the optimizer from the GRPOConfig (optim, learning_rate, weight_decay, adam_beta1 ...); set them "
    "there"
)
_SCHEDULE = "grpokit builds the schedule from the GRPOConfig (lr_scheduler_type, warmup_steps ...); set them there"
_EVAL = (
    "evaluate() logs TRL's eval metrics of sampled completions and has no predictions or labels to pass it "
    "(TRL's GRPOTrainer does not use it either)"
)
_UNRUN = "it is transformers' Trainer machinery that grpokit.trl does not run, so assigning it would change nothing"
_STATE = "it is read from grpokit's run as it goes"


def _identity_collator(features: list) -> list:
    """TRL's data collator: the rows as they are (no collation)."""
    return features


def _label_smoother(self: Any) -> Any:
    """transformers': a LabelSmoother when label_smoothing_factor is set (TRL's loss does not use it)."""
    factor = self.args.label_smoothing_factor
    if not factor:
        return None
    from transformers.trainer_pt_utils import LabelSmoother

    return LabelSmoother(epsilon=factor)


def _bare_model(self: Any) -> Any:
    """The policy without a PEFT wrapper (what transformers inspects)."""
    model = self.model
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _label_names(self: Any) -> list[str]:
    """transformers': GRPOConfig.label_names, else the label arguments of the model's forward."""
    if self.args.label_names is not None:
        return list(self.args.label_names)
    from transformers.utils import find_labels

    return find_labels(type(_bare_model(self)))


def _can_return_loss(self: Any) -> bool:
    """transformers': the model's forward takes ``return_loss``."""
    from transformers.utils import can_return_loss

    return can_return_loss(type(_bare_model(self)))


def _accepts_loss_kwargs(self: Any) -> bool:
    """transformers': the model says so, or its forward takes ``**kwargs``."""
    import inspect

    model = _bare_model(self)
    if hasattr(model, "accepts_loss_kwargs"):
        return model.accepts_loss_kwargs
    return any(p.kind is p.VAR_KEYWORD for p in inspect.signature(model.forward).parameters.values())


def _in_training(attribute: str) -> Callable[[Any], Any]:
    """The run's ``attribute`` once train() started (None before, as transformers' before train())."""
    return lambda self: getattr(self._trainer, attribute) if self._started else None


REFUSED: dict[str, tuple[Callable[[Any], Any], str]] = {
    "optimizer": (_in_training("optimizer"), _OPTIMIZER),
    "lr_scheduler": (_in_training("scheduler"), _SCHEDULE),
    "optimizer_cls_and_kwargs": (lambda self: None, _OPTIMIZER),
    "data_collator": (
        lambda self: _identity_collator,
        "grpokit passes each dataset row to the reward functions as it is (TRL's collator keeps the rows as they "
        "are); change the rows with train_dataset.map(...) and assign train_dataset before train()",
    ),
    "compute_loss_func": (
        lambda self: None,
        "TRL's GRPOTrainer computes its own loss and never calls it; override compute_loss",
    ),
    "compute_metrics": (lambda self: None, _EVAL),
    "preprocess_logits_for_metrics": (lambda self: None, _EVAL),
    "label_names": (_label_names, _EVAL),
    "label_smoother": (_label_smoother, "TRL's GRPO loss does not use it (GRPO inputs carry no labels)"),
    "neftune_noise_alpha": (
        lambda self: self.args.neftune_noise_alpha,
        "it is read from GRPOConfig.neftune_noise_alpha; set it there (before train())",
    ),
    "control": (lambda self: self._get() and self.bridge.user.control, _STATE),
    "is_in_train": (lambda self: bool(self._started and not self.summary), _STATE),
    "current_flos": (lambda self: 0.0, f"{_STATE} (state.total_flos)"),
    "model_init": (lambda self: None, _UNRUN),
    "hp_name": (lambda self: None, _UNRUN),
    "hp_search_backend": (lambda self: None, _UNRUN),
    "deepspeed": (lambda self: None, _UNRUN),
    # transformers': ``args.fsdp and <xla asked>``; grpokit's FSDP is never XLA's
    "is_fsdp_xla_enabled": (lambda self: self.args.fsdp and False, _UNRUN),
    "is_fsdp_xla_v1_enabled": (lambda self: self.args.fsdp and False, _UNRUN),
    "is_fsdp_xla_v2_enabled": (lambda self: self.args.fsdp and False, _UNRUN),
    "is_distributed_loading_by_transformers": (lambda self: False, _UNRUN),
    "is_model_parallel": (lambda self: False, _UNRUN),
    "place_model_on_device": (lambda self: self.args.place_model_on_device is not False, _UNRUN),
    "can_return_loss": (_can_return_loss, _UNRUN),
    "model_accepts_loss_kwargs": (_accepts_loss_kwargs, "TRL's GRPO loss does not read it"),
}
"""transformers' Trainer attributes grpokit.trl holds read-only: what reading one gives, and why assigning it is
refused."""

PLAIN = {
    "eval_dataset": "read by evaluate() at every evaluation",
    "args": "read again at train() when a field changed (args_reading.py)",
}
"""transformers' Trainer attributes kept as plain attributes because grpokit reads them where transformers does."""


def _refused(name: str, get: Callable[[Any], Any], why: str) -> property:
    def refuse(self: Any, value: Any) -> None:
        raise ConfigError(f"GRPOTrainer.{name} cannot be assigned: {why}")

    return property(get, refuse, doc=f"transformers': {(get.__doc__ or '').strip() or name} (read-only: {why}).")


def _set_train_dataset(self: Any, value: Any) -> None:
    """``trainer.train_dataset = d``: before train() the run's prompts (the GRPOConfig read again with them, a
    built, untrained run built anew); refused in one sentence once training started or before construction."""
    if "_given" not in vars(self):
        raise ConfigError(
            "GRPOTrainer.train_dataset is set by GRPOTrainer.__init__ from its train_dataset argument; pass it "
            "there (or assign it after super().__init__)"
        )
    if self._started:
        raise ConfigError(
            "GRPOTrainer.train_dataset can be replaced until train() starts; during or after training the run's "
            "sampler keeps the prompts it was built with"
        )
    from dataclasses import replace

    from .assignable import rebuild

    rebuild(self)
    self._given = replace(self._given, train_dataset=value)
    self._read_inputs()


TRAIN_DATASET = property(
    lambda self: self._given.train_dataset,
    _set_train_dataset,
    doc="transformers': the training dataset, as given; assigned before train(), the one trained on.",
)


def properties() -> dict[str, property]:
    """The properties attributes.install puts on GRPOTrainer: every REFUSED one, and train_dataset."""
    return {"train_dataset": TRAIN_DATASET, **{n: _refused(n, get, why) for n, (get, why) in REFUSED.items()}}
