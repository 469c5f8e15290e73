"""Vision-language GRPO: grounding rewards, image data, the shapes task and the tiny Qwen2-VL path."""

from __future__ import annotations

import io

import pytest
import torch

from grpokit.config.sections import ConfigError, DataConfig, ModelConfig
from grpokit.data import vision
from grpokit.data.prompts import to_prompts
from grpokit.data.tasks import shapes
from grpokit.rewards import grounding as g
from helpers.vision_spy import sample_image_prompts

# ---------------------------------------------------------------- rewards (hand-worked)


def test_box_iou_hand_cases():
    # (0,0,2,2) vs (1,1,3,3): intersection 1x1 = 1, union 4 + 4 - 1 = 7
    assert g.box_iou((0, 0, 2, 2), (1, 1, 3, 3)) == pytest.approx(1 / 7)
    assert g.box_iou((0, 0, 2, 2), (2, 2, 0, 0)) == 1.0  # corners in either order
    assert g.box_iou((0, 0, 1, 1), (5, 5, 6, 6)) == 0.0
    assert g.box_iou((0, 0, 0, 0), (0, 0, 0, 0)) == 0.0  # empty union: 0, not a division error


def test_box_parsing_both_forms():
    assert g.parse_boxes("it is [8, 16, 20, 28].") == [(8, 16, 20, 28)]
    assert g.parse_boxes("<|box_start|>(8,16),(20,28)<|box_end|>") == [(8, 16, 20, 28)]
    assert g.parse_boxes("no box here") == []


def test_box_reward_is_hedge_proof_and_counts_missing_boxes():
    logged = {}
    comps = ["[0,0,2,2]", "[0,0,2,2] or [1,1,3,3]", "somewhere left", "<answer>[1,1,3,3]</answer>"]
    out = g.box_iou_reward(
        None,
        comps,
        ["[0,0,2,2]", "[0,0,2,2]", "[0,0,2,2]", "[0,0,2,2]"],
        log_metric=lambda k, v: logged.setdefault(k, v),
    )
    # exact: 1; two boxes: 0 (hedge); no box: 0; tagged box (1,1,3,3): 1/7
    assert out == pytest.approx([1.0, 0.0, 0.0, 1 / 7])
    assert logged == {"rewards/no_box_fraction": 0.25}  # one of four had no box


def test_vqa_count_and_choice_rewards():
    assert g.vqa_accuracy(None, ["The Red.", "blue", ""], ["red", ["navy", "Blue"], "x"]) == [1.0, 1.0, 0.0]
    assert g.count_reward(None, ["3", "3 or 4", "three"], ["3", "3", "3"]) == [1.0, 0.0, 0.0]
    assert g.choice_accuracy(None, ["(B)", "A or B", "answer: C"], ["B", "B", "(C)"]) == [1.0, 0.0, 1.0]
    assert g.box_format(None, ["[1,2,3,4]", "[1,2,3,4][1,2,3,4]", "none"]) == [1.0, 0.0, 0.0]


def test_a_blank_or_placeholder_answer_tag_in_the_reasoning_is_not_a_second_answer():
    # Before, two tags made the whole text the answer: "I" of "I'll" and B were two letters (0), and
    # "format: answer here cat" was not "cat" (0). The tag holding no answer is dropped first now; two real
    # tags (A, then B) still leave two letters: a hedge, 0.
    choice = [
        "I'll wrap it as <answer></answer>.\n<answer>B</answer>",
        "<answer>...</answer> <answer>A</answer> <answer>B</answer>",
    ]
    assert g.choice_accuracy(None, choice, ["B", "B"]) == [1.0, 0.0]
    vqa = "<think>format: <answer> answer here </answer></think><answer>cat</answer>"
    assert g.vqa_accuracy(None, [vqa], ["cat"]) == [1.0]


def test_an_answer_tag_left_empty_is_no_answer_not_the_reasoning():
    # Before, the blank tag was dropped and the whole reasoning was read: "B" in it scored 1.0, "cat" too.
    assert g.choice_accuracy(None, ["The picture shows B.\n<answer></answer>"], ["B"]) == [0.0]
    assert g.vqa_accuracy(None, ["cat\n<answer> answer here </answer>"], ["cat"]) == [0.0]
    assert g.box_iou_reward(None, ["[1,2,3,4] <answer>...</answer>"], ["[1,2,3,4]"]) == [0.0]
    assert g.vqa_accuracy(None, ["cat"], ["cat"]) == [1.0]  # no tag at all: the whole text, as before


