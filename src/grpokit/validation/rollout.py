"""rollout.*: group size, sampling, engines, TIS, mismatch masking and async staleness."""

from __future__ import annotations

import functools
from typing import Any, Callable

from grpokit.algo.tis import TIS_MODES, has_sampler_mismatch
from grpokit.config.sections import Config, RolloutConfig
from grpokit.rollout.cards import is_device_name

from .checks import check, one_of, unread


def check_rollout(cfg: Config) -> None:
    """rollout.*: group size, sampling settings, engines, TIS and async staleness."""
    r, a = cfg.rollout, cfg.algo
    check(r.group_size >= 1, f"rollout.group_size={r.group_size} must be at least 1")
    check(
        r.max_prompt_tokens >= 0,
        f"rollout.max_prompt_tokens={r.max_prompt_tokens} must be >= 0 (0: the model's context)",
    )
    check(
        r.group_size >= 2 or a.scale == "none" and a.baseline == "group_mean",
        f"rollout.group_size={r.group_size} is too small for group-relative advantages; use at least 2",
    )
    check_sampling(r)
    one_of("rollout.backend", r.backend, ("hf", "vllm", "vllm_server"))
    check(r.tis_cap == 0 or r.tis_cap >= 1, f"rollout.tis_cap={r.tis_cap} must be 0 (off) or >= 1")
    one_of("rollout.tis_mode", r.tis_mode, TIS_MODES)
    check(
        0 <= r.tis_min < float("inf") and (r.tis_cap == 0 or r.tis_min <= r.tis_cap),
        f"rollout.tis_min={r.tis_min} must be a number >= 0 (0 = no lower bound) and at most "
        f"rollout.tis_cap={r.tis_cap}",
    )
    _unread_tis_settings(r)
    check_performance(cfg)
    check_rollout_engine(cfg)
    check(r.async_staleness >= 0, f"rollout.async_staleness={r.async_staleness} must be >= 0 (0 = synchronous)")
    check_async_workers(cfg)
    _unread_vllm_settings(r)
    check_partial_rollouts(cfg)
    check(r.vllm_startup_timeout > 0, f"rollout.vllm_startup_timeout={r.vllm_startup_timeout} must be > 0 seconds")
    check(r.vllm_request_timeout > 0, f"rollout.vllm_request_timeout={r.vllm_request_timeout} must be > 0 seconds")
    check(
        0 < r.vllm_gpu_memory_utilization <= 1,
        f"rollout.vllm_gpu_memory_utilization={r.vllm_gpu_memory_utilization} must be in (0, 1]",
    )
    check(
        r.vllm_max_model_len >= 0,
        f"rollout.vllm_max_model_len={r.vllm_max_model_len} must be >= 0 (0: the model's own length)",
    )
    check(
        type(r.vllm_tensor_parallel_size) is int and r.vllm_tensor_parallel_size >= 1,
        f"rollout.vllm_tensor_parallel_size={r.vllm_tensor_parallel_size!r} must be an integer >= 1 (1: one whole "
        "engine per rank)",
    )
    check(
        r.vllm_tensor_parallel_size == 1 or r.backend == "vllm",
        f"rollout.vllm_tensor_parallel_size={r.vllm_tensor_parallel_size} shards the colocated engine of "
        "rollout.backend=vllm, "
        f"but rollout.backend={r.backend}; set it to 1 (a vLLM server takes `grpokit vllm-serve MODEL "
        "--tensor-parallel-size N`)",
    )


def rollout_field(name: str, value: Any) -> str:
    """How a rollout field is named in a sentence: ``rollout.temperature=0.0``."""
    return f"rollout.{name}={value}"


def check_sampling(r: RolloutConfig, said: Callable[[str, Any], str] = rollout_field, greedy: bool = False) -> None:
    """The sampling settings: generation length, temperature, top-p, top-k, min-p and repetition penalty. Training
    checks its rollout section with them, ``grpokit eval`` its flags (``said(name, value)`` names a setting as the
    user gave it, ``--temperature -1.0``); ``greedy``: temperature 0, greedy decoding, is valid (evaluation may
    decode greedily; training samples, and its importance ratios need a temperature above 0)."""
    check(r.max_new_tokens >= 1, f"{said('max_new_tokens', r.max_new_tokens)} must be at least 1")
    if greedy:
        check(r.temperature >= 0, f"{said('temperature', r.temperature)} must be >= 0 (0 = greedy)")
    else:
        check(r.temperature > 0, f"{said('temperature', r.temperature)} must be > 0")
    check(0 < r.top_p <= 1, f"{said('top_p', r.top_p)} must be in (0, 1]")
    check(r.top_k >= 0, f"{said('top_k', r.top_k)} must be >= 0 (0 = off)")
    check(0 <= r.min_p < 1, f"{said('min_p', r.min_p)} must be in [0, 1)")
    check(r.repetition_penalty > 0, f"{said('repetition_penalty', r.repetition_penalty)} must be > 0 (1.0 = off)")


