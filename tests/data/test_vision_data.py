"""Image data from local folders, the shipped demo model's loader and the decode engines with images."""

from __future__ import annotations

import json

import pytest
import torch

from grpokit.config.sections import ConfigError, DataConfig
from grpokit.data import vision
from grpokit.data.prompts import load_rows, to_prompts
from grpokit.data.tasks import shapes
from helpers.vision_spy import sample_image_prompts


def _scene(x: int):
    return shapes.render([("red", "square", x, 2)])


def test_image_folder_with_metadata_loads_images_prompts_and_answers(tmp_path):
    for x in (2, 34):
        _scene(x).save(tmp_path / f"s{x}.png")
    with open(tmp_path / "metadata.jsonl", "w") as f:
        for x in (2, 34):
            f.write(
                json.dumps(
                    {"file_name": f"s{x}.png", "question": "where is the red square?", "box": f"[{x},2,{x + 12},14]"}
                )
                + "\n"
            )
    rows = load_rows(str(tmp_path), "train", DataConfig(prompt_column="question", answer_column="box"))
    assert sorted(r["answer"] for r in rows) == ["[2,2,14,14]", "[34,2,46,14]"]
    by_answer = {r["answer"]: r for r in rows}
    # the image column holds the very pixels saved: the square's left edge at x=34 is red there
    img = vision.row_images(by_answer["[34,2,46,14]"], 0)[0]
    assert img.getpixel((34, 5)) == shapes.COLOURS["red"] and img.getpixel((2, 5)) != shapes.COLOURS["red"]
    assert vision.has_images(rows)


def test_saved_dataset_folder_loads(tmp_path):
    import datasets

    datasets.Dataset.from_list([{"prompt": "a?", "answer": "1"}, {"prompt": "b?", "answer": "2"}]).save_to_disk(
        str(tmp_path / "ds")
    )
    rows = load_rows(str(tmp_path / "ds"), "train", DataConfig())
    assert [(r["prompt"], r["answer"]) for r in rows] == [("a?", "1"), ("b?", "2")]


def test_folder_without_data_is_one_sentence(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ConfigError, match="holds neither a saved dataset nor an image folder"):
        load_rows(str(tmp_path), "train", DataConfig())


def test_text_model_given_image_rows_is_one_sentence():
    from grpokit.data.tasks.demo_model import load_demo_model

    _, tok = load_demo_model()  # the text demo model: its folder has no image processor
    assert vision.load_processor(str(shapes.shapes_model_path().parent / "demo-model")) is None
    with pytest.raises(ConfigError, match="image column but the model has no image processor"):
        to_prompts(shapes.train_rows(2), tok, DataConfig(), processor=None)


def test_shipped_demo_model_loads_with_its_image_processor():
    model, proc = shapes.load_shapes_model()
    assert vision.is_processor(proc) and vision.is_vision_config(model.config)


def test_engines_with_image_prompts():
    from grpokit.rollout.hf import SamplingParams, generate

    model, proc = shapes.load_shapes_model()
    prompts = to_prompts(shapes.train_rows(2, seed=3), proc.tokenizer, DataConfig(), processor=proc)
    kw = dict(
        eos_token_ids={proc.tokenizer.eos_token_id},
        pad_token_id=proc.tokenizer.pad_token_id,
        vision=[p.vision for p in prompts],
    )
    runs = {
        e: generate(
            model.eval(),
            [p.ids for p in prompts],
            2,
            SamplingParams(max_new_tokens=5),
            generator=torch.Generator().manual_seed(0),
            engine=e,
            **kw,
        ).completion_ids
        for e in ("auto", "static", "dynamic")
    }
    # every engine takes image prompts (auto picks static: tests/project/test_vision_static.py) and samples alike
    assert runs["auto"] == runs["static"] == runs["dynamic"]


def test_hide_placeholders_by_hand():
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    out = vision.hide_placeholders(logits, [2])
    # softmax over (1, 2, -1e4): the hidden token gets exp(-1e4 - 2) = 0 in float32
    assert out[0, :2].tolist() == [1.0, 2.0] and torch.softmax(out, -1)[0, 2].item() == 0.0
    assert logits[0, 2].item() == 3.0  # the input is not changed in place
    assert vision.hide_placeholders(logits, []) is logits


