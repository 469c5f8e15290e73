"""Build the tiny vision-language demo model shipped in grpokit/data/tasks/assets/shapes-vl-model.

Qwen2-VL's architecture (transformers' Qwen2VLForConditionalGeneration, loaded back through the
generic AutoModelForImageTextToText / AutoProcessor) at toy size: a 2-block vision tower on 8 px
patches (a 64x64 image is 16 tokens after the 2x2 merge) and a 2-layer, 64-wide language model over
a character vocabulary. It is pre-warmed by a supervised pass on the ``shapes`` task so that it
starts weak but not at zero on both questions (the GRPO demo then has rewards to compare). No hub access.

Two phases, each stopped by a held-out score (every 25 steps), so neither question starts saturated:

1. both questions, mixed as drawn, until the held-out reward reaches ``--target`` (0.3; seed 0: step
   600). The model has then learnt to read the image (counting ~70%), but not the box (IoU ~0.04,
   chance is 1/16 cells);
2. box rows only (``--count-share`` count rows of each 32: 0) until the box question's held-out mean
   IoU reaches ``--box-target`` (0.2; seed 0: step 250). Counting is left to fade (~20%, some of its
   answers in the box's form), so GRPO has both questions to learn: with 4 count rows per batch
   counting started at 28-60% and GRPO spent the run on it (1.0) while the box barely moved
   (0.22 -> 0.27; docs/VISION.md).

    python scripts/make_vision_demo_model.py [--out DIR] [--target 0.3] [--box-target 0.2] [--seed 0]

Seeded and deterministic (one CPU thread); ``--from DIR`` runs phase 2 alone from a saved model.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import time

import torch

from grpokit.data.tasks import chartok, shapes
from grpokit.data.vision import encode_prompt, forward_kwargs, image_only
from grpokit.train.task_evaluation import evaluate_shapes

VISION_TOKENS = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>")
ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789[](),.?= "
# The chat template: image parts become Qwen2-VL's placeholder triple, "=" opens the answer.
TEMPLATE = (
    "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}{% for c in m.content %}"
    "{% if c.type == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ c.text }}{% endif %}"
    "{% endfor %}{% endif %}{% endfor %}{% if add_generation_prompt %}={% endif %}"
)


def build_processor():
    from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor

    tok = chartok.build_char_tokenizer(ALPHABET, VISION_TOKENS, model_max_length=256)
    tok.chat_template = TEMPLATE
    side = shapes.CANVAS * shapes.CANVAS
    ip = Qwen2VLImageProcessor(
        patch_size=8, merge_size=2, temporal_patch_size=2, size={"shortest_edge": side, "longest_edge": side}
    )
    return image_only(Qwen2VLProcessor)(image_processor=ip, tokenizer=tok, chat_template=TEMPLATE)


def build_model(tok, seed: int):
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    torch.manual_seed(seed)
    ids = {t: tok.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    config = Qwen2VLConfig(
        text_config=dict(
            vocab_size=len(tok),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
            tie_word_embeddings=True,
            bos_token_id=None,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        ),
        vision_config=dict(
            depth=2,
            embed_dim=32,
            hidden_size=64,
            num_heads=2,
            mlp_ratio=2,
            patch_size=8,
            spatial_merge_size=2,
            temporal_patch_size=2,
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = Qwen2VLForConditionalGeneration(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return model


def sft_loss(model, proc, rows):
    """Teacher-forced cross-entropy on the answer tokens (+ EOS) of a batch of rows."""
    tok = proc.tokenizer
    seqs, vis, lens = [], [], []
    for i, r in enumerate(rows):
        _, ids, v = encode_prompt(r, i, proc)
        ans = tok(r["answer"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        seqs.append(ids + ans), vis.append(v), lens.append(len(ans))
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), tok.pad_token_id)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):  # left padding, as in the rollout
        ids[i, L - len(s) :], mask[i, L - len(s) :] = torch.tensor(s), 1
    extra = forward_kwargs(model, ids, mask, vis)
    logits = model(input_ids=ids, attention_mask=mask, **extra).logits[:, :-1]
    target = ids[:, 1:]
    keep = torch.zeros_like(target, dtype=torch.bool)
    for i, n in enumerate(lens):
        keep[i, L - 1 - n :] = True
    return torch.nn.functional.cross_entropy(logits[keep], target[keep])


def _mix(boxes, counts, count_rows: int):
    """Batches of ``32 - count_rows`` box rows then ``count_rows`` count rows, endlessly."""
    while True:
        yield from itertools.islice(boxes, 32 - count_rows)
        yield from itertools.islice(counts, count_rows)


def _save(model, proc, out: str) -> None:
    model.save_pretrained(out)
    proc.save_pretrained(out)
    chartok.save_char_tokenizer(proc.tokenizer, out)


def _optimizer(model):
    # The vision tower learns 10x slower: at the language model's rate its features collapsed to one
    # large constant vector (measured: every image gave the same tokens), and the model ignored them.
    tower = [p for n, p in model.named_parameters() if ".visual." in f".{n}"]
    rest = [p for n, p in model.named_parameters() if ".visual." not in f".{n}"]
    return torch.optim.AdamW([{"params": rest, "lr": 3e-3}, {"params": tower, "lr": 3e-4}])


def _train(
    model, proc, rows, steps: int, held, stop, phase: int, clock: tuple[float, float], snapshots: str = ""
) -> dict:
    """Supervised steps of 32 rows from ``rows`` until ``stop(scores)`` at an evaluation (every 25)."""
    opt, scores = _optimizer(model), {}
    for step in range(steps):
        model.train()
        loss = sft_loss(model, proc, list(itertools.islice(rows, 32)))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 25 == 24:
            model.eval()
            scores = evaluate_shapes(model, proc, held)
            print(
                json.dumps(
                    {
                        "phase": phase,
                        "step": step + 1,
                        "loss": round(loss.item(), 3),
                        "reward": round(scores["reward"], 3),
                        "box_iou": round(scores["box_iou"], 3),
                        "count_accuracy": round(scores["count_accuracy"], 3),
                        "s": round(time.time() - clock[0]),
                        "cpu_s": round(time.process_time() - clock[1]),
                    }
                ),
                flush=True,
            )
            if snapshots:
                _save(model, proc, f"{snapshots}/step_{step + 1}")
            if stop(scores):
                break
    return scores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(shapes.shapes_model_path()))
    ap.add_argument("--steps", type=int, default=2000, help="at most this many steps per phase")
    ap.add_argument(
        "--target", type=float, default=0.3, help="phase 1 (both questions) stops once held-out reward reaches this"
    )
    ap.add_argument(
        "--box-target",
        type=float,
        default=0.2,
        help="phase 2 (box rows) stops once the box question's held-out mean IoU reaches this",
    )
    ap.add_argument("--count-share", type=int, default=0, help="count rows in each phase-2 batch of 32")
    ap.add_argument("--from", dest="start", default="", help="skip phase 1: start phase 2 from this saved model")
    ap.add_argument(
        "--snapshots",
        default="",
        help="save phase 2's model at every evaluation into DIR/step_N (to choose --box-target)",
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    random.seed(args.seed)
    clock = (time.time(), time.process_time())
    if args.start:
        model, proc = shapes.load_shapes_model(args.start)
    else:
        proc = build_processor()
        model = build_model(proc.tokenizer, args.seed)
        rows = shapes.iter_rows(args.seed + 99)  # a seed the GRPO demo does not use
        _train(
            model,
            proc,
            rows,
            args.steps,
            shapes.held_out_rows(60, seed=4321),
            lambda s: s["reward"] >= args.target,
            1,
            clock,
        )
    # Phase 2 (see the module docstring): the box question gets its own supervision and target.
    boxes = (r for r in shapes.iter_rows(args.seed + 199) if r["kind"] == "box")
    counts = (r for r in shapes.iter_rows(args.seed + 299) if r["kind"] == "count")
    rows = _mix(boxes, counts, args.count_share)
    held = shapes.held_out_rows(200, seed=4321)
    scores = _train(
        model, proc, rows, args.steps, held, lambda s: s["box_iou"] >= args.box_target, 2, clock, args.snapshots
    )
    _save(model, proc, args.out)
    print(
        json.dumps(
            {
                "saved": args.out,
                "box_iou": scores.get("box_iou"),
                "s": round(time.time() - clock[0]),
                "parameters": sum(p.numel() for p in model.parameters()),
            }
        )
    )


if __name__ == "__main__":
    main()
