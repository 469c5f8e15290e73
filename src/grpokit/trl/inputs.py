"""GRPOTrainer's inputs as TRL takes them: datasets, reward functions (reward models: reward_model.py), PEFT settings,
the Hub."""

from __future__ import annotations

import dataclasses
import itertools
import os
import threading
from pathlib import Path
from typing import Any, Callable

from grpokit.config.io import set_field
from grpokit.config.sections import ConfigError
from grpokit.data.prompts import check_prompt
from grpokit.train.distributed import position

from .reward_model import RewardModel

LORA_FIELDS = {
    "r": "model.lora_rank",
    "lora_alpha": "model.lora_alpha",
    "lora_dropout": "model.lora_dropout",
    "target_modules": "model.lora_target_modules",
}
LORA_COSMETIC = {"task_type", "peft_type", "base_model_name_or_path", "revision", "inference_mode", "auto_mapping"}


HUB_TIMEOUT_S = float(
    os.environ.get("GRPOKIT_HUB_TIMEOUT_S", "900")
)  # one push, all files; a silent endpoint hung forever


class HubPushError(RuntimeError):
    """An upload to the Hub failed or did not finish in time (one sentence)."""


def push_folder(
    folder: Path,
    repo_id: str,
    message: str,
    token: str | None,
    private: bool | None,
    revision: str | None = None,
    timeout_s: float | None = None,
) -> str:
    """Upload the files of ``folder`` (not its subfolders: checkpoints and run files stay local) as one
    commit, within ``timeout_s`` seconds (``GRPOKIT_HUB_TIMEOUT_S``, 900 by default); any failure is one
    ``HubPushError`` sentence. The upload runs in a daemon thread, so a silent endpoint costs the deadline,
    never the run."""
    timeout_s = HUB_TIMEOUT_S if timeout_s is None else timeout_s
    box: dict[str, Any] = {}

    def upload() -> None:
        try:
            box["url"] = _upload(folder, repo_id, message, token, private, revision)
        except BaseException as e:  # handed to the caller as one sentence
            box["error"] = e

    thread = threading.Thread(target=upload, name="grpokit-hub-push", daemon=True)
    thread.start()
    thread.join(timeout_s)
    where = os.environ.get("HF_ENDPOINT") or "the Hugging Face Hub"
    if thread.is_alive():
        raise HubPushError(
            f"push_to_hub of {folder} to {repo_id} at {where} did not finish within {timeout_s:g} s; "
            "check the network or raise GRPOKIT_HUB_TIMEOUT_S (the model is saved locally)"
        )
    if "error" in box:
        e = box["error"]
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise HubPushError(
            f"push_to_hub of {folder} to {repo_id} at {where} failed ({type(e).__name__}: {first}); "
            "the model is saved locally"
        ) from None
    return box["url"]


def _upload(
    folder: Path, repo_id: str, message: str, token: str | None, private: bool | None, revision: str | None
) -> str:
    from huggingface_hub import CommitOperationAdd, HfApi

    api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None, token=token)
    api.create_repo(repo_id, private=private, exist_ok=True)
    ops = [
        CommitOperationAdd(path_in_repo=p.name, path_or_fileobj=str(p)) for p in sorted(folder.iterdir()) if p.is_file()
    ]
    return str(api.create_commit(repo_id, ops, commit_message=message, revision=revision).commit_url)


