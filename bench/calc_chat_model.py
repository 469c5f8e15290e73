"""A tiny chat-template model for the calculator environment, trainable by grpokit and by TRL's
``environment_factory`` alike (bench/hub_env_trl.py compares the two on it).

TRL 1.16 runs an environment's tools only for a tokenizer with a chat template that renders tool
calls and tool messages, and a parser for the model's replies (``tokenizer.response_template``,
transformers >= 5.13; TRL sets one itself only for the chat templates it knows, and keeps one that
is already set). This module gives the calculator demo's character tokenizer both:

* the chat template ``TEMPLATE``: ``<|user|>57*68=<eos><|assistant|>`` for the prompt, an
  assistant turn as its content and its calls, each ``<tool_call>{"name": ..., "arguments":
  {...}}</tool_call>`` (the Hermes / Qwen JSON both TRL's Qwen parser and grpokit's
  ``env.tool_format=chat_template`` read), then ``<eos>``; a tool reply as ``<|tool|>CONTENT<eos>``.
  It is prefix-preserving (an earlier turn renders the same whatever follows), as TRL requires. It
  does not print the tools' schemas (the model has one tool and learns it in the warm-up; the
  prompt stays 9 tokens);
* ``RESPONSE_TEMPLATE``: transformers' response-template parser for that syntax (the field layout
  of TRL's Qwen 3 template, with this template's turn markers), saved in tokenizer_config.json.

The JSON around a call's expression is two added tokens (``CALL_HEAD`` and ``CALL_TAIL``), as the
tags are, so a call costs 10 tokens: ``<tool_call>`` CALL_HEAD ``57*68`` CALL_TAIL ``</tool_call>``
``<eos>``. The model (hidden 64, 4 layers, as the calculator demo's) is warmed on the calculator
task's teacher (training split; a calculator call on ``TOOL_PROB`` of the problems, an estimate from
memory otherwise) rendered through this template, the loss on the model's tokens only.

    PYTHONPATH=src python bench/calc_chat_model.py [--out DIR]   # build it (about 7 minutes of one quiet core)
"""

from __future__ import annotations

import argparse
import functools
import random
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer

from grpokit.data.tasks.calculator import TAGS, TOOL_PROB, estimate, format_prompt, train_pairs
from grpokit.data.tasks.chartok import ALPHABET, build_char_tokenizer, save_char_tokenizer
from grpokit.env.builtin import calculator

USER, ASSISTANT, TOOL = "<|user|>", "<|assistant|>", "<|tool|>"
CALL_HEAD = '{"name": "calculator", "arguments": {"expression": "'
CALL_TAIL = '"}}'
CHAT_TAGS = TAGS + (USER, ASSISTANT, TOOL, CALL_HEAD, CALL_TAIL)
DEFAULT_DIR = Path("/tmp/grpokit-calc-chat-model")

TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}<|assistant|>{{ m.content or '' }}"
    "{%- for c in m.tool_calls or [] -%}{%- set f = c.function if c.function is defined else c -%}"
    '<tool_call>{"name": {{ f.name | tojson }}, "arguments": {{ f.arguments | tojson }}}</tool_call>'
    "{%- endfor -%}<eos>"
    "{%- elif m.role == 'tool' -%}<|tool|>{{ m.content }}<eos>"
    "{%- else -%}<|user|>{{ m.content }}<eos>"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)

RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": ASSISTANT,
    "fields": {
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<eos>\s*", "content": "text"},
    },
}


def build_tokenizer():
    """The calculator demo's character tokenizer plus the turn markers and call JSON as tokens,
    with ``TEMPLATE`` and ``RESPONSE_TEMPLATE`` set."""
    tok = build_char_tokenizer(ALPHABET, CHAT_TAGS)
    tok.chat_template = TEMPLATE
    tok.response_template = RESPONSE_TEMPLATE
    return tok