def _unread_tis_settings(r: RolloutConfig) -> None:
    """TIS's bounds and mode are read only where the sampler is not pi_old itself; turning it off is no change."""
    if has_sampler_mismatch(r.backend, r.async_staleness):
        return
    unread(
        "rollout",
        r,
        RolloutConfig(),
        ["tis_mode", "tis_min", *["tis_cap"] * (r.tis_cap != 0)],
        "with rollout.backend=hf and rollout.async_staleness=0 (the sampler is pi_old itself: there is no "
        "mismatch to correct)",
        "set rollout.backend=vllm or vllm_server, or rollout.async_staleness >= 1",
    )


def check_performance(cfg: Config) -> None:
    """The padding-free, mismatch and memory fields."""
    r = cfg.rollout
    one_of("train.packing", cfg.train.packing, ("auto", "packed", "padded", "prefix_tree"))
    one_of("train.memory_plan", cfg.train.memory_plan, ("auto", "manual"))
    one_of("rollout.mismatch_mask", r.mismatch_mask, ("none", "token", "sequence"))
    check(0 < r.mismatch_low <= 1, f"rollout.mismatch_low={r.mismatch_low} must be in (0, 1]")
    check(r.mismatch_high >= 1, f"rollout.mismatch_high={r.mismatch_high} must be >= 1")


# rollout.generation_kwargs keys set elsewhere: by a rollout field of their own, or by the engine
# itself (one completion per row, EOS and padding from the tokenizer, generate's plain tensor output)
GENERATE_OWN_KEYS = (
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "stop_strings",
    "eos_token_id",
    "pad_token_id",
    "num_return_sequences",
    "return_dict_in_generate",
    "output_scores",
    "output_logits",
)


def check_rollout_engine(cfg: Config) -> None:
    """rollout.engine and rollout.generation_kwargs."""
    r = cfg.rollout
    one_of("rollout.engine", r.engine, ("auto", "static", "dynamic", "generate"))
    check(
        r.engine == "auto" or r.backend == "hf",
        f"rollout.engine={r.engine} picks a decode loop of rollout.backend=hf, "
        f"but rollout.backend={r.backend}; leave rollout.engine at auto",
    )
    check(
        r.engine != "generate" or r.async_staleness == 0,
        "rollout.engine=generate records no sampling logprobs, which "
        f"asynchronous sampling's importance weights need, but rollout.async_staleness={r.async_staleness}; use 0",
    )
    check(
        not r.generation_kwargs or r.engine == "generate",
        f"rollout.generation_kwargs={r.generation_kwargs} is read only "
        f"by rollout.engine=generate, but rollout.engine={r.engine}; set rollout.engine=generate or leave it empty",
    )
    check_generation_kwargs(r.generation_kwargs)


def check_generation_kwargs(kwargs: dict, name: str = "rollout.generation_kwargs") -> None:
    """generate()'s extra settings (training's rollout.generation_kwargs, ``grpokit eval --generation-kwargs``,
    ``name`` as the user gave them): none that a setting of its own or the engine sets, none that transformers'
    GenerationConfig would keep unread."""
    own = [k for k in kwargs if k in GENERATE_OWN_KEYS]
    check(
        not own,
        f"{name} keys {own} are set elsewhere (the rollout fields temperature, top_p, top_k, "
        "min_p, max_new_tokens, repetition_penalty and stop, or the engine itself); remove them from generation_kwargs",
    )
    for key in kwargs:
        problem = unknown_generation_key(key)
        check(problem is None, f"{name} {problem}")


@functools.cache
def generation_settings() -> frozenset[str]:
    """The settings of transformers' ``GenerationConfig`` (the attributes a default one holds). It accepts any
    other keyword as well and keeps it as an attribute nothing reads, so a misspelt key would change nothing."""
    from transformers import GenerationConfig

    return frozenset(k for k in vars(GenerationConfig()) if not k.startswith("_") and k != "transformers_version")


