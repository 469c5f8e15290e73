"""Stage 1: prompts. Load rows, map columns, apply the chat template (the seeded batches: prompt_sampler.py).

Rows are plain dicts with at least ``prompt`` (text, or a list of chat messages) and, when the data
has one, ``answer``; every other column travels along and reaches reward functions as a keyword
argument, as in TRL. Sources: a built-in task, a local .jsonl/.json/.parquet/.csv file, or a
``datasets`` hub name (the hub path is real code, it cannot run in an offline sandbox).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from grpokit.config.sections import ConfigError, DataConfig
from grpokit.data.system_prompt import check_system_prompt, with_system_prompt
from grpokit.data.vision import encode_prompt, has_images
from grpokit.rewards.spec import RESERVED_KEYWORDS
from grpokit.types import Prompt

from .files import read_rows

FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def load_rows(
    source: str, split: str, cfg: DataConfig, split_field: str = "data.split", default_split: str = "train"
) -> list[dict[str, Any]]:
    """Rows of a file, folder or hub dataset, the prompt column as ``prompt`` and the answer column as
    ``answer`` (and still under its own name, for reward functions that ask for it, e.g. ``solution``).

    ``split`` is the split read, given as the setting ``split_field`` whose default is ``default_split``:
    a hub dataset and a ``save_to_disk`` DatasetDict folder are read at that split (one the folder lacks
    is refused, naming those it has); a single file, an image folder or a saved single Dataset has no
    splits, so any split but the default is refused rather than ignored."""
    path = Path(source).expanduser()
    if path.is_dir():
        return rename_columns(_folder_rows(path, source, split, split_field, default_split), cfg, source)
    if path.suffix in FILE_BUILDERS or path.exists():
        if not path.exists():
            raise ConfigError(f"data file {source!r} does not exist; give an existing .jsonl/.json/.parquet/.csv file")
        if path.suffix not in FILE_BUILDERS:
            raise ConfigError(f"data file {source!r} has an unsupported type; use one of {', '.join(FILE_BUILDERS)}")
        _no_split(split, split_field, default_split, f"{source!r} is a single file")
        return rename_columns(_file_rows(path, source), cfg, source)
    import datasets

    try:
        ds = datasets.load_dataset(source, split=split)
    except Exception as e:  # network, unknown name, unknown split: one sentence for the user
        raise ConfigError(
            f"could not load dataset {source!r} split {split!r} from the hub ({type(e).__name__}: {e})"
        ) from None
    return rename_columns([dict(r) for r in ds], cfg, source)


def _no_split(split: str, split_field: str, default_split: str, what: str) -> None:
    """Refuse a split other than the default for a source without splits (it would be ignored)."""
    if split != default_split:
        raise ConfigError(
            f"{split_field}={split!r} names a split, but {what} with no splits; leave {split_field} at "
            f"{default_split!r} for it, or give a save_to_disk folder or hub dataset that has a {split!r} split"
        )


def _file_rows(path: Path, source: str) -> list[dict[str, Any]]:
    """A local file's rows: text formats as written (data/files.py), parquet through ``datasets``."""
    if path.suffix != ".parquet":
        return read_rows(path, source)  # encoding, emptiness, ragged rows: one sentence naming the line
    import datasets

    try:
        return [dict(r) for r in datasets.load_dataset("parquet", data_files=str(path), split="train")]
    except Exception as e:  # a damaged parquet file
        raise ConfigError(
            f"data file {source!r} could not be read as parquet ({type(e).__name__}: {_short(e)})"
        ) from None


def _folder_rows(path: Path, source: str, split: str, split_field: str, default_split: str) -> list[dict[str, Any]]:
    """A local folder: a dataset saved with ``save_to_disk`` (a DatasetDict at ``split``), or an image
    folder whose ``metadata.jsonl`` / ``metadata.csv`` names each image (``file_name``) and its prompt and
    answer columns (datasets' ``imagefolder``: the images arrive in an ``image`` column)."""
    import datasets

    if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
        ds = datasets.load_from_disk(str(path))
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise ConfigError(
                    f"{split_field}={split!r} is not a split of the saved dataset {source!r}; "
                    f"its splits are: {', '.join(ds)}"
                )
            ds = ds[split]
        else:
            _no_split(split, split_field, default_split, f"{source!r} is a saved single Dataset")
    elif any((path / f).exists() for f in ("metadata.jsonl", "metadata.csv")):
        _no_split(split, split_field, default_split, f"{source!r} is an image folder")
        ds = datasets.load_dataset("imagefolder", data_dir=str(path), split="train")
    else:
        raise ConfigError(
            f"data folder {source!r} holds neither a saved dataset nor an image folder's metadata.jsonl/metadata.csv; "
            "give a data file, a save_to_disk folder or an image folder with metadata"
        )
    return [dict(r) for r in ds]


