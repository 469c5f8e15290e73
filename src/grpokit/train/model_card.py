"""A checkpoint's model card (``model/README.md``): the Hub's metadata, then what was trained how, and the
held-out results when the step was evaluated. train/checkpoint.py writes it beside the weights."""

from __future__ import annotations

from pathlib import Path


def model_card(
    cfg,
    step: int,
    reward_names: list[str],
    eval_result: dict | None = None,
    *,
    model_name: str | None = None,
    dataset_name: str | None = None,
    tags: str | list[str] | None = None,
) -> str:
    """The model card of a checkpoint: Hub metadata (base model, library, tags) in YAML front
    matter, then what was trained how, and the held-out results when the step was evaluated.
    ``model_name`` (the heading and the metadata's ``model_name``), ``dataset_name`` (the metadata's
    ``datasets`` and the training data's line) and ``tags`` (added after grpokit's) are what TRL's
    ``create_model_card`` takes."""
    import yaml

    from grpokit.version import __version__

    m, d, r, a = cfg.model, cfg.data, cfg.rollout, cfg.algo
    base = m.name_or_path
    meta = _metadata(cfg, model_name, dataset_name, tags)
    if dataset_name:
        data = f"`{dataset_name}`"
    elif d.task and not d.dataset:
        data = f"built-in task `{d.task}`"
    else:
        data = f"`{d.dataset}`" if d.dataset else "rows passed from Python"
    lines = [
        "---",
        yaml.safe_dump(meta, sort_keys=False).strip(),
        "---",
        "",
        f"# {model_name or base.rstrip('/').split('/')[-1] or 'model'} trained with GRPO (grpokit {__version__})",
        "",
        f"Checkpoint after step {step} of {cfg.train.steps}, trained with grpokit "
        "(Group Relative Policy Optimization).",
        "",
        f"- base model: `{base}`"
        + (f" with LoRA adapters (r={m.lora_rank}, alpha={m.lora_alpha:g})" if m.lora_rank else ""),
        f"- training data: {data}",
        f"- rewards: {', '.join(f'`{n}`' for n in reward_names)}",
        f"- {r.group_size} completions per prompt, {cfg.train.prompts_per_step} prompt(s) per step, "
        f"up to {r.max_new_tokens} new tokens, temperature {r.temperature:g}",
        f"- advantages: baseline {a.baseline}, scale {a.scale}; loss aggregation {a.aggregation}, "
        f"clip [{1 - a.clip_low:g}, {1 + a.clip_high:g}], beta {a.beta:g}; learning rate {cfg.optim.lr:g}",
    ]
    if eval_result:
        lines += ["", "## Held-out evaluation (greedy)", "", "| metric | value |", "| --- | --- |"]
        lines += [f"| {k} | {v:.4g} |" for k, v in eval_result.items()]
    how = (
        "PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(BASE), PATH)"
        if meta["library_name"] == "peft"
        else "AutoModelForCausalLM.from_pretrained(PATH)"
    )
    lines += ["", "## Use", "", f"Load with `{how}`; the run's full configuration is its `config.yaml`.", ""]
    return "\n".join(lines)


def _metadata(cfg, model_name: str | None, dataset_name: str | None, tags: str | list[str] | None) -> dict:
    """The card's YAML front matter: the library, grpokit's tags then ``tags`` (a string is one tag), the
    base model when it is a Hub id, ``model_name`` and ``datasets`` when given."""
    m = cfg.model
    extra = [tags] if isinstance(tags, str) else list(tags or [])
    meta: dict = {
        "library_name": "peft" if m.lora_rank and m.lora_save == "adapter" else "transformers",
        "tags": list(dict.fromkeys(["grpokit", "grpo", "reinforcement-learning", *extra])),
    }
    base = m.name_or_path
    if base and not Path(base).exists() and base != "demo":  # a hub id; local paths mean nothing on the Hub
        meta["base_model"] = base
    if model_name:
        meta["model_name"] = model_name
    if dataset_name:
        meta["datasets"] = [dataset_name]
    return meta