def test_placeholder_tokens_are_never_sampled_and_training_agrees():
    from grpokit.train.logprobs import completion_logprobs
    from grpokit.train.token_batch import make_token_batch

    model, proc = shapes.load_shapes_model()
    model.eval()
    hidden = vision.placeholder_ids(model)
    assert hidden == [3, 4, 5, 6]  # vision_start, image_pad, vision_end, video_pad of the demo model
    # +30 on the image placeholder's logit makes it ~every sample's choice unless it is hidden; a
    # sampled placeholder broke the next forward (an image without pixels)
    hook = model.lm_head.register_forward_hook(
        lambda m, i, out: out.index_add(-1, torch.tensor([4]), torch.full_like(out[..., :1], 30.0))
    )
    try:
        prompts = to_prompts(shapes.train_rows(2, seed=7), proc.tokenizer, DataConfig(), processor=proc)
        ro = sample_image_prompts(model, proc.tokenizer, prompts, max_new_tokens=6)
        assert not any(t in hidden for c in ro.completion_ids for t in c)
        logp, _ = completion_logprobs(model, make_token_batch(ro, proc.tokenizer.pad_token_id))
        for i, lps in enumerate(ro.sampling_logprobs):
            assert torch.allclose(logp[i, : len(lps)], torch.tensor(lps), atol=1e-4)
    finally:
        hook.remove()


def test_degenerate_predicted_boxes_are_drawn_not_refused():
    from grpokit.record.vision_samples import draw_boxes

    # [5,5,5,9] has zero width: scaled by 4 its left edge is x=20 and its right edge 5*4-1=19 < 20, which
    # PIL refused (a demo run died on it); it is drawn as the vertical line x=20, y=20..35
    out = draw_boxes(shapes.render([]), [], [[5, 5, 5, 9], [9, 9, 3, 3]])
    assert out.getpixel((20, 20)) == (220, 30, 30) and out.getpixel((20, 35)) == (220, 30, 30)
    assert out.getpixel((12, 12)) == (220, 30, 30)  # the reversed box's corner (3*4, 3*4)


def test_processor_of_a_hub_name_loads_from_the_hub_cache(tmp_path):
    """TRL's VLM scripts name the model by hub id: without torchvision (transformers' Qwen2-VL video
    processor needs it) the image-only fallback must read that name's cached snapshot too."""
    import os
    import subprocess
    import sys

    from grpokit.data.tasks import shapes

    repo = tmp_path / "models--org--tiny-vl"
    snap = repo / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    for f in shapes.shapes_model_path().iterdir():
        (snap / f.name).symlink_to(f)
    code = "from grpokit.data.vision import load_processor; print(type(load_processor('org/tiny-vl')).__name__)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1"},
    )
    assert out.stdout.strip().splitlines()[-1] == "Qwen2VLProcessor", out.stderr[-500:]


def test_image_prompts_take_chat_template_kwargs_and_refuse_never():
    proc = vision.load_processor(str(shapes.shapes_model_path()))
    # the shipped processor's template, with a generation prompt that shows a keyword of chat_template_kwargs
    proc.chat_template = proc.chat_template.replace(
        "{% if add_generation_prompt %}={% endif %}",
        "{% if add_generation_prompt %}={% if brief %}how{% endif %}{% endif %}",
    )
    rows = [{"prompt": "how many shapes?", "image": _scene(2), "answer": "1"}]
    (p,) = to_prompts(rows, proc.tokenizer, DataConfig(chat_template_kwargs={"brief": True}), processor=proc)
    # a plain-text prompt: its image in front, then the text, then the generation prompt with the keyword's word
    # (before: the processor's template was called without the keywords, and the word was missing)
    assert p.text == "<|vision_start|><|image_pad|><|vision_end|>how many shapes?=how"
    (p,) = to_prompts(rows, proc.tokenizer, DataConfig(), processor=proc)
    assert p.text == "<|vision_start|><|image_pad|><|vision_end|>how many shapes?="
    # never: only the template writes where the image goes, so the setting cannot be honoured
    with pytest.raises(ConfigError, match=r"^data.chat_template=never but the data has images"):
        to_prompts(rows, proc.tokenizer, DataConfig(chat_template="never"), processor=proc)


def test_image_rows_with_their_own_system_message_refuse_data_system_prompt():
    proc = vision.load_processor(str(shapes.shapes_model_path()))
    own = [{"role": "system", "content": "be"}, {"role": "user", "content": "how many shapes?"}]
    rows = [{"prompt": own, "image": _scene(2), "answer": "1"}]
    with pytest.raises(ConfigError, match=r"^data.system_prompt is set but row 1 of the data carries a system message"):
        to_prompts(rows, proc.tokenizer, DataConfig(system_prompt="hi"), processor=proc)
    # the shipped template writes every message's text in order: the system's, the image, the question
    (p,) = to_prompts(rows, proc.tokenizer, DataConfig(), processor=proc)
    assert p.text == "be<|vision_start|><|image_pad|><|vision_end|>how many shapes?="
    with pytest.raises(ConfigError, match=r"^data.system_prompt is set but the prompt carries"):
        vision.vision_messages(own, 1, "hi")
