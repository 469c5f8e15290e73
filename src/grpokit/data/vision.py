"""Images in prompts: TRL's vision data conventions, the processor's prompt, the model's image inputs.

Data follows TRL: a row's images are in an ``image`` column (one) or an ``images`` column (a list),
each a PIL image, a file path, raw bytes, or a ``datasets`` Image dict (``{"bytes", "path"}``). A
conversational prompt marks where each image goes with ``{"type": "image"}`` content parts; a plain
text prompt gets its images in front of the text (grpokit's extension: TRL 1.16 refuses a plain text
prompt with images). A row whose image column is null is a text row among the image rows: it goes
through the processor without images and adds no image tensors. The model's ``AutoProcessor``
builds the prompt: its chat template writes the image placeholders and the processor expands each
into the image's tokens and returns ``pixel_values`` / ``image_grid_thw`` (the model's own names:
they travel as a dict, so other families' inputs pass through unchanged).

Those inputs ride with the prompt (``Prompt.vision``), its rollout rows (``Rollout.vision``) and
the token batch (``TokenBatch.vision``), so the rollout's prefill and every log-probability pass
(policy, old, reference) see the same images. Image tokens are part of the prompt, so they are
never among the completion tokens the loss trains on.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch

from grpokit.config.sections import ConfigError
from grpokit.data.system_prompt import with_system_prompt

IMAGE_COLUMNS = ("image", "images")
"""Columns that hold a row's images (TRL's names)."""


def has_images(rows: list[dict[str, Any]]) -> bool:
    """True when the rows carry images (an ``image`` or ``images`` column in any row: rows read from
    a JSON lines file need not all name the same columns)."""
    return any(c in r for r in rows for c in IMAGE_COLUMNS)


def load_image(value: Any, row: int):
    """One image as an RGB PIL image; a missing or unreadable one is a ConfigError naming row and path."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(value, Image.Image):
        return value.convert("RGB")
    if isinstance(value, dict):  # datasets' undecoded Image feature
        value = value.get("bytes") or value.get("path")
    source: Any = io.BytesIO(value) if isinstance(value, (bytes, bytearray)) else value
    where = "its bytes" if isinstance(value, (bytes, bytearray)) else repr(str(value))
    if isinstance(source, (str, Path)) and not Path(source).expanduser().exists():
        raise ConfigError(f"row {row}: image {where} does not exist; give an existing image file, bytes or a PIL image")
    try:
        with Image.open(Path(source).expanduser() if isinstance(source, (str, Path)) else source) as img:
            return img.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError, TypeError) as e:
        raise ConfigError(
            f"row {row}: image {where} could not be read ({type(e).__name__}); "
            "give a PNG/JPEG file, bytes or a PIL image"
        ) from None


def row_images(row: dict[str, Any], index: int) -> list:
    """The row's images in order (``images`` list first, else the ``image`` column); none for a row
    whose column is null or an empty list (a text row among image rows)."""
    value = row.get("images", row.get("image"))
    values = value if isinstance(value, (list, tuple)) else [value]
    return [load_image(v, index) for v in values if v is not None]


def vision_messages(prompt: Any, n_images: int, system_prompt: str = "") -> list[dict[str, Any]]:
    """Chat messages with image parts: a conversational prompt as given, string contents becoming text
    parts, the first user turn written as a string getting one image part per image before its text;
    a text prompt as one user turn with its images first (TRL's convention for the first; TRL 1.16 refuses
    the second, "Multimodal training requires conversational prompts")."""
    if isinstance(prompt, list):
        messages, placed = [], False
        for m in prompt:
            if isinstance(m.get("content"), list):
                messages.append(m)
                continue
            images = [{"type": "image"}] * n_images if m.get("role") == "user" and not placed else []
            placed = placed or m.get("role") == "user"
            messages.append({**m, "content": images + [{"type": "text", "text": str(m.get("content") or "")}]})
    else:
        messages = [
            {"role": "user", "content": [{"type": "image"}] * n_images + [{"type": "text", "text": str(prompt)}]}
        ]
    return with_system_prompt(messages, system_prompt, lambda text: [{"type": "text", "text": text}])


def encode_prompt(
    row: dict[str, Any], index: int, processor, system_prompt: str = "", template_kwargs: dict | None = None
) -> tuple[str, list[int], dict]:
    """``(text, ids, vision)`` of one image row: the processor's prompt with each image's tokens
    expanded, and its image tensors (``pixel_values``, ``image_grid_thw`` ...). ``template_kwargs`` are
    apply_chat_template's extra keywords (data.chat_template_kwargs; TRL passes its chat_template_kwargs
    to the processor's template alike)."""
    images = row_images(row, index)
    messages = vision_messages(row["prompt"], len(images), system_prompt)
    parts = sum(1 for m in messages if isinstance(m["content"], list) for c in m["content"] if c.get("type") == "image")
    if parts != len(images):
        raise ConfigError(
            f"row {index}: the prompt has {parts} image parts but the row has {len(images)} images; "
            "give one image per {'type': 'image'} part"
        )
    if not getattr(processor, "chat_template", None):
        raise ConfigError(
            "the processor has no chat template, so image placeholders cannot be written; give a processor with one"
        )
    text = processor.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False, **(template_kwargs or {})
    )
    enc = processor(text=[text], images=images or None, return_tensors="pt")
    vision = {
        k: v for k, v in enc.items() if k not in ("input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids")
    }
    return text, enc["input_ids"][0].tolist(), vision


def is_processor(obj: Any) -> bool:
    """A multimodal processor (has both a tokenizer and an image processor), not a bare tokenizer."""
    return hasattr(obj, "image_processor") and hasattr(obj, "tokenizer")


