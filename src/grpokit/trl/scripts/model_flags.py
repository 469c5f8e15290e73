"""What ``ModelConfig``'s flags become on their way to ``GRPOTrainer`` in ``trl grpo``, named by those flags.

TRL's trl/scripts/grpo.py builds ``model_init_kwargs`` from ModelConfig (``revision``, ``attn_implementation``,
``dtype``) and GRPOConfig's ``trust_remote_code``, then lays the user's own ``--model_init_kwargs`` over them:
the user's keys win (``init_kwargs``). The LoRA flags become a ``peft_config``, the k-bit flags a
``quantization_config``. The trainer refuses what grpokit cannot do by the names it was given
(``peft_config.use_rslora``, ``quantization_config``, ``model_init_kwargs``), which a user of the script
never typed: ``named_by_flags`` makes such a refusal name the flag instead (``--use_rslora``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from grpokit.config.base import ConfigError, named_as

PEFT_FLAGS = {
    "r": "lora_r",
    "lora_alpha": "lora_alpha",
    "lora_dropout": "lora_dropout",
    "target_modules": "lora_target_modules",
    "target_parameters": "lora_target_parameters",
    "modules_to_save": "lora_modules_to_save",
    "task_type": "lora_task_type",
    "use_rslora": "use_rslora",
    "use_dora": "use_dora",
}
"""``peft.LoraConfig`` field -> the ModelConfig flag that sets it (model_config.get_peft_config)."""


def init_kwargs(model_args: Any, training_args: Any) -> dict[str, Any]:
    """``model_init_kwargs`` as TRL's grpo.py makes them: ModelConfig's loading options, the user's
    ``model_init_kwargs`` over them (a key given in both: the user's)."""
    kwargs = {
        "revision": model_args.model_revision,
        "trust_remote_code": training_args.trust_remote_code,
        "attn_implementation": model_args.attn_implementation,
        "dtype": model_args.dtype,
    }
    kwargs.update(training_args.model_init_kwargs or {})
    return kwargs


def check_flags(model_args: Any, user_kwargs: dict[str, Any] | None) -> None:
    """Refuse, naming the flag, what ModelConfig's flags ask and grpokit's trainer would refuse by another name:
    a quantized model (GRPOTrainer takes no quantization_config), a revision other than main (grpokit loads
    none: GRPOConfig's model_init_kwargs rule, trl/args/model.py, takes it only at main or None) and an
    attention implementation grpokit does not know. A key the user's ``model_init_kwargs`` sets is theirs
    (it wins over the flag), and is refused by that name."""
    from grpokit.nn.models import ATTN_IMPLEMENTATIONS

    for flag in ("load_in_4bit", "load_in_8bit"):
        if getattr(model_args, flag):
            raise ConfigError(
                f"--{flag} is not supported by grpokit: it trains the model's weights unquantized (GRPOTrainer "
                "takes no quantization_config); leave it off"
            )
    user = user_kwargs or {}
    if "revision" not in user and model_args.model_revision not in (None, "main"):
        raise ConfigError(
            f"--model_revision {model_args.model_revision!r} is not supported by grpokit: it loads a model's "
            "main revision only; leave it at main (or download that revision to a folder and give the folder "
            "as --model_name_or_path)"
        )
    attn = model_args.attn_implementation
    if "attn_implementation" not in user and attn is not None and attn not in ATTN_IMPLEMENTATIONS:
        raise ConfigError(
            f"--attn_implementation {attn!r} is not supported by grpokit; valid: {', '.join(ATTN_IMPLEMENTATIONS[1:])} "
            "(or leave it unset: transformers' choice)"
        )


@contextlib.contextmanager
def named_by_flags(model_args: Any) -> Iterator[None]:
    """A ConfigError raised in the block names the LoRA flag, not the ``peft_config.<field>`` it set."""
    if not model_args.use_peft:  # no peft_config came from the flags
        yield
        return
    with named_as({f"peft_config.{field}": f"--{flag}" for field, flag in PEFT_FLAGS.items()}):
        yield