def conversation(a: int, b: int, use_tool: bool) -> list[dict]:
    """The teacher's episode for ``a*b=`` as chat messages: a calculator call, its reply and the
    answer; or an estimate from memory."""
    msgs: list[dict] = [{"role": "user", "content": format_prompt(a, b)}]
    if not use_tool:
        return msgs + [{"role": "assistant", "content": f"<answer>{estimate(a, b)}</answer>"}]
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": f"{a}*{b}"}}}
    return msgs + [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "calculator", "content": calculator(f"{a}*{b}")},
        {"role": "assistant", "content": f"<answer>{a * b}</answer>"},
    ]


def episode_ids(tok, messages: list[dict]) -> tuple[list[int], list[int]]:
    """Token ids of a whole conversation and its labels (-100 except on the assistant turns'
    own tokens, their closing ``<eos>`` included): each message's tokens are the template's text of
    the conversation up to it minus the text before it (the template is prefix-preserving)."""
    ids, labels, done = [], [], ""
    for k, m in enumerate(messages):
        gen = m["role"] == "assistant"
        before = tok.apply_chat_template(messages[:k], tokenize=False, add_generation_prompt=gen) if k else ""
        text = tok.apply_chat_template(messages[: k + 1], tokenize=False)
        for piece, is_model in ((before[len(done) :], False), (text[len(before) :], m["role"] == "assistant")):
            piece_ids = tok(piece, add_special_tokens=False)["input_ids"] if piece else []
            ids += piece_ids
            labels += piece_ids if is_model else [-100] * len(piece_ids)
        done = text
    return ids, labels


@functools.lru_cache(maxsize=None)
def _cached_ids(tok, a: int, b: int, use_tool: bool) -> tuple[list[int], list[int]]:
    return episode_ids(tok, conversation(a, b, use_tool))


def make_batch(tok, pairs, rng: random.Random, batch_size: int, tool_prob: float):
    """(input_ids, attention_mask, labels) of ``batch_size`` teacher episodes, right-padded."""
    seqs = [_cached_ids(tok, *pairs[rng.randrange(len(pairs))], rng.random() < tool_prob) for _ in range(batch_size)]
    width = max(len(s) for s, _ in seqs)
    input_ids = torch.full((batch_size, width), tok.pad_token_id)
    attn = torch.zeros((batch_size, width), dtype=torch.long)
    lab_t = torch.full((batch_size, width), -100)
    for i, (s, lab) in enumerate(seqs):
        input_ids[i, : len(s)], attn[i, : len(s)], lab_t[i, : len(s)] = torch.tensor(s), 1, torch.tensor(lab)
    return input_ids, attn, lab_t


def build(out: Path, steps: int = 1200, batch_size: int = 256, lr: float = 5e-3, tool_prob: float = TOOL_PROB, seed=0):
    """Warm the model up and save it with its tokenizer in ``out`` (deterministic in the arguments)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from make_calc_demo_model import calc_model  # the calculator demo's architecture
    from make_demo_model import warm_up  # the demo models' shared warm-up loop

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    rng, tok = random.Random(seed), build_tokenizer()
    model = calc_model(tok)
    pairs = train_pairs()
    warm_up(model, lambda: make_batch(tok, pairs, rng, batch_size, tool_prob), steps, lr)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    save_char_tokenizer(tok, out)
    return out


def load_tokenizer(folder: Path):
    """The saved tokenizer, with a check that its chat template and parser came back."""
    tok = AutoTokenizer.from_pretrained(folder)
    if tok.chat_template != TEMPLATE or getattr(tok, "response_template", None) != RESPONSE_TEMPLATE:
        raise RuntimeError(f"{folder} does not hold this module's chat template and response template; rebuild it")
    return tok


def ensure(folder: Path = DEFAULT_DIR, steps: int = 1200) -> Path:
    """The model folder, built first when it is not there (``done`` marks a finished build)."""
    stamp = f"steps={steps}\n"
    if not (folder / "done").exists() or (folder / "done").read_text() != stamp:
        build(folder, steps=steps)
        (folder / "done").write_text(stamp)
    return folder


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_DIR)
    p.add_argument("--steps", type=int, default=1200)
    a = p.parse_args()
    print(ensure(a.out, a.steps))


if __name__ == "__main__":
    main()