def load_processor(name_or_path: str, given=None, trust_remote_code: bool = False):
    """The model's processor: ``given`` when it is one (TRL's processing_class), else
    ``AutoProcessor`` of the model when it ships an image processor, else None (a text model)."""
    if given is not None:
        return given if is_processor(given) else None
    folder = Path(name_or_path)
    if folder.is_dir() and not any(
        (folder / f).exists() for f in ("preprocessor_config.json", "processor_config.json")
    ):
        return None
    from transformers import AutoProcessor

    try:
        proc = AutoProcessor.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    except (AttributeError, ImportError, ValueError, TypeError, OSError):
        # transformers builds video processors with torchvision; image prompts do not need one
        try:
            proc = _image_only_processor(name_or_path)
        except (AttributeError, ImportError, ValueError, TypeError, OSError):
            return None
    return proc if is_processor(proc) else None


def _image_only_processor(path: str):
    import json

    import transformers
    from transformers.utils import cached_file

    # a local folder or a hub name (its cached snapshot, or a download)
    config = cached_file(path, "processor_config.json", _raise_exceptions_for_missing_entries=False)
    name = json.loads(Path(config).read_text()).get("processor_class") if config else None
    cls = getattr(transformers, name, None) if name else None
    return image_only(cls).from_pretrained(path) if cls is not None else None


def image_only(cls):
    """``cls`` (a processor class whose third part is a video processor, as Qwen2-VL's) without its
    video part: transformers builds video processors with torchvision, which a CPU install may lack.
    Saved under ``cls``'s own name, so the files are the usual ones."""

    class ImageOnly(cls):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            cls.__init__(self, image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    ImageOnly.__name__ = ImageOnly.__qualname__ = cls.__name__
    return ImageOnly


def prompt_images(prompt) -> list:
    """A prompt's images as PIL images, from its row's ``image``/``images`` column (what vLLM takes;
    the transformers engines take ``prompt.vision``, the processor's tensors)."""
    return row_images(prompt.columns, 0)


def is_vision_config(config) -> bool:
    """True for an image-text-to-text model's config (it has a vision part)."""
    return getattr(config, "vision_config", None) is not None


# ---------------------------------------------------------------- model inputs


def stack(vision: list[dict[str, torch.Tensor]], device) -> dict[str, torch.Tensor]:
    """One batch's image inputs: every row's tensors concatenated along dim 0 in row order (the
    order the model meets the image placeholders in ``input_ids``). A row without images has no
    tensors (``{}``) and adds none: the keys are those of any row, so a text row first in the batch
    drops no other row's images. Empty when no row has an image."""
    keys = dict.fromkeys(k for v in vision for k in v)
    return {k: torch.cat([v[k] for v in vision if k in v]).to(device) for k in keys}


def _rope_owner(model):
    return next((m for m in model.modules() if hasattr(m, "get_rope_index")), None)


def image_token_id(model) -> int | None:
    cfg = getattr(model, "config", None)
    return getattr(cfg, "image_token_id", None) if cfg is not None else None


PLACEHOLDERS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
"""Config names of the tokens the processor writes for images: prompt-only, never sampled."""


def placeholder_ids(model) -> list[int]:
    """The model's image placeholder token ids (empty for a text model)."""
    cfg = getattr(model, "config", None)
    return sorted({i for n in PLACEHOLDERS if isinstance(i := getattr(cfg, n, None), int)})


def hide_placeholders(logits: torch.Tensor, ids: list[int]) -> torch.Tensor:
    """``logits`` with the placeholder tokens at -1e4 (probability 0 in every dtype; finite, so the
    entropy and a division by the temperature stay numbers). A sampled placeholder would be taken for an image without
    pixels by the next forward (measured: M-RoPE positions one image grid too long); the rollout and every
    log-probability pass hide the same ids, so sampling and training describe one distribution."""
    if not ids:
        return logits
    out = logits.clone()
    out[..., ids] = -1e4
    return out


def positions(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, inputs: dict[str, torch.Tensor]
) -> torch.Tensor | None:
    """Multimodal RoPE positions ``(3, B, L)`` of a left-padded batch (Qwen2-VL's M-RoPE: image
    tokens get (time, row, column) positions, text after them counts on from the largest), or None
    for models that place positions themselves. Computed by the model's own ``get_rope_index`` for
    the prefill and for the training passes alike, so sampling and training agree. A row without
    images gets plain text positions from its first token (left padding skipped)."""
    owner, img = _rope_owner(model), image_token_id(model)
    if owner is None or img is None:
        return None
    # a batch of text rows only (no ``image_grid_thw``) too: the model's own fallback would count
    # positions from the padded row's first column, not from its first token
    types = (input_ids == img).int()
    pos, _ = owner.get_rope_index(
        input_ids, mm_token_type_ids=types, image_grid_thw=inputs.get("image_grid_thw"), attention_mask=attention_mask
    )
    return pos


def forward_kwargs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, vision: list[dict]) -> dict[str, Any]:
    """Keyword arguments of a forward over rows with images: the image tensors and the positions."""
    inputs = stack(vision, input_ids.device)
    if "pixel_values" in inputs:
        inputs["pixel_values"] = inputs["pixel_values"].to(next(model.parameters()).dtype)
    pos = positions(model, input_ids, attention_mask, inputs)
    if pos is None:
        img = image_token_id(model)
        if img is not None:
            inputs["mm_token_type_ids"] = (input_ids == img).int()
    else:
        inputs["position_ids"] = pos
    return inputs
