"""Build the tiny vision-language demo model shipped in grpokit/data/tasks/assets/shapes-vl-model.

Qwen2-VL's architecture (transformers' Qwen2VLForConditionalGeneration, loaded back through the
generic AutoModelForImageTextToText / AutoProcessor) at toy size: a 2-block vision tower on 8 px
patches (a 64x64 image is 16 tokens after the 2x2 merge) and a 2-layer, 64-wide language model over
a character vocabulary. It is pre-warmed with a short supervised pass on the ``shapes`` task so it
starts weak but not at zero (the GRPO demo then has rewards to compare). No hub access.

    python scripts/make_vision_demo_model.py [--out DIR] [--steps 2000] [--target 0.3] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch

from grpokit.data.tasks import chartok
from grpokit.data.tasks import shapes
from grpokit.data.vision import encode_prompt, forward_kwargs, image_only

VISION_TOKENS = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>")
ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789[](),.?= "
# The chat template: image parts become Qwen2-VL's placeholder triple, "=" opens the answer.
TEMPLATE = ("{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}{% for c in m.content %}"
            "{% if c.type == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ c.text }}{% endif %}"
            "{% endfor %}{% endif %}{% endfor %}{% if add_generation_prompt %}={% endif %}")


def build_processor():
    from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor

    tok = chartok.build_char_tokenizer(ALPHABET, VISION_TOKENS, model_max_length=256)
    tok.chat_template = TEMPLATE
    side = shapes.CANVAS * shapes.CANVAS
    ip = Qwen2VLImageProcessor(patch_size=8, merge_size=2, temporal_patch_size=2,
                               size={"shortest_edge": side, "longest_edge": side})
    return image_only(Qwen2VLProcessor)(image_processor=ip, tokenizer=tok, chat_template=TEMPLATE)


def build_model(tok, seed: int):
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    torch.manual_seed(seed)
    ids = {t: tok.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    config = Qwen2VLConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
                         tie_word_embeddings=True, bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id),
        vision_config=dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=8,
                           spatial_merge_size=2, temporal_patch_size=2),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True, bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
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
        ids[i, L - len(s):], mask[i, L - len(s):] = torch.tensor(s), 1
    extra = forward_kwargs(model, ids, mask, vis)
    logits = model(input_ids=ids, attention_mask=mask, **extra).logits[:, :-1]
    target = ids[:, 1:]
    keep = torch.zeros_like(target, dtype=torch.bool)
    for i, n in enumerate(lens):
        keep[i, L - 1 - n:] = True
    return torch.nn.functional.cross_entropy(logits[keep], target[keep])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(shapes.shapes_model_path()))
    ap.add_argument("--steps", type=int, default=2000, help="at most this many steps (the seed-0 run stops at 600 on --target)")
    ap.add_argument("--target", type=float, default=0.3, help="stop pre-warming once held-out reward reaches this")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    proc = build_processor()
    model = build_model(proc.tokenizer, args.seed)
    # The vision tower learns 10x slower: at the language model's rate its features collapsed to one
    # large constant vector (measured: every image gave the same tokens), and the model ignored them.
    tower = [p for n, p in model.named_parameters() if ".visual." in f".{n}"]
    rest = [p for n, p in model.named_parameters() if ".visual." not in f".{n}"]
    opt = torch.optim.AdamW([{"params": rest, "lr": 3e-3}, {"params": tower, "lr": 3e-4}])
    rows = shapes.train_rows(args.steps * 32, seed=args.seed + 99)  # a seed the GRPO demo does not use
    held = shapes.held_out_rows(60, seed=4321)
    t0, score = time.time(), 0.0
    random.seed(args.seed)
    for step in range(args.steps):
        model.train()
        loss = sft_loss(model, proc, rows[step * 32:(step + 1) * 32])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 25 == 24:
            model.eval()
            score = shapes.evaluate_shapes(model, proc, held)["reward"]
            print(json.dumps({"step": step + 1, "loss": round(loss.item(), 3), "held_out_reward": round(score, 3),
                              "s": round(time.time() - t0, 1)}), flush=True)
            if score >= args.target:
                break
    model.save_pretrained(args.out)
    proc.save_pretrained(args.out)
    chartok.save_char_tokenizer(proc.tokenizer, args.out)
    print(json.dumps({"saved": args.out, "held_out_reward": score, "parameters": sum(p.numel() for p in model.parameters())}))


if __name__ == "__main__":
    main()