def test_a_blank_box_in_the_reasoning_leaves_a_real_box_the_answer():
    # the one rule of answers.left_empty: the slot is empty only when no real tag or box is left. Before, the
    # vision verifiers had their own copy, which dropped "put it in \\boxed{}" and then read nothing, though a
    # real box followed (0.0, against their docstring's "when every tag and box is such")
    assert g.choice_accuracy(None, ["Put the letter in \\boxed{}.\n\\boxed{B}"], ["B"]) == [1.0]
    assert g.choice_accuracy(None, ["The picture shows B.\n\\boxed{}"], ["B"]) == [0.0]  # every box blank: none


# ---------------------------------------------------------------- the shapes task


def test_shapes_rows_are_deterministic_disjoint_and_gold_scores_one():
    a, b = shapes.train_rows(30, seed=3), shapes.train_rows(30, seed=3)
    assert [r["answer"] for r in a] == [r["answer"] for r in b]
    assert {r["kind"] for r in a} == {"box", "count"}
    held = shapes.held_out_rows(20)
    assert all(shapes.is_held_out(r["scene"]) for r in held)
    assert not any(shapes.is_held_out(r["scene"]) for r in shapes.train_rows(300))
    rewards = shapes.shapes_reward(None, [r["answer"] for r in a], [r["answer"] for r in a], [r["kind"] for r in a])
    assert rewards == [1.0] * 30


def test_shapes_box_answer_matches_drawn_pixels():
    row = next(r for r in shapes.train_rows(20, seed=1) if r["kind"] == "box")
    x1, y1, x2, y2 = g.parse_boxes(row["answer"])[0]
    # the red square is SIDE px wide, so the box spans SIDE px and its corner pixel is red
    assert (x2 - x1, y2 - y1) == (shapes.SIDE, shapes.SIDE)
    assert row["image"].getpixel((int(x1), int(y1))) == shapes.COLOURS["red"]
    assert row["image"].getpixel((int(x2) - 1, int(y2) - 1)) == shapes.COLOURS["red"]


# ---------------------------------------------------------------- bad input, one sentence each


def test_missing_and_unreadable_images_name_row_and_path(tmp_path):
    with pytest.raises(ConfigError, match=r"row 3: image '.*nope.png' does not exist"):
        vision.load_image(str(tmp_path / "nope.png"), 3)
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image")
    with pytest.raises(ConfigError, match=r"row 0: image '.*bad.png' could not be read"):
        vision.load_image(str(bad), 0)
    with pytest.raises(ConfigError, match="row 1: image its bytes could not be read"):
        vision.load_image(b"\x00\x01", 1)


def test_image_formats_load_alike(tmp_path):
    img = shapes.render([("red", "square", 8, 8)])
    path = tmp_path / "a.png"
    img.save(path)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    for value in (img, str(path), buf.getvalue(), {"bytes": buf.getvalue(), "path": None}):
        assert vision.load_image(value, 0).tobytes() == img.tobytes()
    assert len(vision.row_images({"images": [img, str(path)]}, 0)) == 2


def test_image_rows_without_processor_get_one_sentence():
    rows = shapes.train_rows(2)
    with pytest.raises(ConfigError, match="image column but the model has no image processor"):
        to_prompts(rows, tokenizer=None, cfg=DataConfig())


# ---------------------------------------------------------------- the tiny Qwen2-VL


@pytest.fixture(scope="module")
def tiny():
    from transformers import AutoModelForImageTextToText

    path = str(shapes.shapes_model_path())
    torch.manual_seed(0)
    return AutoModelForImageTextToText.from_pretrained(path).eval(), vision.load_processor(path)


def test_processor_prompt_expands_the_image(tiny):
    model, proc = tiny
    [p] = to_prompts(shapes.train_rows(1), proc.tokenizer, DataConfig(), processor=proc)
    img_id = model.config.image_token_id
    # 64x64 image, 8 px patches -> 8x8 grid, 2x2 merge -> 16 image tokens
    assert p.ids.count(img_id) == 16
    assert p.vision["image_grid_thw"].tolist() == [[1, 8, 8]]
    assert p.text.endswith("?=")


