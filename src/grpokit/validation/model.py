"""model.*, record.sinks, data.* and the paths of the dataset and the model."""

from __future__ import annotations

from pathlib import Path

from grpokit.config.data_sources import READERS, rows_in_use, unread_fields
from grpokit.config.sections import Config, DataConfig, ModelConfig, RecordConfig
from grpokit.nn.kernels import MODES as CPU_MATMUL_MODES
from grpokit.nn.models import ATTN_IMPLEMENTATIONS
from grpokit.nn.vocab import MODES as VOCAB_MODES
from grpokit.rewards.spec import CONVENTIONS

from .checks import check, one_of, unread

AUTOCAST = ("auto", "bfloat16", "off")
"""model.autocast's values; "float16" is refused by its own sentence (``one_of``'s would not say why)."""
FLOAT16_AUTOCAST = (
    "model.autocast='float16' is not supported: grpokit has no float16 loss scaling (GradScaler), so small "
    "gradients would underflow to 0; use bfloat16, auto or off"
)


def check_model(cfg: Config) -> None:
    """model.*: dtype, device, autocast, LoRA and quantization."""
    a, m = cfg.algo, cfg.model
    one_of("model.dtype", m.dtype, ("auto", "float32", "bfloat16", "float16"))
    one_of("model.attn_implementation", m.attn_implementation, ATTN_IMPLEMENTATIONS)
    check(
        m.device in ("auto", "cpu", "cuda") or m.device.startswith("cuda:"),
        f"model.device={m.device!r} is not valid; use auto, cpu, cuda or cuda:N",
    )
    check(m.autocast != "float16", FLOAT16_AUTOCAST)
    one_of("model.autocast", m.autocast, AUTOCAST)
    one_of("model.cpu_matmul", m.cpu_matmul, CPU_MATMUL_MODES)
    one_of("model.kernels", m.kernels, ("torch", "liger", "auto"))
    one_of("model.vocab_kernels", m.vocab_kernels, VOCAB_MODES)
    one_of("model.lora_save", m.lora_save, ("adapter", "merged"))
    one_of("model.quantization", m.quantization, ("none", "4bit"))
    _check_lora(m)
    check(
        m.quantization == "none" or m.lora_rank > 0,
        f"model.quantization={m.quantization!r} trains adapters only; set model.lora_rank > 0 (e.g. 16)",
    )
    check(
        m.quantization == "none" or cfg.rollout.backend == "hf",
        f"model.quantization={m.quantization!r} with rollout.backend={cfg.rollout.backend} is not supported: vLLM "
        "would be sent the 4-bit packed base weights, which it cannot load; set model.quantization=none or "
        "rollout.backend=hf",
    )
    check(
        not (m.lm_head_fp32 and m.lora_rank and "lm_head" in m.lora_target_modules),
        "model.lm_head_fp32 keeps lm_head a plain float32 layer, but model.lora_target_modules puts an adapter on "
        "it; remove lm_head from the targets or set model.lm_head_fp32=false",
    )
    check_compile(m)
    check(
        m.neftune_noise_alpha >= 0,
        f"model.neftune_noise_alpha={m.neftune_noise_alpha} must be >= 0 (0 = off; the NEFTune paper uses 5)",
    )
    check(
        m.router_aux_loss_coef >= 0 or m.router_aux_loss_coef == -1,
        f"model.router_aux_loss_coef={m.router_aux_loss_coef} must be >= 0 (0 = off) or -1 (the model config's own)",
    )
    check(
        m.lora_rank == 0 or a.ref_refresh_every == 0,
        "algo.ref_refresh_every needs full fine-tuning; with LoRA the reference is the frozen base (set "
        "model.lora_rank=0 or algo.ref_refresh_every=0)",
    )


def _check_lora(m: ModelConfig) -> None:
    """The LoRA fields: a rank, settings read only with adapters, and a dropout model.disable_dropout would zero."""
    check(m.lora_rank >= 0, f"model.lora_rank={m.lora_rank} must be >= 0 (0 = full fine-tuning)")
    if m.lora_rank == 0:  # full fine-tuning: no adapter reads them
        lora = ["lora_alpha", "lora_dropout", "lora_target_modules", "lora_save"]
        unread("model", m, ModelConfig(), lora, "with model.lora_rank=0 (full fine-tuning)", "set model.lora_rank > 0")
    check(0 <= m.lora_dropout < 1, f"model.lora_dropout={m.lora_dropout} must be in [0, 1)")
    check(
        m.lora_dropout == 0 or not m.disable_dropout,
        f"model.lora_dropout={m.lora_dropout} would be set to 0 by model.disable_dropout=true (the policy's dropout "
        "is off, so pi_old and the update see one policy); set model.disable_dropout=false to train with LoRA dropout, "
        "or model.lora_dropout=0",
    )


