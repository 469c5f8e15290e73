"""Image prompts on vLLM: what each backend sends, in the form vLLM's API takes it.

Colocated (``rollout.backend=vllm``): ``LLM.generate`` takes one dict per prompt,
``{"prompt_token_ids": ids, "multi_modal_data": {"image": [PIL images]}}``. The ids are the
processor's, image placeholders already expanded (one run of image tokens per image, as TRL sends
them); vLLM finds the runs and puts the images' features there.

Server (``rollout.backend=vllm_server``), the wire format TRL 1.16's client uses with stock vLLM
(>= 0.30, started with ``--enable-scale-out``; ``grpokit vllm-serve`` adds it). The completions
endpoint takes text or token ids but no images, so, per prompt:

1. ``POST /v1/chat/completions/render`` with a throwaway user turn holding only the prompt's images,
   each as ``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}``, and
   ``max_tokens: 1``: the server processes the images and answers ``{"features": {...}}`` (the image
   data, its hashes and ``mm_placeholders``, where the images sat in *its* conversation);
2. the placeholders are moved to the runs of image tokens in grpokit's own prompt ids (``place``);
3. ``POST /inference/v1/generate`` with ``token_ids``, those ``features`` and ``sampling_params``
   (``n`` = G, ``logprobs: 0``, ``output_kind: 2`` = final outputs only: without it a non-streaming
   request with n > 1 returned only the samples that finished last, vLLM PR #52399). Its choices carry
   ``token_ids`` and ``logprobs.content[t].logprob`` (the sampler's logprobs) and ``finish_reason``,
   but no ``stop_reason``: a completion ended by a stop string reads as "eos" there.

Every reply field used is checked (``parse_generate``); another shape is one sentence.
"""

from __future__ import annotations

import base64
import io
import math
import uuid
from typing import Any

from .hf import SamplingParams
from .vllm_http import ServerReplyError, sampling_fields

RENDER = "/v1/chat/completions/render"
GENERATE = "/inference/v1/generate"
FINAL_ONLY = 2  # vLLM's RequestOutputKind.FINAL_ONLY


def llm_inputs(prompt_ids: list[list[int]], images: list[list] | None) -> list[dict[str, Any]]:
    """``LLM.generate``'s prompts: token ids, and each image prompt's PIL images beside them."""
    if images is None:
        return [{"prompt_token_ids": ids} for ids in prompt_ids]
    return [
        {"prompt_token_ids": ids, **({"multi_modal_data": {"image": list(imgs)}} if imgs else {})}
        for ids, imgs in zip(prompt_ids, images)
    ]


def data_url(image) -> str:
    """A PIL image as a PNG ``data:`` URL (lossless: the server sees the pixels the trainer saw)."""
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def render_body(model: str, images: list) -> dict[str, Any]:
    """The render request for one prompt's images (a user turn of image parts only)."""
    parts = [{"type": "image_url", "image_url": {"url": data_url(img)}} for img in images]
    return {"model": model, "messages": [{"role": "user", "content": parts}], "max_tokens": 1}


def image_runs(ids: list[int], image_token_id: int) -> list[dict[str, int]]:
    """``[{"offset", "length"}]`` of each run of ``image_token_id`` in ``ids``, in order."""
    runs, i = [], 0
    while i < len(ids):
        if ids[i] != image_token_id:
            i += 1
            continue
        j = i
        while j < len(ids) and ids[j] == image_token_id:
            j += 1
        runs.append({"offset": i, "length": j - i})
        i = j
    return runs


def place(features: Any, ids: list[int], image_token_id: int) -> dict[str, Any]:
    """The render's ``features`` with its image placeholders moved to the image runs of ``ids``."""
    if not isinstance(features, dict) or not isinstance(features.get("mm_placeholders"), dict):
        raise ServerReplyError("the vLLM server's render reply has no features with mm_placeholders")
    rendered = features["mm_placeholders"].get("image")
    runs = image_runs(ids, image_token_id)
    if not isinstance(rendered, list) or len(rendered) != len(runs):
        n = len(rendered) if isinstance(rendered, list) else 0
        raise ServerReplyError(
            f"the vLLM server processed {n} images but the prompt has {len(runs)} runs of image "
            f"token {image_token_id}; give one image per image placeholder"
        )
    return {**features, "mm_placeholders": {**features["mm_placeholders"], "image": runs}}


def generate_body(
    model: str, ids: list[int], features: dict | None, group_size: int, p: SamplingParams
) -> dict[str, Any]:
    """The generate request for one prompt of an image batch: every sampling field sent (as for
    /v1/completions); ``features`` None for a prompt without images (TRL's client sends it so)."""
    sampling = {**sampling_fields(group_size, p), "output_kind": FINAL_ONLY}
    return {
        "request_id": f"grpokit-{uuid.uuid4().hex}",
        "model": model,
        "token_ids": list(ids),
        "features": features,
        "sampling_params": sampling,
    }


def parse_generate(body: Any, expected: int) -> list[tuple[list[int], list[float], Any]]:
    """``(token ids, logprobs, finish_reason)`` of each choice of a generate reply, by index;
    ``ServerReplyError`` (one sentence) for any other shape."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or len(choices) != expected:
        n = len(choices) if isinstance(choices, list) else "no list of"
        raise ServerReplyError(f"the vLLM server's generate reply has {n} choices, expected {expected}")
    out = {}
    for k, c in enumerate(choices):
        index = c.get("index") if isinstance(c, dict) else None
        if type(index) is not int or not 0 <= index < expected or index in out:
            raise ServerReplyError(f"the vLLM server's generate choice {k} has no distinct index in 0..{expected - 1}")
        out[index] = _generated(c)
    return [out[i] for i in range(expected)]


def _generated(c: dict) -> tuple[list[int], list[float], Any]:
    ids, lp = c.get("token_ids"), c.get("logprobs")
    content = lp.get("content") if isinstance(lp, dict) else None
    if not isinstance(ids, list) or not all(type(t) is int and t >= 0 for t in ids):
        raise ServerReplyError(f"the vLLM server's generate choice {c['index']} has no list of token ids")
    if not isinstance(content, list) or len(content) != len(ids):
        raise ServerReplyError(f"the vLLM server returned generate choice {c['index']} without per-token logprobs")
    lps = [e.get("logprob") if isinstance(e, dict) else None for e in content]
    for v in lps:
        if type(v) not in (int, float) or not math.isfinite(v):
            raise ServerReplyError(
                f"the vLLM server returned logprob {str(v)[:40]!r} in generate choice {c['index']}, not a finite number"
            )
    finish = c.get("finish_reason")
    if finish is not None and not isinstance(finish, str):
        raise ServerReplyError(
            f"the vLLM server returned finish_reason {str(finish)[:40]!r} in generate choice {c['index']}"
        )
    return list(ids), [float(v) for v in lps], finish
