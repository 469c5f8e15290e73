"""Offline stand-ins for bench/trl_examples.py: datasets with the columns TRL's scripts read, and a
local hub cache in which every model name the scripts use resolves to a tiny model."""

from __future__ import annotations

import hashlib
import json
import string
from pathlib import Path

TEXT_NAMES = ["Qwen/Qwen3-0.6B"]
VISION_HINTS = ("VL", "SmolVLM", "vlm", "Vision", "gemma-3")
QWEN_TOKENS = (
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)


def _problems(n: int) -> list[tuple[str, str]]:
    return [(f"What is {a} plus {a + 1}?", str(2 * a + 1)) for a in range(n)]


def _datasets() -> dict[str, dict[str, list[dict]]]:
    """name -> split -> rows, with the columns the real datasets have (those the scripts read at least)."""
    from PIL import Image

    numina = {
        split: [
            {
                "problem": q,
                "solution": f"The sum is $\\boxed{{{ans}}}$.",
                "messages": [{"role": "user", "content": q}, {"role": "assistant", "content": ans}],
            }
            for q, ans in _problems(n)
        ]
        for split, n in (("train", 40), ("test", 20))
    }
    images = [
        {
            "image": Image.new("RGB", (64, 64), (40 * (i % 6), 90, 200)),
            "problem": q,
            "solution": f"<answer>{ans}</answer>",
            "original_question": q,
            "original_answer": ans,
        }
        for i, (q, ans) in enumerate(_problems(120))
    ]
    genes = ["BRCA1", "TP53", "EGFR", "MYC"]
    return {
        "AI-MO/NuminaMath-TIR": numina,
        "lmms-lab/multimodal-open-r1-8k-verified": {"train": images},
        "trl-lib/DeepMath-103K": {
            "train": [{"prompt": [{"role": "user", "content": q}], "solution": ans} for q, ans in _problems(16)]
        },
        "openai/gsm8k": {"train": [{"question": q, "answer": f"Add them. #### {ans}"} for q, ans in _problems(16)]},
        "qgallouedec/biogrid": {
            "train": [
                {
                    "Official Symbol Interactor A": a,
                    "Official Symbol Interactor B": b,
                    "Alt IDs Interactor A": a.lower(),
                    "Alt IDs Interactor B": b.lower(),
                    "Aliases Interactor A": "-",
                    "Aliases Interactor B": "-",
                }
                for a in genes
                for b in genes
                if a != b
            ]
        },
        "qgallouedec/biogrid_qa": {
            "train": [
                {"question": f"Does the gene {a} interact with {b}?", "answer": "Yes"}
                for a in genes
                for b in genes
                if a != b
            ]
        },
    }


def write_datasets(folder: Path) -> dict[str, str]:
    """Parquet splits per dataset under ``folder``; returns hub name -> folder."""
    from datasets import Dataset

    out = {}
    for name, splits in _datasets().items():
        target = folder / name.replace("/", "__")
        target.mkdir(parents=True, exist_ok=True)
        for split, rows in splits.items():
            Dataset.from_list(rows).to_parquet(str(target / f"{split}.parquet"))
        out[name] = str(target)
    return out


def _text_model(path: Path) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    import trl
    from grpokit.data.tasks.chartok import build_char_tokenizer, save_char_tokenizer

    tok = build_char_tokenizer(string.printable, QWEN_TOKENS, padding_side="left", model_max_length=None)
    tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    tok.eos_token = "<|im_end|>"
    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=4096,
        bos_token_id=None,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    Qwen3ForCausalLM(cfg).save_pretrained(path)
    save_char_tokenizer(tok, path)


def _vision_model(shipped: Path, dest: Path) -> Path:
    """grpokit's tiny Qwen2-VL with the context of the models the scripts name (4096, as the text
    stand-in): the shipped demo's 256 positions are less than one image prompt of TRL's VLM scripts,
    which grpokit refuses at start (rollout.max_prompt_tokens). RoPE positions: no weight changes."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in shipped.iterdir():
        link = dest / f.name
        if f.is_file() and f.name != "config.json" and not link.exists():
            link.symlink_to(f)
    config = json.loads((shipped / "config.json").read_text())
    for section in (config, config.get("text_config") or {}):
        if "max_position_embeddings" in section:
            section["max_position_embeddings"] = 4096
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    return dest


def write_hub_cache(work: Path, names: list[str]) -> Path:
    """An offline hub cache (HF_HUB_CACHE) in which each name is a snapshot of links to a stand-in's files."""
    from grpokit.data.tasks import shapes

    text = work / "models" / "tiny-qwen3"
    if not (text / "config.json").exists():
        _text_model(text)
    vision = _vision_model(Path(shapes.shapes_model_path()), work / "models" / "tiny-qwen2-vl")
    cache = work / "hub"
    for name in names:
        source = vision if any(h in name for h in VISION_HINTS) else text
        repo = cache / ("models--" + name.replace("/", "--"))
        commit = hashlib.sha1(name.encode()).hexdigest()
        snap = repo / "snapshots" / commit
        snap.mkdir(parents=True, exist_ok=True)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(commit)
        for f in source.iterdir():
            link = snap / f.name
            if f.is_file() and not link.exists():
                link.symlink_to(f)
    return cache
