"""Image rows and text rows in one batch (the image column null on some rows).

A row without images is an image-batch row with no image tensors (``Prompt.vision == {}``): the batch's
image inputs are the other rows' tensors (``vision.stack`` over the union of keys), its positions are
plain text positions from its own first token, and every row's logits equal the row's run alone. TRL
1.16 fails on such a batch (its processor is handed a None image), so there is no TRL oracle here; the
oracle is each row run by itself."""

from __future__ import annotations

import pytest
import torch

from grpokit.config.sections import DataConfig
from grpokit.data import vision
from grpokit.data.prompts import to_prompts
from grpokit.data.tasks import shapes
from helpers.vision_spy import sample_image_prompts, spy_image_forwards

MESSAGES = [{"role": "user", "content": "how many shapes?"}]


def _rows(has_image: list[bool]) -> list[dict]:
    scenes = shapes.train_rows(len(has_image), seed=3)
    return [
        {"prompt": MESSAGES, "image": s["image"] if keep else None, "answer": s["answer"]}
        for s, keep in zip(scenes, has_image)
    ]


@pytest.fixture(scope="module")
def tiny():
    from transformers import AutoModelForImageTextToText

    path = str(shapes.shapes_model_path())
    return AutoModelForImageTextToText.from_pretrained(path).eval(), vision.load_processor(path)


def test_stack_takes_every_rows_keys_and_a_text_row_adds_nothing():
    a, b = torch.ones(2, 3), 2 * torch.ones(1, 3)
    grid_a, grid_b = torch.tensor([[1, 2, 2]]), torch.tensor([[1, 1, 2]])
    out = vision.stack(
        [{}, {"pixel_values": a, "image_grid_thw": grid_a}, {}, {"pixel_values": b, "image_grid_thw": grid_b}], "cpu"
    )
    # the first row has no images: before, its empty dict gave the batch no keys at all
    assert list(out) == ["pixel_values", "image_grid_thw"]
    assert out["pixel_values"].tolist() == [[1.0] * 3, [1.0] * 3, [2.0] * 3]  # rows 1 then 3, in row order
    assert out["image_grid_thw"].tolist() == [[1, 2, 2], [1, 1, 2]]
    assert vision.stack([{}, {}], "cpu") == {}  # a batch of text rows only: no image inputs


def test_rows_without_images_become_image_batch_rows_without_tensors(tiny):
    model, proc = tiny
    prompts = to_prompts(_rows([False, True, False]), proc.tokenizer, DataConfig(), processor=proc)
    img = model.config.image_token_id
    assert prompts[0].vision == {} and prompts[2].vision == {}
    assert prompts[0].ids.count(img) == 0 and prompts[1].ids.count(img) == 16  # 64x64 / 8 px / 2x2 merge
    assert prompts[1].vision["image_grid_thw"].tolist() == [[1, 8, 8]]
    # a JSON lines file may leave the column out of a row altogether: any row naming it makes image rows
    rows = [{"prompt": "hi"}, {"prompt": MESSAGES, "image": shapes.train_rows(1)[0]["image"]}]
    assert vision.has_images(rows) and not vision.has_images([{"prompt": "hi"}])
    assert [p.vision == {} for p in to_prompts(rows, proc.tokenizer, DataConfig(), processor=proc)] == [True, False]


def _logits(model, rows_ids: list[list[int]], rows_vision: list[dict]) -> list[torch.Tensor]:
    """Each row's logits at its own tokens, the rows left-padded into one batch."""
    width = max(len(r) for r in rows_ids)
    ids = torch.zeros(len(rows_ids), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows_ids):
        ids[i, width - len(r) :], mask[i, width - len(r) :] = torch.tensor(r), 1
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, **vision.forward_kwargs(model, ids, mask, rows_vision))
    return [out.logits[i, width - len(r) :] for i, r in enumerate(rows_ids)]