def _short(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0][:200] if lines else "no message"


def column_names(cols: list) -> str:
    """The columns, comma-separated on one line: a name with a line break, a control character, surrounding
    spaces or nothing at all (a CSV header can hold any of them) is quoted, escapes shown."""
    return ", ".join(c if isinstance(c, str) and c and c.isprintable() and c.strip() == c else repr(c) for c in cols)


def rename_columns(rows: list[dict[str, Any]], cfg: DataConfig, source: str) -> list[dict[str, Any]]:
    if not rows:
        raise ConfigError(f"dataset {source!r} has no rows")
    cols = list(rows[0])
    if cfg.prompt_column not in cols:
        raise ConfigError(
            f"data.prompt_column={cfg.prompt_column!r} is not a column of {source!r}; "
            f"its columns are: {column_names(cols)}"
        )
    if cfg.answer_column and cfg.answer_column not in cols:
        raise ConfigError(
            f"data.answer_column={cfg.answer_column!r} is not a column of {source!r}; "
            f"its columns are: {column_names(cols)} (set data.answer_column= to use none)"
        )
    check_columns(cols, source)
    for own, setting in (("prompt", "prompt_column"), ("answer", "answer_column")):
        given = getattr(cfg, setting)
        if given and given != own and own in cols:  # r[own] = r[given] below would replace the dataset's column
            raise ConfigError(
                f"{source!r} has a column {own!r} besides data.{setting}={given!r}, which grpokit passes on as "
                f"{own!r} and so would replace it; rename the dataset's {own!r} column or set data.{setting}={own}"
            )
    out = []
    for n, r in enumerate(rows, 1):
        r = dict(r)
        check_prompt(r.get(cfg.prompt_column), f"row {n} of {source!r}", cfg.prompt_column)
        if _is_empty(r[cfg.prompt_column]):  # a conversation of empty messages too (see check_prompt)
            raise ConfigError(
                f"row {n} of {source!r} has an empty prompt (column {cfg.prompt_column!r}); give every row a prompt"
            )
        r["prompt"] = r.pop(cfg.prompt_column)
        if cfg.answer_column:
            r["answer"] = r[cfg.answer_column]
        out.append(r)
    return out


def check_columns(columns, source: str) -> None:
    """Refuse a column named like a keyword grpokit passes reward functions itself (rewards/spec.py
    RESERVED_KEYWORDS): grpokit's value would replace the column's, and the function never see the data."""
    clash = [c for c in columns if c in RESERVED_KEYWORDS]
    if clash:
        raise ConfigError(
            f"{source!r} has a column named {clash[0]!r}, a keyword grpokit passes reward functions itself, so its "
            f"values would never reach them; rename the column (reserved names: {', '.join(RESERVED_KEYWORDS)})"
        )


PROMPT_FORMS = "a text, or a list of chat messages such as [{'role': 'user', 'content': '...'}]"


def check_prompt(prompt: Any, where: str, column: str = "prompt") -> None:
    """One sentence for a row whose prompt (its value in ``column``) grpokit cannot train on, ``where``
    naming the row: none (a ragged file's missing value, which ``datasets`` fills with None), an empty text or
    no message, or a value that is neither text nor a list of chat messages (dicts with a ``role``). The native
    loader (``rename_columns``), ``to_prompts`` and grpokit.trl's datasets (trl/inputs.py, each row as it is
    read) all ask it, so no row is ever rendered as ``str(value)``. Messages with empty contents pass: an
    environment's reset() fills them (TRL's own placeholder rows are one empty user turn); a data file's are
    refused besides, where it loads."""
    if prompt is None:  # ragged rows: datasets fills a missing column with None
        raise ConfigError(
            f"{where} has no value in the prompt column {column!r}; give every row a prompt: {PROMPT_FORMS}"
        )
    if isinstance(prompt, str) and not prompt.strip() or isinstance(prompt, list) and not prompt:
        raise ConfigError(f"{where} has an empty prompt (column {column!r}); give every row a prompt")
    if isinstance(prompt, str):
        return
    if not isinstance(prompt, list):
        raise ConfigError(
            f"{where} has a prompt of type {type(prompt).__name__} ({prompt!r:.60}) in column {column!r}; a prompt "
            f"is {PROMPT_FORMS}"
        )
    odd = [m for m in prompt if not _is_message(m)]
    if odd:
        raise ConfigError(
            f"{where} has a prompt (column {column!r}) that is a list holding {odd[0]!r:.60}, which is not a chat "
            f"message (a dict with a 'role'); a prompt is {PROMPT_FORMS}"
        )


