"""TRL's own names and modules under ``grpokit.trl``: grpokit.trl is a superset of trl.

A project that trains SFT and GRPO changes ``import trl`` to ``import grpokit.trl as trl`` once: the
names grpokit implements (``GRPOConfig``, ``GRPOTrainer``, ``ModelConfig``, TRL's rewards ...) are
grpokit's, every other public name of trl (``SFTConfig``, ``DPOTrainer``, ``apply_chat_template`` ...)
is trl's own object, found when first used, so ``import grpokit.trl`` never imports trl. The same holds
one level down: ``grpokit.trl.<module>`` for any module of trl (``trainer.grpo_trainer``,
``trainer.utils``, ``data_utils``, ``models``, ``extras.profiling`` ...) is a view of trl's module in
which a name grpokit implements is grpokit's wherever TRL defines or re-exports it (decided by where
TRL defines the object, ``IMPLEMENTED``, so ``trl.scripts.vllm_serve.ScriptArguments``, a different
class, stays TRL's). Without trl installed, the grpokit names still work and any other stops with one
sentence naming it and ``pip install trl``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any

PREFIX = "grpokit.trl"
# TRL 1.16's module -> the names it defines that grpokit implements, and grpokit's module of each
IMPLEMENTED: dict[str, tuple[str, tuple[str, ...]]] = {
    "trl.trainer.grpo_trainer": ("grpokit.trl", ("GRPOTrainer",)),
    "trl.trainer.grpo_config": ("grpokit.trl", ("GRPOConfig",)),
    "trl.trainer.distillation_trainer": ("grpokit.trl", ("DistillationTrainer",)),
    "trl.trainer.distillation_config": ("grpokit.trl", ("DistillationConfig",)),
    "trl.trainer.model_config": ("grpokit.trl", ("ModelConfig",)),
    "trl.trainer.callbacks": ("grpokit.trl", ("RichProgressCallback",)),
    "trl.trainer.utils": ("grpokit.trl", ("get_peft_config", "get_quantization_config")),
    "trl.scripts.utils": (
        "grpokit.trl.scripts.parser",
        ("DatasetConfig", "DatasetMixtureConfig", "ScriptArguments", "TrlParser", "get_dataset", "init_zero_verbose"),
    ),
    "trl.rewards.accuracy_rewards": (
        "grpokit.trl.rewards",
        ("accuracy_reward", "get_cosine_scaled_reward", "reasoning_accuracy_reward"),
    ),
    "trl.rewards.format_rewards": ("grpokit.trl.rewards", ("think_format_reward",)),
    "trl.rewards.other_rewards": (
        "grpokit.trl.rewards",
        ("get_repetition_penalty_reward", "get_soft_overlong_punishment"),
    ),
}
# TRL 1.16's top-level public names (trl/__init__.py), for dir() and the sentence when trl is missing
TRL_NAMES = (
    "add_response_schema clone_chat_template get_training_chat_template supports_tool_calling apply_chat_template "
    "extract_prompt is_conversational is_conversational_from_value maybe_apply_chat_template maybe_convert_to_chatml "
    "maybe_extract_prompt maybe_unpair_preference_dataset pack_dataset prepare_multimodal_messages "
    "unpair_preference_dataset create_reference_model DatasetMixtureConfig ScriptArguments TrlParser get_dataset "
    "init_zero_verbose BEMACallback DistillationConfig DistillationTrainer DPOConfig DPOTrainer GRPOConfig GRPOTrainer "
    "KTOConfig KTOTrainer LogCompletionsCallback ModelConfig RewardConfig RewardTrainer RichProgressCallback "
    "RLOOConfig RLOOTrainer SFTConfig SFTTrainer SyncRefModelCallback WeaveCallback get_peft_config "
    "get_quantization_config"
).split()
# grpokit's own modules that share a name with one of trl's packages: they get trl's submodules and names too
SHARED_MODULES = ("trainer", "scripts", "rewards")


class MissingTRL(ModuleNotFoundError):
    """A name of TRL's that grpokit does not implement, used without trl installed."""


def trl_installed() -> bool:
    return importlib.util.find_spec("trl") is not None


def missing(what: str) -> MissingTRL:
    e = MissingTRL(f"{what} is TRL's, which grpokit does not implement; install TRL to use it (pip install trl)")
    e.name = "trl"
    return e