def test_sampling_and_training_logprobs_agree_and_images_matter(tiny):
    from grpokit.train.logprobs import completion_logprobs
    from grpokit.train.token_batch import make_token_batch

    model, proc = tiny
    prompts = to_prompts(shapes.train_rows(3, seed=5), proc.tokenizer, DataConfig(), processor=proc)
    ro = sample_image_prompts(model, proc.tokenizer, prompts, max_new_tokens=6)
    assert len(ro.vision) == 6 and ro.vision[1] is ro.vision[0]  # G rows share their prompt's images
    batch = make_token_batch(ro, proc.tokenizer.pad_token_id)
    logp, _ = completion_logprobs(model, batch)
    for i, lps in enumerate(ro.sampling_logprobs):  # same positions, same images: same distribution
        assert torch.allclose(logp[i, : len(lps)], torch.tensor(lps), atol=1e-4)
    # Image tokens never enter the loss: token by token, every image placeholder is a prompt token
    # (left of the completion columns) and the completion columns hold none of them.
    img_id, T = model.config.image_token_id, batch.width
    assert not (batch.completion_ids == img_id).any()
    cols = (batch.input_ids == img_id).nonzero()[:, 1]
    assert cols.numel() == 6 * 16 and int(cols.max()) < batch.input_ids.shape[1] - T
    # and the images reach the log-probability pass: a blank image changes them
    blank = [{**v, "pixel_values": torch.zeros_like(v["pixel_values"])} for v in batch.vision]
    other, _ = completion_logprobs(
        model,
        type(batch)(
            *(
                getattr(batch, f)
                for f in ("input_ids", "attention_mask", "position_ids", "completion_ids", "completion_mask")
            ),
            vision=blank,
        ),
    )
    assert not torch.allclose(other * batch.completion_mask, logp * batch.completion_mask)


def test_micro_batch_rows_carry_their_images(tiny):
    from grpokit.types import TokenBatch

    b = TokenBatch(*(torch.zeros(4, 3) for _ in range(5)), vision=["a", "b", "c", "d"])
    assert b.rows(slice(1, 3)).vision == ["b", "c"]


@pytest.mark.parametrize("freeze", [True, False])
def test_vision_tower_frozen_by_default_trainable_when_asked(freeze):
    from grpokit.train.models import load_model, vision_parameters

    m = load_model(
        ModelConfig(name_or_path=str(shapes.shapes_model_path()), freeze_vision=freeze),
        torch.device("cpu"),
        torch.float32,
    )
    tower = vision_parameters(m)
    assert tower and all(p.requires_grad is not freeze for p in tower)
    lm = [p for n, p in m.named_parameters() if "language_model" in n]
    assert lm and all(p.requires_grad for p in lm)


def test_lora_adapters_sit_on_the_language_model_only():
    from grpokit.train.models import load_model

    m = load_model(
        ModelConfig(name_or_path=str(shapes.shapes_model_path()), lora_rank=2), torch.device("cpu"), torch.float32
    )
    trained = [n for n, p in m.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n and "language_model" in n for n in trained)
    assert any("q_proj" in n for n in trained) and not any("visual" in n for n in trained)
    # [all-linear, lm_head]: the language model's linear layers and the head; the vision tower still none
    cfg = ModelConfig(
        name_or_path=str(shapes.shapes_model_path()), lora_rank=2, lora_target_modules=["all-linear", "lm_head"]
    )
    m = load_model(cfg, torch.device("cpu"), torch.float32)
    adapted = {n.split(".lora_")[0] for n, p in m.named_parameters() if p.requires_grad}
    assert {a for a in adapted if "language_model" not in a} == {"base_model.model.lm_head"}
    assert len(adapted) == len(trained) // 2 + 1  # each layer's A and B before, one more layer now