def rows_of(
    dataset: Any, what: str, prompt_only: bool, limit: int | None = None, whole_stream: bool = False
) -> list[dict]:
    """Rows of a ``datasets.Dataset`` (or a list of dicts), every column under its own name. An
    ``IterableDataset`` (streaming) is read up to ``limit`` rows: what ``max_steps`` will use; with
    ``whole_stream`` (an eval set, read once per evaluation) to its end."""
    if dataset is None:  # TRL's words first: scripts and TRL's tests match on them
        raise ConfigError(f"`{what}` is required: {what} is None; pass a datasets.Dataset with a 'prompt' column")
    if type(dataset).__name__ in ("DatasetDict", "IterableDatasetDict", "dict"):
        raise ConfigError(f"{what} is a {type(dataset).__name__}; pass one split, e.g. dataset['train']")
    if type(dataset).__name__ == "IterableDataset":
        if limit is None and not whole_stream:
            raise ConfigError(
                f"{what} is an IterableDataset; set max_steps (TRL needs it too with a stream) or load it without "
                "streaming"
            )
        dataset = itertools.islice(dataset, limit)
    rows = []
    for n, r in enumerate(dataset):  # a stream's rows are checked as they arrive
        r = dict(r)
        if n == 0 and "prompt" not in r:
            raise ConfigError(
                f"{what} has no 'prompt' column (its columns: {', '.join(r)}); rename the prompt column to "
                "'prompt' as TRL needs"
            )
        check_prompt(r.get("prompt"), f"{what}[{n}]")  # the native loader's check (data/prompts.py)
        rows.append({"prompt": r["prompt"]} if prompt_only else r)
    if not rows:
        raise ConfigError(f"{what} has no rows")
    return rows


def reward_funcs_of(
    funcs: Any,
    processing_classes: Any = None,
    env_reward: bool = False,
    chat_template_kwargs: dict | None = None,
    device_of: Callable[[], Any] | None = None,
) -> list[Callable]:
    """Callables as given; a string is a reward model (local folder or hub id), as TRL, scored with
    its entry of ``processing_classes`` when one is given (else its own tokenizer), on ``device_of()``
    (the run's device). One processing class not in a list is a list of one, as in TRL (so it fits a
    single reward function only). ``env_reward``: the environment's ``get_reward`` is a reward source,
    so no function is needed."""
    funcs = [] if funcs is None else funcs if isinstance(funcs, list) else [funcs]
    classes = (
        processing_classes
        if isinstance(processing_classes, list)
        else [None] * len(funcs)
        if processing_classes is None
        else [processing_classes]
    )
    if len(classes) != len(funcs):
        raise ConfigError(
            f"reward_processing_classes has {len(classes)} entries but there are {len(funcs)} reward functions; "
            "the two must match: give one per reward function (None for a function)"
        )
    out = []
    for f, tok in zip(funcs, classes):
        if isinstance(f, str) or type(f).__name__.endswith("ForSequenceClassification"):
            out.append(RewardModel(f, tok, chat_template_kwargs, device_of))
        elif callable(f) and not hasattr(f, "parameters"):
            out.append(f)
        else:
            raise ConfigError(
                f"reward_funcs entry {f!r:.80} is not supported; pass functions or reward models as a folder or hub id"
            )
    if not out and not env_reward:  # TRL's words first: scripts and TRL's tests match on them
        raise ConfigError(
            "No reward source provided: reward_funcs is empty; pass at least one reward function or reward model, "
            "or an environment_factory whose environment has get_reward()"
        )
    return out


