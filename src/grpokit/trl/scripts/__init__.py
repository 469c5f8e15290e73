"""TRL's scripts under grpokit.trl: the ``trl grpo`` command and the helpers TRL's scripts import.

``grpokit.trl.scripts`` stands where ``trl.scripts`` stands (upstream.py gives it trl's other modules,
``grpokit.trl.scripts.utils`` ...), so no module here is named as one of trl's: ``parser``
(``ScriptArguments``, the dataset mixture, ``TrlParser``; re-exported here, as ``trl.scripts`` does),
``model_config`` (``ModelConfig`` and the PEFT / quantization helpers), ``model_flags`` (its flags on
their way to GRPOTrainer, named in refusals), ``trl_grpo`` (``grpokit trl
grpo`` and a TRL YAML under ``grpokit train``) and ``progress`` (``RichProgressCallback``). GRPOConfig's
``--help`` text comes from grpokit/trl/field_help.py, beside config.py, which alone uses it.
"""

from .parser import (
    DatasetConfig,
    DatasetMixtureConfig,
    ScriptArguments,
    TrlParser,
    get_dataset,
    init_zero_verbose,
)

__all__ = ["DatasetConfig", "DatasetMixtureConfig", "ScriptArguments", "TrlParser", "get_dataset", "init_zero_verbose"]
