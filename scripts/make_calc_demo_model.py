"""Build the calculator task's checkpoint: char tokenizer with tool tags + tiny Llama, warmed up.

    PYTHONPATH=src python scripts/make_calc_demo_model.py       # writes src/grpokit/data/tasks/assets/calc-demo-model/

Same recipe as scripts/make_demo_model.py (seeded, one CPU thread, a randomly initialised Llama of
hidden 64, 4 layers, 4 heads), on demonstrations of *training-split* multiplications from the
calculator task's teacher (grpokit.data.tasks.calculator.teacher_episode): a calculator call with its
result and the answer with probability TOOL_PROB, else an estimate from memory. The loss is on the
model's tokens only: the tool result is the environment's, in the context but not a target (the
same mask GRPO training uses). Prints held-out greedy accuracy and tool-use rate, and the sampled
tool-use rate at temperature 1, measured with grpokit's own episode loop.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from grpokit.data.tasks.calculator import CALC_MODEL_DIR, TAGS, TOOL_PROB, format_prompt, teacher_episode, train_pairs
from grpokit.data.tasks.chartok import ALPHABET, build_char_tokenizer, save_char_tokenizer
from make_demo_model import warm_up  # scripts/: the shared warm-up loop


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=CALC_MODEL_DIR)
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--tool-prob", type=float, default=TOOL_PROB)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def make_batch(tokenizer, pairs, rng: random.Random, batch_size: int, tool_prob: float):
    """input_ids / attention_mask / labels; labels are -100 on the prompt, tool results and padding."""
    seqs, labels = [], []
    for _ in range(batch_size):
        a, b = pairs[rng.randrange(len(pairs))]
        ids = tokenizer(format_prompt(a, b), add_special_tokens=False)["input_ids"]
        lab = [-100] * len(ids)
        for text, is_model in teacher_episode(a, b, rng, tool_prob):
            piece = tokenizer(text, add_special_tokens=False)["input_ids"]
            ids += piece
            lab += piece if is_model else [-100] * len(piece)
        ids.append(tokenizer.eos_token_id)
        lab.append(tokenizer.eos_token_id)
        seqs.append(ids)
        labels.append(lab)
    width = max(len(s) for s in seqs)
    input_ids = torch.full((batch_size, width), tokenizer.pad_token_id)
    attn = torch.zeros((batch_size, width), dtype=torch.long)
    lab_t = torch.full((batch_size, width), -100)
    for i, (s, lab) in enumerate(zip(seqs, labels)):
        input_ids[i, : len(s)] = torch.tensor(s)
        attn[i, : len(s)] = 1
        lab_t[i, : len(s)] = torch.tensor(lab)
    return input_ids, attn, lab_t


def measure(folder: Path) -> None:
    """Greedy held-out accuracy and tool use, and sampled tool use, through the trainer's episode loop."""
    from grpokit.config import Config
    from grpokit.config.io import apply_overrides
    from grpokit.data import to_prompts
    from grpokit.data.tasks import get_task
    from grpokit.rewards import RewardRunner, RewardSpec
    from grpokit.rollout.hf import SamplingParams, generate
    from grpokit.train import episode_setup
    from grpokit.train.evaluate import evaluate
    from grpokit.train.models import eos_ids, load_model, load_tokenizer

    cfg = apply_overrides(Config(), ["data.task=calculator", f"model.name_or_path={folder}"])
    tok, task = load_tokenizer(cfg.model), get_task("calculator")
    model = load_model(cfg.model, torch.device("cpu"), torch.float32)
    runner = episode_setup.episode_runner(cfg, tok, None, None, task)
    prompts = to_prompts(task.held_out_rows(500), tok, cfg.data)
    with RewardRunner([RewardSpec(fn=task.reward_fn, name="accuracy")], num_workers=0) as rr:
        res = evaluate(
            model,
            tok,
            prompts,
            rr,
            params=SamplingParams(max_new_tokens=8, temperature=0.0),
            eos_token_ids=eos_ids(tok, model),
            episodes=runner,
        )
    gen = torch.Generator().manual_seed(0)
    sample = lambda ctx, G, p: generate(
        model,
        ctx,
        G,
        p,
        eos_token_ids=eos_ids(tok, model),
        pad_token_id=tok.pad_token_id,
        generator=gen,
        decode=lambda ids: tok.decode(ids, skip_special_tokens=True),
    )
    ro = runner.run(sample, prompts[:100], 8, SamplingParams(max_new_tokens=8, temperature=1.0))
    used = sum(e.tool_calls > 0 for e in ro.episodes) / len(ro.episodes)
    print(
        f"held-out (500): greedy accuracy {res['accuracy']:.3f}, greedy tool use {res['tool_use_rate']:.3f}; "
        f"sampled tool use (T=1, 100 prompts x 8) {used:.3f}"
    )


def calc_model(tokenizer) -> LlamaForCausalLM:
    """The calculator demo's architecture, randomly initialised (from torch's current seed): a 4-layer,
    64-wide Llama over ``tokenizer``'s characters with tied embeddings and 64 positions."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(config)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    tokenizer = build_char_tokenizer(ALPHABET, TAGS)
    model = calc_model(tokenizer)
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.3f} M parameters, vocab {len(tokenizer)}")
    pairs = train_pairs()
    warm_up(model, lambda: make_batch(tokenizer, pairs, rng, args.batch_size, args.tool_prob), args.steps, args.lr)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    save_char_tokenizer(build_char_tokenizer(ALPHABET, TAGS), args.out)
    print(f"saved to {args.out}")
    measure(args.out)


if __name__ == "__main__":
    main()