def unknown_generation_key(key: str) -> str | None:
    """One sentence when ``key`` is not a setting of transformers' ``GenerationConfig`` (naming the closest one),
    else None. Only rollout.engine=generate reads generation_kwargs (the other engines refuse them)."""
    valid = generation_settings()
    if key in valid:
        return None
    import difflib

    close = difflib.get_close_matches(key, sorted(valid), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?" if close else "see transformers' GenerationConfig for its settings"
    return f"key {key!r} is not a setting of transformers' GenerationConfig (generate() would ignore it); {hint}"


def check_partial_rollouts(cfg: Config) -> None:
    """rollout.async_partial_tokens: partial rollouts in the async sampler (thread or workers), one-turn episodes."""
    r, p = cfg.rollout, cfg.rollout.async_partial_tokens
    check(p >= 0, f"rollout.async_partial_tokens={p} must be >= 0 (0 = off)")
    if not p:
        return
    check(r.async_staleness > 0, f"rollout.async_partial_tokens={p} needs rollout.async_staleness >= 1")
    check(r.backend == "hf", f"rollout.async_partial_tokens runs the hf engines, not rollout.backend={r.backend}")
    check(
        not (cfg.env.tools or cfg.env.environment),
        "rollout.async_partial_tokens samples one-turn completions, not episodes with env.tools or env.environment; "
        "set it to 0",
    )


def check_async_workers(cfg: Config) -> None:
    """rollout.async_workers and its deadline and fault policy; what worker processes cannot do is refused."""
    r = cfg.rollout
    check(r.async_workers >= 0, f"rollout.async_workers={r.async_workers} must be >= 0 (0 = a thread)")
    check(
        r.async_worker_threads >= 0,
        f"rollout.async_worker_threads={r.async_worker_threads} must be >= 0 (0 = the trainer's threads split evenly)",
    )
    check(
        0 < r.async_timeout_s < float("inf"),
        f"rollout.async_timeout_s={r.async_timeout_s} must be a finite number > 0 of seconds",
    )
    one_of("rollout.async_worker_fault", r.async_worker_fault, ("stop", "drop"))
    check(
        r.async_remote_workers >= 0,
        f"rollout.async_remote_workers={r.async_remote_workers} must be >= 0 (workers on other hosts)",
    )
    _unread_worker_settings(r)
    if not (r.async_workers or r.async_remote_workers):
        return
    name = "rollout.async_workers" if r.async_workers else "rollout.async_remote_workers"
    n = r.async_workers or r.async_remote_workers
    check(r.async_staleness > 0, f"{name}={n} needs rollout.async_staleness >= 1")
    check(r.backend == "hf", f"{name} runs the hf engines, not rollout.backend={r.backend}; set it to 0")
    e = cfg.env
    check(
        not (e.tools or e.environment),
        f"{name} samples one-turn completions, not episodes with env.tools or env.environment; "
        f"set {name}=0 (the thread runs episodes)",
    )
    check(
        cfg.model.quantization == "none",
        f"{name} cannot send a {cfg.model.quantization} quantised base to a worker process (bitsandbytes' packed "
        f"weights and their quantisation state are not plain tensors); set {name}=0",
    )
    d = r.async_worker_device
    check(
        d == "" or is_device_name(d),
        f'rollout.async_worker_device={d!r} is not valid; use "" (the trainer\'s device), cpu, cuda or cuda:N',
    )
    if r.async_remote_workers:
        from grpokit.rollout.async_remote import parse_address, rollout_key

        parse_address(r.async_listen, "rollout.async_listen")
        rollout_key()


def _unread_worker_settings(r: RolloutConfig) -> None:
    """A worker setting away from its default where no worker reads it is refused, not ignored (the sampler
    thread samples on the trainer's device with its threads, and stops the run at its fault; a synchronous run
    has no deadline of the sampler's)."""
    local, remote, d = "rollout.async_workers >= 1", "rollout.async_remote_workers >= 1", RolloutConfig()
    if not r.async_workers:
        names = ("async_worker_device", "async_worker_threads")
        unread("rollout", r, d, names, "with rollout.async_workers=0", f"set {local}")
    if not r.async_remote_workers:
        unread("rollout", r, d, ("async_listen",), "with rollout.async_remote_workers=0", f"set {remote}")
    if not (r.async_workers or r.async_remote_workers):
        unread("rollout", r, d, ("async_worker_fault",), "with no rollout worker processes", f"set {local} or {remote}")
    if not r.async_staleness:  # the deadline of the thread's batches and of the workers'
        unread(
            "rollout", r, d, ("async_timeout_s",), "with rollout.async_staleness=0", "set rollout.async_staleness >= 1"
        )


VLLM_READERS = {
    "vllm": ("vllm_gpu_memory_utilization", "vllm_max_model_len", "vllm_sleep"),
    "vllm_server": ("vllm_url", "vllm_sync_dir", "vllm_startup_timeout", "vllm_request_timeout"),
}
"""The vLLM settings each rollout.backend reads (the colocated engine, the server's client)."""


def _unread_vllm_settings(r: RolloutConfig) -> None:
    """A vLLM setting away from its default while the hf engines sample is refused, not ignored: most likely
    rollout.backend was meant to be set too."""
    if r.backend != "hf":
        return
    for backend, names in VLLM_READERS.items():
        unread(
            "rollout",
            r,
            RolloutConfig(),
            names,
            "with rollout.backend=hf",
            f"set rollout.backend={backend} (which reads it)",
        )
