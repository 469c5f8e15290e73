"""Sample images with boxes drawn, for the run's report (vision-language runs, docs/VISION.md).

For every logged sample row whose prompt carried an image, the image is written as
``<run>/images/step<step>_p<k>.png`` (scaled up so small canvases stay visible) with the gold box in
green and each completion's predicted box in red; the row gains ``image`` (the PNG's path relative
to the run folder) and every completion its parsed ``box``. The report shows ``image`` where a
sample row has one. Rows of text prompts are returned unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from grpokit.rewards.grounding import parse_boxes

GOLD, PREDICTED = (40, 170, 60), (220, 30, 30)
MIN_SIDE = 256
"""Images are scaled up (nearest neighbour) to at least this many pixels on their short side."""


def with_images(
    rows: list[dict[str, Any]], prompts: Sequence[Any], run_dir: str | Path, step: int
) -> list[dict[str, Any]]:
    """``rows`` (sample rows, row k for ``prompts[k]``) with drawn images added where prompts have one."""
    from grpokit.data.vision import row_images

    for k, row in enumerate(rows):
        columns = getattr(prompts[k], "columns", {}) if k < len(prompts) else {}
        if "image" not in columns and "images" not in columns:
            continue
        images = row_images(columns, k)
        if not images:
            continue
        gold = parse_boxes(str(columns.get("answer", "")))
        predicted = []
        for comp in row.get("completions", []):
            boxes = parse_boxes(str(comp.get("text", comp.get("completion", ""))))
            comp["box"] = list(boxes[0]) if len(boxes) == 1 else None
            predicted += boxes[:1] if len(boxes) == 1 else []
        name = Path("images") / f"step{step:06d}_p{k}.png"
        (Path(run_dir) / "images").mkdir(parents=True, exist_ok=True)
        draw_boxes(images[0], gold[:1], predicted).save(Path(run_dir) / name)
        row["image"] = str(name)
    return rows


def draw_boxes(image, gold: Sequence[Sequence[float]], predicted: Sequence[Sequence[float]]):
    """A scaled-up copy of ``image`` with ``gold`` boxes in green and ``predicted`` in red."""
    from PIL import Image, ImageDraw

    scale = max(1, -(-MIN_SIDE // min(image.size)))
    out = image.convert("RGB").resize((image.width * scale, image.height * scale), Image.NEAREST)
    draw = ImageDraw.Draw(out)
    for colour, boxes, width in ((GOLD, gold, 3), (PREDICTED, predicted, 1)):
        for x1, y1, x2, y2 in boxes:
            left, top = min(x1, x2) * scale, min(y1, y2) * scale
            # a zero-width or zero-height box (x1 == x2) is drawn as a line, not refused by PIL
            draw.rectangle(
                [left, top, max(left, max(x1, x2) * scale - 1), max(top, max(y1, y2) * scale - 1)],
                outline=colour,
                width=width,
            )
    return out