def _is_message(m: Any) -> bool:
    return isinstance(m, dict) and isinstance(m.get("role"), str)


def _is_empty(prompt: Any) -> bool:
    """An empty or blank text, or a conversation with no message or only empty contents."""
    if isinstance(prompt, str):
        return not prompt.strip()
    if isinstance(prompt, list):
        return all(isinstance(m, dict) and not str(m.get("content") or "").strip() for m in prompt)
    return False


def render_prompt(prompt: Any, tokenizer, cfg: DataConfig, tools: list | None = None) -> str:
    """Prompt text as the model sees it: through the chat template when configured and available
    (with the tools' JSON schemas, for multi-turn episodes with tools)."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    use = _templated(tokenizer, cfg, prompt)
    if cfg.chat_template == "always" and not has_template:
        raise ConfigError("data.chat_template='always' but the tokenizer has no chat template; use auto or never")
    if cfg.chat_template in ("auto", "conversational") and isinstance(prompt, list) and not has_template:
        raise ConfigError(  # the roles would be dropped
            f"the prompts are chat messages but the tokenizer has no chat template (data.chat_template="
            f"{cfg.chat_template}); give a model or tokenizer with a chat template (processing_class), plain-text "
            "prompts, or set data.chat_template=never to join each conversation's contents into one text, one "
            "message a line, roles dropped"
        )
    if not isinstance(prompt, (str, list)):  # never str() of an arbitrary value (None would train as "None")
        raise ConfigError(f"a prompt is {PROMPT_FORMS}, not a {type(prompt).__name__} ({prompt!r:.60})")
    if not use:  # data.chat_template=never: a conversation's contents joined, as its docstring says
        if isinstance(prompt, list):
            return "\n".join(str(m.get("content", "")) for m in prompt)
        return prompt
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    messages = with_system_prompt(messages, cfg.system_prompt)
    kw = {**cfg.chat_template_kwargs, **({"tools": tools} if tools else {})}
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kw)


def to_prompts(
    rows: list[dict[str, Any]],
    tokenizer,
    cfg: DataConfig,
    tools: list | Callable | None = None,
    processor=None,
    source: str = "the data",
) -> list[Prompt]:
    """Prompts of the rows; rows with an ``image``/``images`` column go through the model's
    ``processor`` (data/vision.py), which must then be given. ``tools``: the tool schemas every
    prompt shows, or a function row -> schemas (named environments: each row its environment's tools).
    ``source`` names the rows in an error (rows passed in are checked here, not where files load)."""
    check_columns(dict.fromkeys(k for r in rows for k in r), source)
    for n, r in enumerate(rows, 1):
        check_prompt(r.get("prompt"), f"row {n} of {source}")
    check_system_prompt([r["prompt"] for r in rows], cfg.system_prompt, source)
    if has_images(rows):
        return _vision_prompts(rows, processor, cfg, tools(rows[0]) if callable(tools) else tools)
    check_template_settings([r["prompt"] for r in rows], tokenizer, cfg)
    prompts = []
    for n, r in enumerate(rows, 1):
        text = render_prompt(r["prompt"], tokenizer, cfg, tools(r) if callable(tools) else tools)
        ids = tokenizer(text, add_special_tokens=not _templated(tokenizer, cfg, r["prompt"]))["input_ids"]
        if not ids:
            raise ConfigError(f"the prompt of row {n} tokenised to nothing: {text!r}; give every row a prompt")
        prompts.append(
            Prompt(text=text, ids=list(ids), columns={k: v for k, v in r.items() if k != "prompt"}, raw=r["prompt"])
        )
    return prompts


@dataclass(frozen=True)
class PromptMaker:
    """How one run turns rows into Prompts: its tokenizer, data settings, tool schemas and the model's
    processor (None: a text model). Built once (train/build.py ``prompt_maker``, where the processor is
    loaded) and kept by the trainer, so every caller - training and held-out prompts, TRL's evaluate(),
    a subclass calling _generate_and_score_completions itself, ``grpokit eval`` - meets image rows with
    the processor."""

    tokenizer: Any
    cfg: DataConfig
    tools: list | Callable | None = None
    processor: Any = None

    def __call__(self, rows: list[dict[str, Any]], source: str = "the data") -> list[Prompt]:
        """The rows' prompts; ``source`` names the rows in an error (to_prompts)."""
        return to_prompts(rows, self.tokenizer, self.cfg, self.tools, self.processor, source)


def _vision_prompts(rows: list[dict[str, Any]], processor, cfg: DataConfig, tools: list | None) -> list[Prompt]:
    if processor is None:
        raise ConfigError(
            "the data has an image column but the model has no image processor; give a vision-language "
            "model (its folder with a processor) or pass its AutoProcessor as processing_class"
        )
    if tools:
        raise ConfigError(
            "tools and environments with image prompts are not supported yet; drop env.tools or the image column"
        )
    if cfg.chat_template == "never":  # the placeholders the images' tokens expand from are the template's
        raise ConfigError(
            "data.chat_template=never but the data has images, whose places in the prompt only the processor's chat "
            "template writes; set data.chat_template=auto (or always), or drop the image column"
        )
    out = []
    for i, r in enumerate(rows):
        text, ids, vision = encode_prompt(r, i, processor, cfg.system_prompt, cfg.chat_template_kwargs)
        out.append(
            Prompt(
                text=text,
                ids=ids,
                columns={k: v for k, v in r.items() if k != "prompt"},
                raw=r["prompt"],
                vision=vision,
            )
        )
    return out


def check_template_settings(prompts: list, tokenizer, cfg: DataConfig) -> None:
    """Refuse data.system_prompt when a prompt would not go through the chat template (it is added there
    only), and data.chat_template_kwargs when none would: either would be dropped without a word."""
    plain = [n for n, p in enumerate(prompts, 1) if not _templated(tokenizer, cfg, p)]
    if cfg.system_prompt and plain:
        name = "data.system_prompt"
    elif cfg.chat_template_kwargs and plain and len(plain) == len(prompts):
        name = "data.chat_template_kwargs"
    else:
        return
    if cfg.chat_template == "never":
        why, fix = "data.chat_template=never", "set data.chat_template=auto with a tokenizer that has a chat template"
    elif cfg.chat_template == "conversational":
        why = f"the prompt of row {plain[0]} is plain text, which data.chat_template=conversational sends as written"
        fix = "give the prompts as chat messages or set data.chat_template=auto"
    else:
        why, fix = "the tokenizer has no chat template", "give a tokenizer (model) with a chat template"
    raise ConfigError(
        f"{name} is set but {why}, so it would never reach the model; {fix}, write it into the prompts, "
        f"or leave {name} empty"
    )


def _templated(tokenizer, cfg: DataConfig, prompt: Any = None) -> bool:
    """Whether ``prompt`` goes through the chat template: "conversational" (TRL) templates chat
    messages only; "always" needs a template; "auto" uses one when the tokenizer has it."""
    if cfg.chat_template == "conversational":
        return isinstance(prompt, list)
    if cfg.chat_template == "always":
        return True
    return cfg.chat_template != "never" and bool(getattr(tokenizer, "chat_template", None))


def fingerprint(prompts: list[Prompt]) -> dict[str, Any]:
    """The training prompts' identity, as a checkpoint keeps it: how many, and a sha256 of each one's prompt as
    the dataset gave it and its other columns, in order. A resume compares it: the data position means the same
    prompts only over the same rows."""
    h = hashlib.sha256()
    for p in prompts:
        row = [p.raw if p.raw is not None else p.text, p.columns]
        h.update(json.dumps(row, sort_keys=True, default=_stable).encode())
        h.update(b"\n")
    return {"prompts": len(prompts), "sha256": h.hexdigest()}


def _stable(value: Any) -> str:
    """A value JSON has no type for, as the same text in every process: an image or array by its bytes (its
    repr would carry a memory address), anything else by its type."""
    data = value.tobytes() if hasattr(value, "tobytes") else None
    if data is None and hasattr(value, "numpy"):
        data = value.detach().cpu().numpy().tobytes()
    kind = type(value).__name__
    return f"{kind}:{hashlib.sha256(data).hexdigest()}" if isinstance(data, bytes) else kind


def check_same_data(saved: dict | None, now: dict[str, Any], checkpoint: str) -> None:
    """One sentence when the training prompts differ from those the checkpoint was trained on (None: a checkpoint
    older than the fingerprint, not checked)."""
    if saved is None or saved == now:
        return
    raise ConfigError(
        f"the training data changed since checkpoint {checkpoint}: it was trained on {saved['prompts']} prompts "
        f"(sha256 {saved['sha256'][:12]}), the run now has {now['prompts']} (sha256 {now['sha256'][:12]}); its "
        "data position counts through the same prompts, so the resumed run would not continue the same "
        f"experiment: restore the data and its data.* settings, or start a new run from its weights "
        f"(model.name_or_path={checkpoint}/model)"
    )