def environment_owned_rows(environment_factory: Any, train_dataset: Any, args: Any) -> Any:
    """The training rows: ``train_dataset``, or with none TRL's placeholder for an environment that owns
    the data (one generation batch's prompts, each an empty user turn that reset()'s string fills in;
    ``max_steps`` sets the length). TRL's words, which scripts match on, for what it refuses."""
    if train_dataset is not None:
        return train_dataset
    if environment_factory is None:
        raise ConfigError("`train_dataset` is required unless an `environment_factory` is provided.")
    if isinstance(environment_factory, dict):
        raise ConfigError(
            "A `dict` `environment_factory` (multiple environments) requires a `train_dataset` with an "
            "`environment` column to route each example to its environment. Provide a dataset, or pass a "
            "single environment factory."
        )
    if args.max_steps <= 0:
        raise ConfigError(
            "When training without a `train_dataset` (the environment owns the data and returns the prompt "
            "from `reset()`), `max_steps` must be set to a positive value to define the training length. "
            "Set it via `GRPOConfig(max_steps=...)`."
        )
    world = position()[1]  # the joined process group, else torchrun's WORLD_SIZE
    batch = (
        args.generation_batch_size
        or args.per_device_train_batch_size * (args.steps_per_generation or args.gradient_accumulation_steps) * world
    )
    return [{"prompt": [{"role": "user", "content": ""}]} for _ in range(max(1, batch // args.num_generations))]


def env_owns_reward(reward_funcs: Any, environment_factory: Any) -> bool:
    """Whether the environment's ``get_reward`` is the reward source (asked only when no reward function is given)."""
    if reward_funcs or environment_factory is None:
        return False
    from grpokit.env import environment_rewards

    return bool(environment_rewards(environment_factory))


def apply_lora(cfg, peft_config: Any, model: Any) -> None:
    """A ``peft.LoraConfig`` onto model.lora_*; any other PEFT setting away from its default is refused. No
    ``target_modules`` means, as in PEFT, the default layers PEFT lists for the model's type (``model``: the
    model object or its name)."""
    from peft import LoraConfig

    if not isinstance(peft_config, LoraConfig):
        kind = " (a prompt-learning method)" if getattr(peft_config, "is_prompt_learning", False) else ""
        raise ConfigError(
            f"peft_config is a {type(peft_config).__name__}{kind}; grpokit trains LoRA adapters only (peft.LoraConfig)"
        )
    default = LoraConfig()
    for f in dataclasses.fields(peft_config):
        if f.name in LORA_FIELDS or f.name in LORA_COSMETIC:
            continue
        value = getattr(peft_config, f.name)
        if value != getattr(default, f.name):
            raise ConfigError(
                f"peft_config.{f.name}={value!r} is not supported by grpokit; leave it at PEFT's default "
                f"{getattr(default, f.name)!r}"
            )
    set_field(cfg, "model.lora_rank", peft_config.r)
    set_field(cfg, "model.lora_alpha", peft_config.lora_alpha)
    set_field(cfg, "model.lora_dropout", _lora_dropout(cfg, peft_config.lora_dropout))
    set_field(
        cfg, "model.lora_target_modules", lora_targets(peft_config.target_modules, model, cfg.model.trust_remote_code)
    )


def _lora_dropout(cfg, dropout: float) -> float:
    """The adapters' dropout: 0 under disable_dropout (model.disable_dropout), which zeroes it as TRL's does."""
    return 0.0 if cfg.model.disable_dropout else dropout


def lora_targets(targets: Any, model: Any, trust_remote_code: bool) -> list[str]:
    """model.lora_target_modules for ``peft_config.target_modules``: a list or 'all-linear' as given, None
    as PEFT's default layers for the model's type; a regular expression is refused."""
    if targets is None:
        from grpokit.train.lora_targets import default_targets

        return default_targets(model_type(model, trust_remote_code))
    if isinstance(targets, str) and targets.isidentifier() and targets != "all-linear":
        return [targets]  # one bare name (TRL's ModelConfig turns a one-item list into it): that module, not a pattern
    if targets == "all-linear":
        return ["all-linear"]
    if isinstance(targets, str):
        raise ConfigError(
            f"peft_config.target_modules={targets!r} is a regular expression; give a list of module names or "
            "'all-linear'"
        )
    return sorted(targets)


def model_type(model: Any, trust_remote_code: bool) -> str:
    """The ``model_type`` of a model object or of the model a name or folder holds (its config alone is read)."""
    if not isinstance(model, str):
        return model.config.model_type
    from transformers import AutoConfig

    from grpokit.train.models import model_path

    return AutoConfig.from_pretrained(model_path(model), trust_remote_code=trust_remote_code).model_type


def adopt_peft_model(cfg, model: Any, peft_config: Any) -> None:
    """A ``PeftModel`` given as the model trains its own LoRA adapters as they are, as in TRL: model.lora_*
    records their settings, and the reference of the KL term is the adapter as given (TRL copies it into a
    frozen second adapter "ref"; grpokit keeps a copy of its tensors, train/lora.py ``StartingAdapter``), or
    the base with the adapters off while they are PEFT's fresh zero adapters (the two are equal then)."""
    if peft_config is not None:
        raise ConfigError("model is already a PeftModel and peft_config is set too; pass one of them, as TRL requires")
    lora = model.peft_config.get(getattr(model, "active_adapter", "default")) or next(iter(model.peft_config.values()))
    if str(getattr(lora, "peft_type", "")).split(".")[-1] != "LORA":
        raise ConfigError(
            f"model is a PeftModel with {type(lora).__name__} adapters; grpokit trains LoRA adapters only"
        )
    targets = lora.target_modules
    set_field(cfg, "model.lora_rank", lora.r)
    set_field(cfg, "model.lora_alpha", lora.lora_alpha)
    set_field(cfg, "model.lora_dropout", _lora_dropout(cfg, lora.lora_dropout))
    set_field(cfg, "model.lora_target_modules", sorted(targets) if isinstance(targets, (set, list)) else ["all-linear"])


def refuse_custom_code(name: str, trust: bool) -> None:
    """TRL loads the model in its constructor, so a model with its own code and no ``trust_remote_code``
    fails there; grpokit loads later, so the model's config is read now to fail at the same point."""
    if trust:
        return
    from transformers import AutoConfig

    from grpokit.train.models import model_path

    try:
        AutoConfig.from_pretrained(model_path(name), trust_remote_code=False)
    except OSError:
        return  # not reachable now: the load reports it
    except ValueError as e:
        if "custom code" in str(e) or "trust_remote_code" in str(e):
            raise ConfigError(
                f"model={name!r} contains custom code; pass trust_remote_code=True in GRPOConfig "
                "(or model_init_kwargs) to run it, as TRL requires"
            ) from None
        raise


def resume_source(output_dir: str, resume: str | bool) -> str:
    """What grpokit's Trainer resumes from for ``resume_from_checkpoint``: the run folder output_dir (True,
    or that folder: its newest checkpoint that verifies, as transformers' last checkpoint), or exactly the
    checkpoint named (a ``checkpoint-N`` link or a grpokit ``checkpoints/step-N`` folder of output_dir's
    run). Anything else is refused in one sentence, never resumed from another checkpoint in its place."""
    from grpokit.train.run_checkpoints import checkpoint_folder

    if resume is True:
        return output_dir
    given = Path(str(resume))
    if not given.exists():  # transformers' words
        raise ConfigError(
            f"Can't find a valid checkpoint at {str(resume)}: resume_from_checkpoint names no folder; give True, "
            f"output_dir, or one of its checkpoint-N folders"
        )
    named = checkpoint_folder(given)
    if given.name.startswith("checkpoint-") and named is None:
        raise ConfigError(
            f"resume_from_checkpoint={str(resume)!r} is not a grpokit checkpoint (a checkpoint-N link to "
            "<output_dir>/checkpoints/step-N/model); grpokit resumes only its own checkpoints, which hold the "
            "whole run state: give True or one of output_dir's checkpoint-N links"
        )
    run = named[0] if named else given
    if run.resolve() != Path(output_dir).resolve():
        raise ConfigError(
            f"resume_from_checkpoint={str(resume)!r} is of the run in {str(run)!r}, but output_dir is "
            f"{output_dir!r}; grpokit continues a run in its own folder: set output_dir={str(run)!r}"
        )
    return str(named[1]) if named else output_dir


def row_loader(rows: list[dict], batch_size: int, repeats: int) -> Any:
    """A ``torch`` DataLoader of ``rows`` as TRL's GRPO loaders yield them to callbacks: lists of row
    dicts (TRL's identity collator), each row ``repeats`` times in a row (its G completions)."""
    from torch.utils.data import DataLoader

    order = [i for i in range(len(rows)) for _ in range(max(1, repeats))]
    return DataLoader(rows, batch_size=max(1, batch_size), sampler=order, collate_fn=_as_list)


def _as_list(batch: list) -> list:
    return batch