def check_compile(m: ModelConfig) -> None:
    """model.compile and its mode and backend, which only a compiled run reads."""
    check(
        not (m.compile and m.cpu_matmul == "onednn"),
        "model.compile=true cannot trace model.cpu_matmul='onednn' linears (torch.compile's inductor does not lower "
        "them); set model.cpu_matmul=auto (oneDNN off while compiling) or torch",
    )
    one_of(
        "model.compile_mode",
        m.compile_mode,
        ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
    )
    if not m.compile:  # train/models.py compiles only with model.compile: the mode and backend were dropped unseen
        names = ("compile_mode", "compile_backend")
        unread("model", m, ModelConfig(), names, "with model.compile=false", "set model.compile=true")
    check(
        not m.compile or m.compile_backend in torch_backends(),
        f"model.compile_backend={m.compile_backend!r} is not a torch.compile backend; use one of: "
        f"{', '.join(torch_backends())}",
    )


def check_record_data(cfg: Config) -> None:
    """record.sinks, data.* and the paths of the dataset and model."""
    m = cfg.model
    from grpokit.record.recorder import SINKS
    from grpokit.record.trackers import missing_package

    for sink in cfg.record.sinks:  # before any run folder exists: a missing tracker is one sentence, not a traceback
        one_of("record.sinks", sink, ["jsonl", *SINKS])
        hint = missing_package(sink)
        check(hint is None, f"record.sinks: {hint}")
    check_unread_record(cfg.record)
    d = cfg.data
    one_of("data.chat_template", d.chat_template, ("auto", "always", "never", "conversational"))
    one_of("reward.convention", cfg.reward.convention, CONVENTIONS)
    check(d.eval_size >= 0, f"data.eval_size={d.eval_size} must be >= 0")
    if d.curriculum == "off":  # train/domain_setup.make_sampler reads them for the frontier sampler only
        names = ("curriculum_key", "curriculum_threshold", "curriculum_decay", "curriculum_floor")
        unread("data", d, DataConfig(), names, "with data.curriculum=off", "set data.curriculum=frontier")
    if d.domains or d.curriculum != "off":  # make_sampler serves whole batches from the plain order only
        why = "with data.domains or data.curriculum=frontier, whose batches are drawn by share or pass rate"
        unread("data", d, DataConfig(), ("drop_last",), why, "leave data.domains empty and data.curriculum=off")
    check_data_sources(d)
    if d.dataset and _looks_like_path(d.dataset):
        check(
            Path(d.dataset).exists(),
            f"data.dataset={d.dataset!r} does not exist; give an existing .jsonl/.json/.parquet/.csv file or a hub "
            "dataset name",
        )
    if m.name_or_path != "demo" and _looks_like_path(m.name_or_path):
        check(
            Path(m.name_or_path).is_dir(),
            f"model.name_or_path={m.name_or_path!r} does not exist; give a model folder, a hub id, or demo",
        )


def check_data_sources(d: DataConfig) -> None:
    """A data.* field that only a source the run does not use reads (config/data_sources.py ``SOURCE_FIELDS``:
    data.split with the built-in task, data.task_params beside data.dataset ...), set away from its default, is
    refused: the run would train on the same rows and exit 0."""
    for name, readers in unread_fields(d).items():
        named = " or ".join(READERS[r] for r in readers)
        eval_note = " and no data.eval_dataset" if "eval_dataset" in readers else ""
        why = f"with {rows_in_use(d)}{eval_note} (only {named} reads it)"
        unread("data", d, DataConfig(), [name], why, "use that")


def check_unread_record(r: RecordConfig) -> None:
    """record.samples_* with record.samples_every=0 (no sample is written), and record.project / run_name with
    no tracker that names its runs (record/trackers.py NAMED_RUNS): refused, as nothing reads them."""
    from grpokit.record.trackers import NAMED_RUNS

    if not r.samples_every:
        names = ("samples_prompts", "samples_images")
        unread("record", r, RecordConfig(), names, "with record.samples_every=0", "set record.samples_every > 0")
    if not set(r.sinks) & set(NAMED_RUNS):
        trackers = ", ".join(NAMED_RUNS)
        why = f"with no tracker that names runs in record.sinks ({trackers})"
        unread("record", r, RecordConfig(), ("project", "run_name"), why, "add one to record.sinks")


def _looks_like_path(s: str) -> bool:
    return s.startswith((".", "/", "~")) or s.endswith((".jsonl", ".json", ".parquet", ".csv")) or s.count("/") > 1


def torch_backends() -> list[str]:
    """The torch.compile backends this torch offers (inductor, aot_eager, eager ...)."""
    import torch

    return sorted(torch.compiler.list_backends(exclude_tags=()))