@pytest.mark.parametrize("has_image", [[False, True, False], [True, False], [False, False]])
def test_every_rows_logits_equal_the_row_run_alone(tiny, has_image):
    model, proc = tiny
    prompts = to_prompts(_rows(has_image), proc.tokenizer, DataConfig(), processor=proc)
    # a text row is shorter (no 16 image tokens), so it sits left-padded beside an image row
    together = _logits(model, [p.ids for p in prompts], [p.vision for p in prompts])
    for p, row in zip(prompts, together):
        [alone] = _logits(model, [p.ids], [p.vision])
        assert torch.allclose(row, alone, atol=1e-5)
    if any(has_image) and not all(has_image):  # the images do reach the image rows
        i = has_image.index(True)
        blank = {**prompts[i].vision, "pixel_values": torch.zeros_like(prompts[i].vision["pixel_values"])}
        [other] = _logits(model, [prompts[i].ids], [blank])
        assert not torch.allclose(other, together[i], atol=1e-3)


def test_positions_of_a_text_row_count_from_its_first_token(tiny):
    model, _ = tiny
    ids = torch.tensor([[0, 0, 7, 8, 9]])  # two pad columns, then three text tokens
    mask = torch.tensor([[0, 0, 1, 1, 1]])
    pos = vision.positions(model, ids, mask, {})  # no image_grid_thw: a batch of text rows
    # M-RoPE's three axes agree on text; the model's own fallback would have counted 2, 3, 4 here
    assert pos.shape == (3, 1, 5) and pos[:, 0, 2:].tolist() == [[0, 1, 2]] * 3


@pytest.mark.parametrize("first_has_image", [False, True])
def test_sampling_and_training_logprobs_agree_on_a_mixed_batch(tiny, first_has_image):
    from grpokit.train.logprobs import completion_logprobs
    from grpokit.train.token_batch import make_token_batch

    model, proc = tiny
    has_image = [first_has_image, not first_has_image, first_has_image]
    prompts = to_prompts(_rows(has_image), proc.tokenizer, DataConfig(), processor=proc)
    ro = sample_image_prompts(model, proc.tokenizer, prompts, max_new_tokens=5)
    batch = make_token_batch(ro, proc.tokenizer.pad_token_id)
    logp, _ = completion_logprobs(model, batch)
    for i, lps in enumerate(ro.sampling_logprobs):  # the prefill and the training pass saw the same inputs
        assert torch.allclose(logp[i, : len(lps)], torch.tensor(lps), atol=1e-4)
    # 2 image prompts x 2 samples (or 1 x 2) hold 16 image tokens each; the text rows none
    per_row = (batch.input_ids == model.config.image_token_id).sum(dim=1).tolist()
    assert per_row == [16 * h for h in has_image for _ in range(2)]


def test_trainer_step_on_a_jsonl_with_null_images_sends_the_images(tmp_path, monkeypatch):
    """The native CLI's path: a .jsonl whose first row has a null image; every forward that holds image
    tokens gets pixel values (before: none did, with the image tokens left in input_ids)."""
    import json

    from transformers import Qwen2VLForConditionalGeneration as C

    from grpokit.cli import main

    lines = []
    for i, r in enumerate(shapes.train_rows(4)):
        r["image"].save(tmp_path / f"img{i}.png")
        image = None if i % 2 == 0 else str(tmp_path / f"img{i}.png")
        lines.append(json.dumps({"prompt": MESSAGES, "image": image, "answer": r["answer"]}))
    (tmp_path / "data.jsonl").write_text("\n".join(lines))
    seen = spy_image_forwards(monkeypatch, C)
    rc = main(
        [
            "train",
            f"model.name_or_path={shapes.shapes_model_path()}",
            f"data.dataset={tmp_path / 'data.jsonl'}",
            "reward.functions=[count_accuracy]",
            "train.steps=1",
            "train.prompts_per_step=4",
            "rollout.group_size=2",
            "rollout.max_new_tokens=4",
            f"train.out={tmp_path / 'run'}",
            "record.report=false",
        ]
    )
    assert rc == 0
    with_tokens = [(t, n) for t, n in seen if t]
    # each image: 16 image tokens from 8x8 = 64 patches (before the 2x2 merge), so 4 patches per token
    assert with_tokens and all(n == 4 * t for t, n in with_tokens)
