"""Build the shipped demo checkpoint: char tokenizer + tiny Llama, warmed up on a noisy teacher.

    PYTHONPATH=src python scripts/make_demo_model.py            # writes src/grpokit/data/tasks/assets/demo-model/

Steps (all seeded, one CPU thread, so the same machine gives the same bytes):
1. build the character tokenizer (grpokit.data.tasks.chartok);
2. build a randomly initialised ``LlamaForCausalLM`` (hidden 64, 4 layers, 4 heads: 0.26 M parameters, ~1 MB);
3. supervised warm-up: each step draws a batch of *training-split* pairs and one demonstration per
   pair from the forgetful teacher (grpokit.data.tasks.demo_model: drops all carries with probability
   SLIP_PROB), and minimises cross-entropy on the completion tokens only (the prompt is given);
4. save model (safetensors) + tokenizer, then print held-out greedy and sampled accuracy.

The held-out pairs are never used for training; they only appear in the final report.
"""

from __future__ import annotations

import argparse
import math
import random
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from grpokit.data.tasks.arithmetic import format_prompt, held_out_rows, train_pairs
from grpokit.data.tasks.chartok import build_char_tokenizer, save_char_tokenizer
from grpokit.data.tasks.demo_model import DEMO_MODEL_DIR, SLIP_PROB, teacher_completion
from grpokit.data.tasks.evaluate import evaluate_accuracy


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=DEMO_MODEL_DIR, help="output folder")
    p.add_argument("--steps", type=int, default=1500, help="warm-up optimizer steps")
    p.add_argument("--batch-size", type=int, default=256, help="demonstrations per step")
    p.add_argument("--lr", type=float, default=5e-3, help="peak AdamW learning rate (cosine decay)")
    p.add_argument("--hidden", type=int, default=64, help="hidden size")
    p.add_argument("--layers", type=int, default=4, help="transformer blocks")
    p.add_argument("--heads", type=int, default=4, help="attention heads")
    p.add_argument("--slip-prob", type=float, default=SLIP_PROB, help="teacher's carry-dropping rate")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def build_model(vocab_size: int, eos_id: int, pad_id: int, args: argparse.Namespace) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    return LlamaForCausalLM(config)


def make_batch(tokenizer, pairs, rng: random.Random, batch_size: int, slip_prob: float):
    """input_ids / attention_mask / labels for one batch; labels are -100 on prompt and padding."""
    chosen = [pairs[rng.randrange(len(pairs))] for _ in range(batch_size)]
    prompts = [format_prompt(a, b) for a, b in chosen]
    completions = [teacher_completion(a, b, rng, slip_prob) + tokenizer.eos_token for a, b in chosen]
    enc = tokenizer(
        [p + c for p, c in zip(prompts, completions)], return_tensors="pt", padding=True, padding_side="right"
    )
    labels = enc["input_ids"].clone()  # (B, T)
    labels[enc["attention_mask"] == 0] = -100
    labels[:, : len(prompts[0])] = -100  # every prompt has the same 6 characters, one id each
    return enc["input_ids"], enc["attention_mask"], labels


def sampled_accuracy(model, tokenizer, rows, samples: int = 8) -> float:
    """Mean reward of temperature-1 samples: the per-prompt success rate GRPO starts from."""
    from grpokit.data.tasks.arithmetic import arithmetic_accuracy

    model.eval()
    enc = tokenizer([r["prompt"] for r in rows], return_tensors="pt", padding=True)
    with torch.inference_mode():
        out = model.generate(
            **enc,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=8,
            num_return_sequences=samples,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    answers = [r["answer"] for r in rows for _ in range(samples)]
    return sum(arithmetic_accuracy(None, texts, answers)) / len(texts)


def warm_up(model, next_batch, steps: int, lr: float) -> None:
    """Supervised warm-up shared by the demo models' scripts: AdamW, linear warm-up then cosine
    decay, gradient clipping at 1; ``next_batch()`` gives (input_ids, attention_mask, labels)."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    )
    model.train()
    t0 = time.time()
    for step in range(steps):
        input_ids, attention_mask, labels = next_batch()
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"step {step:5d}  loss {loss.item():.4f}  {time.time() - t0:6.1f}s", flush=True)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)

    tokenizer = build_char_tokenizer()
    model = build_model(len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id, args)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.3f} M parameters")

    pairs = train_pairs()
    warm_up(model, lambda: make_batch(tokenizer, pairs, rng, args.batch_size, args.slip_prob), args.steps, args.lr)

    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    # A fresh copy: the training loop's padding calls leave state on `tokenizer` that would be saved.
    save_char_tokenizer(build_char_tokenizer(), args.out)
    print(f"saved to {args.out}")

    rows = held_out_rows()
    greedy = evaluate_accuracy(model, tokenizer, rows)
    torch.manual_seed(args.seed)
    sampled = sampled_accuracy(model, tokenizer, rows)
    print(
        f"held-out ({greedy['n']} rows): greedy accuracy {greedy['accuracy']:.3f}, "
        f"mean length {greedy['mean_length']:.2f}, sampled accuracy (T=1, 8/prompt) {sampled:.3f}"
    )


if __name__ == "__main__":
    main()