def grpokit_names(trl_module: str) -> dict[str, str]:
    """The names grpokit implements in ``trl_module`` or any of its submodules (which re-exports them):
    name -> grpokit's module."""
    out = {}
    for where, (module, names) in IMPLEMENTED.items():
        if where == trl_module or where.startswith(trl_module + "."):
            out.update(dict.fromkeys(names, module))
    if trl_module == "trl":  # trl re-exports only some (its rewards stay in trl.rewards)
        out = {n: m for n, m in out.items() if n in TRL_NAMES}
    return out


def _grpokit_object(module: str, name: str) -> Any:
    return getattr(importlib.import_module(module), name)


def resolve(trl_module: str, name: str) -> Any:
    """``trl_module``'s ``name`` as grpokit.trl gives it: grpokit's object where grpokit implements it,
    trl's otherwise (a module of trl as its grpokit.trl view)."""
    ours = grpokit_names(trl_module)
    here = f"{PREFIX}{trl_module[3:]}"
    if not trl_installed():
        if name in ours:
            return _grpokit_object(ours[name], name)
        if trl_module == "trl" and name not in TRL_NAMES:
            raise AttributeError(f"module {here!r} has no attribute {name!r}")
        raise missing(f"{here}.{name}")
    try:
        obj = getattr(importlib.import_module(trl_module), name)
    except AttributeError:
        if name in ours:  # a later TRL moved it; grpokit still has it
            return _grpokit_object(ours[name], name)
        raise AttributeError(f"module {here!r} has no attribute {name!r} (nor has {trl_module})") from None
    if isinstance(obj, types.ModuleType) and obj.__name__ == f"{trl_module}.{name}":
        return importlib.import_module(PREFIX + obj.__name__[3:])
    defined = IMPLEMENTED.get(getattr(obj, "__module__", None) or "")
    if defined is not None and name in defined[1] and getattr(obj, "__name__", name) == name:
        return _grpokit_object(defined[0], name)
    return obj


def public_names(trl_module: str) -> list[str]:
    """What dir() shows of trl's module (TRL 1.16's top-level names when trl is missing)."""
    names = set(grpokit_names(trl_module))
    if trl_installed():
        names.update(n for n in dir(importlib.import_module(trl_module)) if not n.startswith("_"))
    elif trl_module == "trl":
        names.update(TRL_NAMES)
    return sorted(names)


def extend(module: types.ModuleType, trl_module: str) -> None:
    """Give the grpokit module ``module`` trl's names and submodules (``trl_module``) it lacks; its own
    names stay first (a module ``__getattr__`` only runs for names the module does not have)."""
    own_getattr = module.__dict__.get("__getattr__")

    def __getattr__(name: str) -> Any:
        if own_getattr is not None:
            try:
                return own_getattr(name)
            except AttributeError:
                pass
        if name.startswith("__"):
            raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")
        return resolve(trl_module, name)

    def __dir__() -> list[str]:
        return sorted(set(module.__dict__) | set(public_names(trl_module)))

    module.__getattr__ = __getattr__  # type: ignore[attr-defined]
    module.__dir__ = __dir__  # type: ignore[attr-defined]
    if not hasattr(module, "__path__"):
        module.__path__ = []  # type: ignore[attr-defined]  # so that grpokit.trl.trainer.grpo_trainer imports


class _ViewLoader(importlib.abc.Loader):
    """Builds ``grpokit.trl.<m>``: an empty module whose names are ``resolve("trl.<m>", name)``."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        trl_module = "trl" + module.__name__[len(PREFIX) :]
        module.__doc__ = f"TRL's {trl_module} under grpokit.trl: grpokit's objects where it implements them."
        extend(module, trl_module)


class ViewFinder(importlib.abc.MetaPathFinder):
    """Finds ``grpokit.trl.<m>`` for a module ``trl.<m>`` of trl when grpokit has no file of that name."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(PREFIX + "."):
            return None
        trl_module = "trl" + fullname[len(PREFIX) :]
        if trl_installed():
            try:
                found = importlib.util.find_spec(trl_module)
            except ImportError:
                return None
            if found is None:
                return None
            package = found.submodule_search_locations is not None
        elif grpokit_names(trl_module):
            package = any(w.startswith(trl_module + ".") for w in IMPLEMENTED)
        else:
            raise missing(fullname)
        return importlib.machinery.ModuleSpec(fullname, _ViewLoader(), is_package=package)


def install(package: types.ModuleType) -> None:
    """Make grpokit.trl (``package``) a superset of trl: its missing names, its modules, once per process."""
    if not any(isinstance(f, ViewFinder) for f in sys.meta_path):
        sys.meta_path.append(ViewFinder())
    extend(package, "trl")
    for name in SHARED_MODULES:
        extend(importlib.import_module(f"{PREFIX}.{name}"), f"trl.{name}")
