"""The built-in visual task: coloured shapes on a 64x64 canvas, drawn on the fly.

Two kinds of question, both verifiable without a model (VLM-R1 / R1-V's recipe in miniature):

* ``box``:   "where is the red square?"  answered ``[x1,y1,x2,y2]`` in pixels, scored by IoU
  with the drawn square (rewards/grounding.py), so near misses earn partial credit;
* ``count``: "how many shapes?"          answered with one digit, scored exactly.

Shapes are 12 px squares and discs, one per 16 px cell of a 4 x 4 grid (2 px from the cell's
corner), and a cell is exactly one image token of the tiny model (8 px patches merged 2 x 2), so the
task is about reading the image, not about sub-token precision; a box one cell off scores IoU 0. A scene is described by
a short string (``scene_key``); it is held out when ``crc32(key) % 10 == 0``, so no held-out scene is ever drawn for
training (as in arithmetic.py).

Rows follow TRL's vision convention: a conversational ``prompt`` whose user content holds an
``{"type": "image"}`` part, the PIL image in the ``image`` column, ``answer``, ``kind`` and ``scene``
(the scene's key) columns.
"""

from __future__ import annotations

import itertools
import random
import zlib
from typing import Any, Iterator, Sequence

from grpokit.rewards.grounding import box_iou_reward, count_reward

CANVAS = 64
"""Canvas side in pixels (64 x 64: an 8 x 8 patch grid, 16 image tokens after the 2 x 2 merge)."""
SIDE = 12
"""Side of every shape in pixels."""
STEP = 16
"""Cell size: shapes' top-left corners are at 2, 18, 34, 50 on each axis."""
MARGIN = 2
COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (50, 80, 220)}
SHAPES = ("square", "disc")
BOX_QUESTION = "where is the red square?"
COUNT_QUESTION = "how many shapes?"
HOLD_OUT_MODULUS = 10

_PLACES = [(x + MARGIN, y + MARGIN) for y in range(0, CANVAS, STEP) for x in range(0, CANVAS, STEP)]


def _free(place: tuple[int, int], taken: list[tuple[int, int]]) -> bool:
    return all(abs(place[0] - x) >= SIDE + 2 or abs(place[1] - y) >= SIDE + 2 for x, y in taken)


def _draw_scene(rng: random.Random, kind: str) -> list[tuple[str, str, int, int]]:
    """Shapes ``(colour, shape, x, y)``; for ``box`` the first is the one red square."""
    n = rng.randint(1, 4) if kind == "count" else rng.randint(1, 3)
    shapes: list[tuple[str, str, int, int]] = []
    taken: list[tuple[int, int]] = []
    while len(shapes) < n:
        place = rng.choice(_PLACES)
        if not _free(place, taken):
            continue
        if kind == "box" and not shapes:
            colour, shape = "red", "square"
        else:  # distractors of a box question are never red squares
            colour, shape = rng.choice(list(COLOURS)), rng.choice(SHAPES)
            if kind == "box" and (colour, shape) == ("red", "square"):
                continue
        shapes.append((colour, shape, *place))
        taken.append(place)
    return shapes


def scene_key(kind: str, shapes: Sequence[tuple[str, str, int, int]]) -> str:
    return kind + "|" + ";".join(f"{c},{s},{x},{y}" for c, s, x, y in shapes)


def is_held_out(key: str) -> bool:
    return zlib.crc32(key.encode()) % HOLD_OUT_MODULUS == 0


def render(shapes: Sequence[tuple[str, str, int, int]]):
    """The scene as a 64x64 RGB PIL image (shapes on a position-tinted pale background)."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (CANVAS, CANVAS))
    # A pale background whose green/blue tint grows with x/y: attention's rotary positions do not
    # reach the values a tiny model reads out, so the pixels themselves say where a patch is.
    img.putdata([(255, 190 + x, 190 + y) for y in range(CANVAS) for x in range(CANVAS)])
    draw = ImageDraw.Draw(img)
    for colour, shape, x, y in shapes:
        box = (x, y, x + SIDE - 1, y + SIDE - 1)
        (draw.rectangle if shape == "square" else draw.ellipse)(box, fill=COLOURS[colour])
    return img


def make_row(kind: str, shapes: Sequence[tuple[str, str, int, int]]) -> dict[str, Any]:
    """One TRL-style vision row; the box answer is the square's ``[x1,y1,x2,y2]`` (x2 = x1 + SIDE)."""
    if kind == "box":
        _, _, x, y = shapes[0]
        answer, question = f"[{x},{y},{x + SIDE},{y + SIDE}]", BOX_QUESTION
    else:
        answer, question = str(len(shapes)), COUNT_QUESTION
    prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
    return {"prompt": prompt, "image": render(shapes), "answer": answer, "kind": kind, "scene": scene_key(kind, shapes)}


def iter_rows(seed: int, held_out: bool = False) -> Iterator[dict[str, Any]]:
    """The endless seeded stream ``train_rows`` / ``held_out_rows`` take their first ``n`` rows of
    (a longer list never reorders a shorter one's rows)."""
    rng = random.Random(seed)
    while True:
        kind = rng.choice(("box", "count"))
        shapes = _draw_scene(rng, kind)
        if is_held_out(scene_key(kind, shapes)) == held_out:
            yield make_row(kind, shapes)


def _rows(n: int, seed: int, held_out: bool) -> list[dict[str, Any]]:
    return list(itertools.islice(iter_rows(seed, held_out), n))


def train_rows(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` training rows (half box, half count questions on average), deterministic in (n, seed)."""
    if n < 0:
        raise ValueError(f"train_rows: n must be >= 0, got {n}")
    return _rows(n, seed, held_out=False)


def held_out_rows(n: int | None = None, seed: int = 1234) -> list[dict[str, Any]]:
    """``n`` (default 200) rows of held-out scenes, never drawn by ``train_rows``."""
    return _rows(200 if n is None else n, seed, held_out=True)


def shapes_reward(
    prompts: Sequence[Any], completions: Sequence[Any], answer: Sequence[str], kind: Sequence[str], **kwargs: Any
) -> list[float]:
    """IoU of the predicted box for ``box`` rows, exact digit for ``count`` rows (0 for no answer)."""
    out = []
    for c, a, k in zip(completions, answer, kind):
        fn = box_iou_reward if k == "box" else count_reward
        out += fn([None], [c], [a], **({"log_metric": kwargs["log_metric"]} if "log_metric" in kwargs else {}))
    return out


def shapes_model_path():
    from pathlib import Path

    return Path(__file__).parent / "assets" / "shapes-vl-model"


def load_shapes_model(path=None):
    """``(model, processor)`` of the shipped tiny Qwen2-VL (or the one at ``path``)."""
    from transformers import AutoModelForImageTextToText

    from grpokit.data.vision import load_processor  # image-only: the folder has no video processor

    path = str(path or shapes_model_path())
    return AutoModelForImageTextToText.from_pretrained(path), load_processor(path)
