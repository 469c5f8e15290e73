"""Speed and memory of vision-language GRPO on Qwen2-VL-shaped random weights.

Builds a Qwen2-VL-2B-shaped model (28-layer 1536-wide decoder, 32-block 1280-wide vision tower, 14 px
patches, 151936-token vocabulary) with random weights, no hub access, and trains it for a few GRPO
steps on the built-in shapes task with its images resized to ``--image-size`` (448: 1024 patches,
256 image tokens per prompt). Prints one JSON line: seconds per step (after the first) and peak CUDA
memory. ``--tiny`` runs a small model of the same architecture on CPU (the check that the script works).

    python bench/vision_gpu.py                 # on a GPU, 2B shape, full fine-tuning of the LM
    python bench/vision_gpu.py --lora 16       # LoRA on the language model
    python bench/vision_gpu.py --tiny          # CPU smoke run
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SIZES = {
    "2b": dict(
        text=dict(
            hidden_size=1536,
            intermediate_size=8960,
            num_hidden_layers=28,
            num_attention_heads=12,
            num_key_value_heads=2,
            vocab_size=151936,
            mrope_section=[16, 24, 24],
        ),
        vision=dict(depth=32, embed_dim=1280, num_heads=16, mlp_ratio=4),
    ),
    "tiny": dict(
        text=dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=512,
            mrope_section=[2, 3, 3],
        ),
        vision=dict(depth=2, embed_dim=32, num_heads=2, mlp_ratio=2),
    ),
}


def build(folder: Path, size: str, image_size: int) -> None:
    """A random-weight Qwen2-VL of ``size`` with the demo's character tokenizer and a 14 px processor."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessor, Qwen2VLProcessor

    from grpokit.data.tasks import chartok
    from grpokit.data.vision import image_only

    spec = importlib.util.spec_from_file_location("mk", ROOT / "scripts" / "make_vision_demo_model.py")
    mk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mk)
    tok = chartok.build_char_tokenizer(mk.ALPHABET, mk.VISION_TOKENS, model_max_length=4096)
    tok.chat_template = mk.TEMPLATE
    ip = Qwen2VLImageProcessor(
        patch_size=14,
        merge_size=2,
        temporal_patch_size=2,
        size={"shortest_edge": image_size**2, "longest_edge": image_size**2},
    )
    proc = image_only(Qwen2VLProcessor)(image_processor=ip, tokenizer=tok, chat_template=mk.TEMPLATE)
    t, v = dict(SIZES[size]["text"]), SIZES[size]["vision"]
    section = t.pop("mrope_section")
    ids = {x: tok.convert_tokens_to_ids(x) for x in mk.VISION_TOKENS}
    config = Qwen2VLConfig(
        text_config=dict(
            **t,
            max_position_embeddings=4096,
            bos_token_id=None,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": section},
        ),
        vision_config=dict(
            **v, hidden_size=t["hidden_size"], patch_size=14, spatial_merge_size=2, temporal_patch_size=2
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = Qwen2VLForConditionalGeneration(config).to(torch.bfloat16 if size != "tiny" else torch.float32)
    model.save_pretrained(folder)
    proc.save_pretrained(folder)
    chartok.save_char_tokenizer(tok, folder)


def main() -> None:
    from grpokit.train.memory import peak_allocated_bytes

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="small model on CPU (smoke test)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--lora", type=int, default=0, help="LoRA rank on the language model (0: full fine-tuning)")
    ap.add_argument("--image-size", type=int, default=448)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    a = ap.parse_args()
    from grpokit.config.io import apply_overrides
    from grpokit.config.sections import Config
    from grpokit.train.loop import Trainer

    size = "tiny" if a.tiny else "2b"
    image_size = 56 if a.tiny else a.image_size
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        build(folder, size, image_size)
        cfg = apply_overrides(
            Config(),
            [
                "data.task=shapes",
                f"model.name_or_path={folder}",
                f"model.lora_rank={a.lora}",
                f"train.steps={a.steps}",
                f"train.prompts_per_step={a.prompts}",
                f"rollout.group_size={a.group}",
                f"rollout.max_new_tokens={a.max_new_tokens}",
                "data.eval_size=0",
                "train.save_every=0",
                f"train.out={tmp}/run",
                "record.report=false",
                "model.device=cpu" if a.tiny else "model.device=auto",
            ],
        )
        trainer = Trainer(cfg, quiet=True)
        times = []
        for _ in range(a.steps):
            t0 = time.perf_counter()
            trainer.train_step()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            trainer.step += 1
        rest = times[1:] or times
        print(
            json.dumps(
                {
                    "model": f"qwen2-vl-{size} random",
                    "device": str(trainer.device),
                    "lora_rank": a.lora,
                    "image_tokens": (image_size // 28) ** 2,
                    "prompts": a.prompts,
                    "group": a.group,
                    "max_new_tokens": a.max_new_tokens,
                    "parameters": sum(p.numel() for p in trainer.model.parameters()),
                    "s_per_step": round(sum(rest) / len(rest), 3),
                    "first_step_s": round(times[0], 3),
                    "peak_memory_gib": round(peak_allocated_bytes() / 2**30, 2) if torch.cuda.is_available() else None,
                }
            )
        )


if __name__ == "__main__":
    main()