def test_lora_all_linear_with_the_tower_trained_is_pefts_all_linear():
    """model.freeze_vision=false: all-linear is PEFT's own meaning, the vision tower's linear layers
    included (TRL's; the TRL layer sets it). The oracle: peft's get_peft_model on the same model."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    from grpokit.train.models import load_model

    path = str(shapes.shapes_model_path())
    ours = load_model(
        ModelConfig(name_or_path=path, lora_rank=2, freeze_vision=False), torch.device("cpu"), torch.float32
    )
    peft = get_peft_model(
        AutoModelForImageTextToText.from_pretrained(path), LoraConfig(r=2, target_modules="all-linear")
    )
    adapted = lambda m: sorted(n for n, _ in m.named_modules() if n.endswith("lora_A"))  # noqa: E731
    # 2 decoder layers x 7 projections = 14 in the language model; 2 tower blocks x (qkv, proj, fc1, fc2)
    # + the merger's 2 mlp layers = 10 in the tower
    assert adapted(ours) == adapted(peft) and len(adapted(ours)) == 24
    assert sum("visual" in n for n in adapted(ours)) == 10


@pytest.mark.parametrize("tool_format", ["tags", "chat_template"])
def test_tools_with_image_prompts_are_one_sentence(tmp_path, tool_format, monkeypatch):
    from grpokit.config.io import apply_overrides
    from grpokit.config.sections import Config
    from grpokit.train import run_data
    from grpokit.train.loop import Trainer

    # the vLLM backends take images now (tests/project/test_vision_vllm.py); multi-turn episodes do not. Tag-format
    # tools put no schema in the prompt, so the refusal cannot be the processor's: the run's own check says it
    monkeypatch.setattr(run_data, "TASK_TRAIN_ROWS", 4)
    cfg = apply_overrides(
        Config(),
        [
            "data.task=shapes",
            "env.tools=[calculator]",
            f"env.tool_format={tool_format}",
            "record.report=false",
            f"train.out={tmp_path}",
        ],
    )
    with pytest.raises(ConfigError, match="tools and environments with image prompts are not supported yet"):
        Trainer(cfg, quiet=True)


def test_vision_rewards_are_builtins_by_name():
    from grpokit.rewards.spec import resolve_reward

    assert resolve_reward("box_iou")(None, ["[0,0,2,2]"], ["[0,0,2,2]"]) == [1.0]


def test_sample_rows_get_pngs_with_boxes_drawn(tmp_path):
    from PIL import Image

    from grpokit.record.vision_samples import with_images
    from grpokit.types import Prompt

    row = next(r for r in shapes.train_rows(10) if r["kind"] == "box")
    prompts = [Prompt("t", [1], columns={k: v for k, v in row.items() if k != "prompt"}), Prompt("text only", [1])]
    rows = [
        {"prompt": "t", "completions": [{"text": "[2,2,14,14]"}, {"text": "no box"}]},
        {"prompt": "text only", "completions": [{"text": "x"}]},
    ]
    out = with_images(rows, prompts, tmp_path, 3)
    assert out[0]["image"] == "images/step000003_p0.png" and "image" not in out[1]
    assert [c["box"] for c in out[0]["completions"]] == [[2.0, 2.0, 14.0, 14.0], None]
    png = Image.open(tmp_path / out[0]["image"])
    assert png.size == (256, 256)  # 64 px scaled by 4
    assert png.getpixel((2 * 4, 8 * 4)) == (220, 30, 30)  # the predicted box's left edge, in red


@pytest.mark.parametrize("images", [True, False])
def test_trainer_runs_the_shapes_task_and_draws_sample_images(tmp_path, images):
    """record.samples_images (TRL's log_multimodal): the samples' images, or text only."""
    import json

    from grpokit.config.io import apply_overrides
    from grpokit.config.sections import Config
    from grpokit.train.loop import Trainer

    cfg = apply_overrides(
        Config(),
        [
            f"record.samples_images={str(images).lower()}",
            "data.task=shapes",
            "train.steps=1",
            "train.prompts_per_step=2",
            "rollout.group_size=2",
            "data.eval_size=4",
            "record.samples_every=1",
            "record.report=false",
            f"train.out={tmp_path}",
            "algo.beta=0.04",
        ],
    )  # beta > 0: the reference pass sees the images too
    summary = Trainer(cfg, quiet=True).train()
    assert summary["steps"] == 1 and 0.0 <= summary["eval_after"]["reward"] <= 1.0
    assert bool(list((tmp_path / "images").glob("step000001_p*.png"))) is images
    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(("image" in r) is images for r in rows)  # the PNG's path, or none


def _image_folder(tmp_path):
    """A local image folder in `datasets`' layout: PNGs plus metadata.jsonl naming them (file_name)."""
    import json

    folder = tmp_path / "scenes"
    folder.mkdir()
    meta = []
    for i, r in enumerate(r for r in shapes.train_rows(12, seed=7) if r["kind"] == "box"):
        r["image"].save(folder / f"s{i}.png")
        meta.append({"file_name": f"s{i}.png", "prompt": shapes.BOX_QUESTION, "answer": r["answer"]})
    (folder / "metadata.jsonl").write_text("".join(json.dumps(m) + "\n" for m in meta))
    return folder


def test_local_image_folder_trains_a_step_on_the_vision_model(tmp_path):
    from grpokit.config.io import apply_overrides
    from grpokit.config.sections import Config
    from grpokit.data.prompts import load_rows
    from grpokit.train.loop import Trainer

    folder = _image_folder(tmp_path)
    rows = load_rows(str(folder), "train", DataConfig())
    assert rows[0]["image"].size == (64, 64) and rows[0]["prompt"] == shapes.BOX_QUESTION  # datasets decoded the PNG
    cfg = apply_overrides(
        Config(),
        [
            f"data.dataset={folder}",
            f"model.name_or_path={shapes.shapes_model_path()}",
            "reward.functions=[box_iou]",
            "train.steps=1",
            "train.prompts_per_step=2",
            "rollout.group_size=2",
            "rollout.max_new_tokens=4",
            "record.report=false",
            f"train.out={tmp_path / 'run'}",
            "train.save_every=0",
        ],
    )
    assert Trainer(cfg, quiet=True).train()["steps"] == 1
