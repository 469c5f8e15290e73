"""TRL 1.16's ``GRPOConfig`` for grpokit: the same argument names and defaults, mapped onto ``Config``.

``GRPOConfig`` declares the arguments grpokit carries out, each with TRL's default. Every other
argument TRL 1.16's GRPOConfig has (``UNSUPPORTED``, with TRL's default) is accepted only at that
default: any other value is refused with one sentence naming it, never silently ignored. A name TRL
does not have is refused too.

grpokit/trl/mapping.py maps the arguments onto grpokit's ``Config``.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

from grpokit.config.sections import ConfigError
from .checks import check


@dataclass(init=False)
class GRPOConfig:
    """TRL's GRPOConfig: pass the arguments you would pass to ``trl.GRPOConfig``."""

    output_dir: str | None = None
    """Run folder (None: "trainer_output", which transformers then sets it to)."""
    per_device_train_batch_size: int = 8
    """Completions per forward/backward pass; with gradient_accumulation_steps it sets the completions per step."""
    gradient_accumulation_steps: int = 1
    """Micro-batches accumulated into one optimizer update."""
    num_train_epochs: float = 3.0
    """Passes over train_dataset when max_steps is -1."""
    max_steps: int = -1
    """Optimizer updates to make (-1: from num_train_epochs)."""
    learning_rate: float = 1e-6
    """Peak AdamW learning rate."""
    lr_scheduler_type: str = "linear"
    """transformers' schedule of that name: "linear", "cosine", "cosine_with_min_lr", "cosine_warmup_with_min_lr", "cosine_with_restarts", "polynomial", "inverse_sqrt", "warmup_stable_decay", "constant" or "constant_with_warmup" (optim.schedule)."""
    warmup_steps: float = 0
    """Linear warm-up updates from a rate of 0 (a value in (0, 1) is a fraction of max_steps); none with "constant", as transformers."""
    optim: str = "adamw_torch_fused"
    """"adamw_torch" or "adamw_torch_fused" (grpokit's AdamW is fused where it can be), "adafactor", "sgd", "adagrad", "rmsprop", or with their CUDA package installed "adamw_8bit" (or "adamw_bnb_8bit"), "paged_adamw_8bit" (bitsandbytes), "adamw_torch_4bit", "adamw_torch_8bit" (torchao)."""
    weight_decay: float = 0.0
    """Weight decay of the optimizer (of every parameter; transformers leaves biases and norms out)."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.999
    """AdamW beta2."""
    adam_epsilon: float = 1e-8
    """AdamW epsilon."""
    max_grad_norm: float = 1.0
    """Gradient-norm clip (0: none)."""
    bf16: bool | None = None
    """bfloat16 mixed precision (None: grpokit's auto, bf16 autocast on GPU only)."""
    fp16: bool = False
    """float16 mixed precision."""
    gradient_checkpointing: bool = True
    """Recompute activations in the backward pass."""
    logging_steps: float = 10
    """Console line (and completion samples, with log_completions) every N steps; a value in (0, 1) is a fraction of the steps."""
    disable_tqdm: bool | None = None
    """True: no console output (metrics.jsonl is still written)."""
    report_to: Any = "none"
    """Trackers besides metrics.jsonl: "none", or some of tensorboard, wandb, mlflow, trackio."""
    eval_strategy: str = "no"
    """"no" (no evaluation during training), "steps" (every eval_steps) or "epoch" (at the end of every epoch and of training)."""
    eval_steps: float | None = None
    """With eval_strategy="steps": evaluate every N steps (None: logging_steps)."""
    save_strategy: str = "steps"
    """"steps" (a checkpoint every save_steps), "epoch" (at the end of every epoch) or "no" (none at all, as transformers)."""
    save_steps: float = 500
    """Checkpoint every N steps."""
    save_total_limit: int | None = None
    """Checkpoints to keep (None: all)."""
    push_to_hub: bool = False
    """Upload the model to the Hub (hub_strategy decides when)."""
    hub_model_id: str | None = None
    """Hub repository (None: the output_dir's name)."""
    hub_token: str | None = None
    """Hub token (None: the logged-in one)."""
    hub_private_repo: bool | None = None
    """Create the repository private."""
    hub_strategy: str = "every_save"
    """"every_save" (push each checkpoint's model and the final model) or "end" (push only from push_to_hub() / the end); "checkpoint" and "all_checkpoints" are refused (a grpokit checkpoint resumes only inside its run folder)."""
    seed: int = 42
    """Seed for data order, sampling and initialisation."""
    full_determinism: bool = False
    """Deterministic torch algorithms (bit-exact resume on CPU)."""
    use_cpu: bool = False
    """Train on the CPU even when a GPU is present."""
    remove_unused_columns: bool = False
    """True: reward functions see only the prompt, no other dataset column."""
    model_init_kwargs: dict | None = None
    """Loading options for a model given by name; grpokit reads dtype (or torch_dtype)."""
    trust_remote_code: bool = False
    """Allow model code from the Hub."""
    disable_dropout: bool = False
    """Set every dropout probability of the policy to 0."""
    num_generations: int = 8
    """G: completions per prompt."""
    max_completion_length: int = 512
    """Most tokens per completion."""
    shuffle_dataset: bool = True
    """Shuffle the training prompts each epoch."""
    temperature: float = 1.0
    """Sampling temperature."""
    top_p: float = 1.0
    """Nucleus sampling (1.0: off)."""
    top_k: int = 0
    """Top-k sampling (0: off)."""
    min_p: float | None = None
    """Min-p sampling (None: off)."""
    repetition_penalty: float = 1.0
    """Penalty on tokens already in the prompt or completion (1.0: off), applied to sampling only."""
    generation_kwargs: dict | None = None
    """More sampling settings; grpokit reads temperature, top_p, top_k, min_p, max_new_tokens, stop_strings and repetition_penalty."""
    chat_template_kwargs: dict | None = None
    """Extra keyword arguments of apply_chat_template for conversational prompts."""
    use_vllm: bool = False
    """Sample with vLLM."""
    vllm_mode: str = "colocate"
    """"colocate" (an engine on the trainer's GPU) or "server"."""
    vllm_server_base_url: str | None = None
    """Server URL (None: from vllm_server_host and vllm_server_port)."""
    vllm_server_host: str = "0.0.0.0"
    """Server host when vllm_server_base_url is None."""
    vllm_server_port: int = 8000
    """Server port when vllm_server_base_url is None."""
    vllm_server_timeout: float = 240.0
    """Seconds to wait for the server."""
    vllm_gpu_memory_utilization: float = 0.3
    """GPU memory fraction of the colocated engine."""
    vllm_enable_sleep_mode: bool = False
    """Release the colocated engine's memory during the update."""
    vllm_importance_sampling_correction: bool = True
    """Correct for the vLLM/trainer mismatch with importance weights (only with use_vllm)."""
    vllm_importance_sampling_mode: str = "sequence_mask"
    """token_truncate, token_mask, sequence_truncate or sequence_mask (rollout.tis_mode; sequence ratios are products of token ratios)."""
    vllm_importance_sampling_clip_max: float | None = 3.0
    """Upper bound of the importance weight: truncated to it or masked above it (None: no bound)."""
    vllm_importance_sampling_clip_min: float | None = None
    """Lower bound of the importance weight: truncated to it or masked below it (None: no bound)."""
    beta: float = 0.0
    """KL coefficient (0: no reference model)."""
    num_iterations: int = 1
    """mu: updates per generated batch."""
    epsilon: float = 0.2
    """Lower clip of the ratio (1 - epsilon)."""
    epsilon_high: float | None = None
    """Upper clip of the ratio (None: epsilon)."""
    importance_sampling_level: str = "token"
    """"token" (GRPO) or "sequence" (GSPO)."""
    reward_weights: list | None = None
    """One weight per reward function (None: all 1.0)."""
    scale_rewards: Any = "group"
    """"group" (or True), "batch" or "none" (or False)."""
    loss_type: str = "dapo"
    """"grpo", "dapo", "bnpo", "dr_grpo", "cispo" (epsilon_high, or epsilon when unset, caps the weight), "sapo", "luspo" or "vespo"."""
    sapo_temperature_pos: float = 1.0
    """loss_type="sapo": gate temperature for tokens with positive advantage."""
    sapo_temperature_neg: float = 1.05
    """loss_type="sapo": gate temperature for tokens with negative advantage."""
    mask_truncated_completions: bool = False
    """Leave truncated completions out of the loss (DAPO)."""
    sync_ref_model: bool = False
    """Refresh the reference model every ref_model_sync_steps (grpokit copies: needs ref_model_mixup_alpha=1.0)."""
    ref_model_mixup_alpha: float = 0.6
    """TR-DPO mix of policy into reference; grpokit carries out only 1.0 (a copy)."""
    ref_model_sync_steps: int = 512
    """Steps between reference refreshes."""
    top_entropy_quantile: float = 1.0
    """Train only on this top fraction of tokens by entropy."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient (TRL's plain token mean); with use_adaptive_entropy the starting coefficient."""
    use_adaptive_entropy: bool = False
    """Skywork-OR1 adaptive entropy control: after each optimizer step the coefficient rises by entropy_coef_delta when the loss tokens' mean entropy was at or below entropy_target, else falls by it; the next step applies it only while that entropy is at or below the target."""
    entropy_coef_min: float = 0.0
    """Adaptive entropy control: lowest coefficient."""
    entropy_coef_max: float = 1.0
    """Adaptive entropy control: highest coefficient."""
    entropy_coef_delta: float = 0.005
    """Adaptive entropy control: change of the coefficient per optimizer step."""
    entropy_target: float = 0.2
    """Adaptive entropy control: target mean token entropy (nats)."""
    max_tool_calling_iterations: int | None = None
    """Most tool-calling rounds per episode (None: grpokit's env.max_turns)."""
    off_policy_mask_threshold: float | None = None
    """DeepSeek-V3.2 off-policy sequence masking threshold."""
    use_bias_correction_kl: bool = True
    """Multiply the KL term by the importance ratio (DeepSeek-V3.2)."""
    run_name: str | None = None
    """Name of the run in the trackers (report_to); None: the output_dir's name."""
    per_device_eval_batch_size: int = 8
    """Completions per evaluation batch (evaluate() samples batch / num_generations_eval prompts at a time)."""
    num_generations_eval: int | None = None
    """Completions per eval prompt (None: num_generations)."""
    eval_on_start: bool = False
    """Evaluate once before the first step."""
    gradient_checkpointing_kwargs: dict | None = None
    """Options of gradient checkpointing; grpokit's checkpointing is non-reentrant, so only use_reentrant=False (or None) is taken."""
    logging_strategy: str = "steps"
    """"steps" (log every logging_steps), "epoch" (at the end of every epoch and of training) or "no"."""
    logging_first_step: bool = False
    """Also log the first step."""
    resume_from_checkpoint: str | None = None
    """A checkpoint (or output_dir) train() resumes from when it is called without one."""
    tf32: bool | None = None
    """TF32 matmuls on Ampere and newer GPUs (None: PyTorch's setting)."""
    dataloader_num_workers: int = 0
    """Accepted for TRL scripts: grpokit holds the prompts in memory and has no DataLoader to parallelise."""
    dataloader_pin_memory: bool = True
    """Accepted for TRL scripts: no DataLoader (see dataloader_num_workers)."""
    dataloader_persistent_workers: bool = False
    """Accepted for TRL scripts: no DataLoader (see dataloader_num_workers)."""
    dataloader_prefetch_factor: int | None = None
    """Accepted for TRL scripts: no DataLoader (see dataloader_num_workers)."""
    steps_per_generation: int | None = None
    """Optimizer steps' worth of micro-batches sampled at once (None: gradient_accumulation_steps); one generation batch feeds steps_per_generation / gradient_accumulation_steps optimizer steps (not a whole number: an optimizer step may span two generation batches, as TRL's loop)."""
    generation_batch_size: int | None = None
    """Completions sampled at once (None: per_device_train_batch_size * steps_per_generation * processes); set it or steps_per_generation, not both."""
    log_completions: bool = False
    """Write prompts with their completions (samples.jsonl) every logging_steps."""
    num_completions_to_print: int | None = None
    """Completions per sample dump with log_completions (rounded up to whole groups; None: grpokit's 2 prompts)."""
    log_unique_prompts: bool = False
    """Accepted: grpokit's samples already hold each prompt once, with its group of completions."""
    delta: float | None = None
    """Two-sided clipping: the ratio of a negative-advantage token is capped at delta (must exceed 1 + epsilon_high; None: off)."""
    vespo_k_pos: float = 2.0
    """loss_type='vespo': shape k of the gamma weight where the advantage is >= 0."""
    vespo_lambda_pos: float = 3.0
    """loss_type='vespo': rate lambda of the gamma weight where the advantage is >= 0."""
    vespo_k_neg: float = 3.0
    """loss_type='vespo': shape k of the gamma weight where the advantage is < 0."""
    vespo_lambda_neg: float = 2.0
    """loss_type='vespo': rate lambda of the gamma weight where the advantage is < 0."""
    multi_objective_aggregation: str = "sum_then_normalize"
    """"sum_then_normalize" (weighted sum, then the group baseline) or "normalize_then_sum" (GDPO: each reward normalised in its group, summed, then whitened over the batch)."""
    use_liger_kernel: bool = False
    """Accepted; no effect on the math: grpokit's log-probs are already computed in chunks without the full logits tensor."""
    torch_compile: bool = False
    """torch.compile the model for the training passes (grpokit: the backbone of the log-probability passes; sampling stays eager)."""
    torch_compile_backend: str | None = None
    """torch.compile backend with torch_compile (None: inductor); setting it turns torch_compile on, as transformers."""
    torch_compile_mode: str | None = None
    """torch.compile mode with torch_compile (None: default); setting it turns torch_compile on, as transformers."""
    pad_to_multiple_of: Any = "auto"
    """Accepted; no effect: padding changes no log-prob, loss or gradient (grpokit chooses its own padding or packing)."""
    optim_args: str | None = None
    """"key=value,..." options of sgd (momentum, dampening, nesterov), adagrad (lr_decay, eps) and rmsprop (momentum, alpha, eps, centered), read as transformers; the other optimizers ignore it, as transformers."""
    lr_scheduler_kwargs: dict | None = None
    """Options of lr_scheduler_type's schedule, as transformers' get_scheduler takes them (e.g. {"min_lr_rate": 0.1} with cosine_with_min_lr); a JSON string is parsed."""
    accelerator_config: Any = None
    """Accepted; no effect: it configures accelerate's DataLoader dispatch, and grpokit has neither."""
    fsdp: Any = None
    """"full_shard" (with or without "auto_wrap"), or True: FSDP2 sharding (train.fsdp, needs torchrun); other FSDP options are refused."""
    cast_lm_head_to_fp32: bool = False
    """ScaleRL: the output layer (weights and logits) of the policy and reference in float32 (model.lm_head_fp32)."""
    neftune_noise_alpha: float | None = None
    """NEFTune noise on the input embeddings during training steps (None: off); model.neftune_noise_alpha."""
    router_aux_loss_coef: float | None = None
    """Mixture-of-Experts router load-balancing loss weight (None: the model config's own; 0: off); refused for a model without a router."""
    fsdp_config: dict | None = None
    """Only None, {} or {"fsdp_version": 2} (grpokit's FSDP is FSDP2)."""

    # run management (data order, checkpoints, best model, evaluation delay, vLLM engine size)
    data_seed: int | None = None
    """Accepted as TRL 1.16 takes it: TRL's GRPO prompt sampler is seeded by seed, so data_seed changes no prompt order there or here."""
    save_only_model: bool = False
    """Checkpoints hold the model and trainer_state.json only (no optimizer, schedule or RNG state); a resume from one loads the weights with a fresh optimizer and schedule, as transformers."""
    load_best_model_at_end: bool = False
    """After training, load the weights of the checkpoint with the best metric_for_best_model (needs eval_strategy = save_strategy = "steps", save_steps a multiple of eval_steps)."""
    metric_for_best_model: str | None = None
    """Evaluation metric that ranks checkpoints, with or without the "eval_" prefix (None: "loss" with load_best_model_at_end)."""
    greater_is_better: bool | None = None
    """Whether a larger metric_for_best_model is better (None: True unless the metric's name ends with "loss")."""
    eval_delay: float = 0
    """No evaluation by eval_strategy before this many TRL steps."""
    vllm_tensor_parallel_size: int = 1
    """GPUs per vLLM engine: in colocate mode each group of this many consecutive processes shares one engine (must divide their number); in server mode the server's own --tensor-parallel-size decides (as TRL)."""
    vllm_max_model_length: int | None = None
    """Colocate mode: the engine's max_model_len, prompt plus completion tokens (None: the model's own)."""
    vllm_importance_sampling_cap: float | None = None
    """Deprecated alias of vllm_importance_sampling_clip_max (TRL 1.16): when set, it replaces it."""
    do_train: bool = False
    """Accepted; no effect, as in transformers (a flag for scripts, which the Trainer does not read)."""
    do_eval: bool = False
    """Accepted; no effect, as in transformers (set True when eval_strategy is not "no", as transformers does)."""
    do_predict: bool = False
    """Accepted; no effect, as in transformers (a flag for scripts)."""
    torch_empty_cache_steps: int | None = None
    """Empty the CUDA cache (torch.cuda.empty_cache) at the steps whose number of completed steps is a multiple of this (None: never)."""
    log_level: str = "passive"
    """transformers' log verbosity on the main process: "debug", "info", "warning", "error", "critical" ("passive": unchanged)."""
    log_level_replica: str = "warning"
    """transformers' log verbosity on the other processes (same values; "passive": unchanged)."""
    project: str = "huggingface"
    """Trackio project of the run (with report_to trackio), as transformers."""
    use_cache: bool = False
    """Accepted; no effect on any number: TRL only sets model.config.use_cache (a KV cache while sampling is speed, not a number)."""
    activation_checkpointing: bool | None = None
    """transformers 5's name of gradient_checkpointing: when set (not None) it decides, as transformers resolves the alias."""
    activation_checkpointing_kwargs: dict | None = None
    """transformers 5's name of gradient_checkpointing_kwargs: when set it decides (only use_reentrant=False)."""
    hub_revision: str | None = None
    """Branch of hub_model_id that push_to_hub and the checkpoint pushes commit to (None: main); it must exist, as with transformers."""
    hub_always_push: bool = False
    """Accepted; grpokit's checkpoint pushes are synchronous, so none is ever skipped (what True asks transformers for)."""
    average_tokens_across_devices: bool = True
    """Accepted; no effect, as in TRL's GRPO, whose loss uses its own gathered token counts (grpokit: the whole batch's)."""
    ignore_data_skip: bool = False
    """On resume, start the prompts at the beginning of the current epoch instead of where the checkpoint left them, as transformers."""
    include_num_input_tokens_seen: Any = "no"
    """"no" (or False); "all", "non_padding" (or True): every log entry gets num_input_tokens_seen (TRL's running num_tokens) and training entries train_runtime and train_tokens_per_second, as transformers under TRL."""
    ddp_timeout: int = 1800
    """Under torchrun: seconds a collective may wait for the other processes (transformers' process-group timeout)."""
    trackio_space_id: str | None = None
    """Hugging Face Space that hosts the Trackio dashboard (with report_to trackio); accepted without effect when nothing reports to trackio, as transformers reads it only in its Trackio callback."""
    trackio_bucket_id: str | None = None
    """Hugging Face bucket of the Trackio logs (with report_to trackio); accepted without effect when nothing reports to trackio."""
    trackio_static_space_id: Any = None
    """Static Trackio Space frozen at the end of training (with report_to trackio); accepted without effect when nothing reports to trackio."""
    use_transformers_continuous_batching: bool = False
    """Sample with a continuous-batching engine: grpokit's own decode loop, which already drops finished rows from the batch (the same sampling distribution; TRL refuses it for vision models, and so does grpokit)."""
    transformers_continuous_batching_config: Any = None
    """transformers' ContinuousBatchingConfig keywords (memory and block sizes of its paged cache): checked as transformers checks them; grpokit's decode loop has no paged cache to size."""
    use_transformers_paged: bool = False
    """Deprecated alias of use_transformers_continuous_batching (TRL 1.16): True sets it, with TRL's FutureWarning."""
    cache_implementation: str | None = None
    """The KV cache of sampling, as TRL's generation_config: "static" (rollout.engine static), "dynamic" (engine dynamic), another transformers cache ("offloaded", "sliding_window" ...) samples through model.generate with it (engine generate); None: grpokit's choice."""
    label_smoothing_factor: float = 0.0
    """Accepted; no effect, as in TRL's GRPO: transformers applies it in Trainer.compute_loss, which GRPOTrainer replaces."""
    liger_kernel_config: dict | None = None
    """Accepted; no effect, as use_liger_kernel (grpokit never builds the full logits tensor that Liger's kernels save)."""
    prediction_loss_only: bool = False
    """Accepted; no effect, as in TRL's GRPO: its prediction_step returns the loss only, always."""
    eval_do_concat_batches: bool = True
    """Accepted; no effect, as in TRL's GRPO (evaluate() gathers no predictions to concatenate)."""
    eval_use_gather_object: bool = False
    """Accepted; no effect, as in TRL's GRPO (no predictions to gather)."""
    eval_accumulation_steps: int | None = None
    """Accepted; no effect, as in TRL's GRPO (no predictions to move off the device)."""
    include_for_metrics: list = dataclasses.field(default_factory=list)
    """Accepted; no effect, as in TRL's GRPO (GRPOTrainer takes no compute_metrics)."""
    batch_eval_metrics: bool = False
    """Accepted; no effect, as in TRL's GRPO (GRPOTrainer takes no compute_metrics)."""
    dataloader_drop_last: bool = False
    """Accepted; no effect, as in TRL's GRPO: the RepeatSampler already yields whole generation batches only (see max_steps)."""
    dataloader_multiprocessing_context: str | None = None
    """Accepted; no effect, as dataloader_num_workers (grpokit holds the prompts in memory, no DataLoader workers)."""
    label_names: list | None = None
    """Accepted; no effect, as in TRL's GRPO (its inputs carry no labels)."""
    train_sampling_strategy: str = "random"
    """Accepted; no effect, as in TRL's GRPO: its RepeatSampler replaces transformers' sampler (shuffle_dataset decides the order)."""
    length_column_name: str = "length"
    """Accepted; no effect, as in TRL's GRPO (it names group_by_length's column, which its sampler does not read)."""
    ds3_gather_for_generation: bool = True
    """Accepted; no effect: TRL reads it under DeepSpeed ZeRO-3 only, which grpokit does not run (deepspeed is refused)."""
    log_multimodal: bool = True
    """Accepted; no effect: grpokit's samples.jsonl keeps the completions' text, never their images."""
    log_on_each_node: bool = True
    """Accepted; grpokit logs on global rank 0 only (transformers' log_on_each_node=False); on one node both are the same."""
    dataloader_in_order: bool = True
    """Accepted; no effect, as dataloader_num_workers (it orders the batches of DataLoader workers, which grpokit has none of)."""
    ddp_find_unused_parameters: bool | None = None
    """Accepted; no effect: grpokit all-reduces the gradients itself (train/distributed.py), with no DistributedDataParallel wrapper to configure."""
    ddp_bucket_cap_mb: int | None = None
    """Accepted; no effect (no DistributedDataParallel wrapper: see ddp_find_unused_parameters)."""
    ddp_broadcast_buffers: bool | None = None
    """Accepted; no effect (no DistributedDataParallel wrapper; every rank loads the same buffers from the same weights)."""
    ddp_static_graph: bool | None = None
    """Accepted; no effect (no DistributedDataParallel wrapper: see ddp_find_unused_parameters)."""
    local_rank: int = -1
    """Accepted as transformers' launchers pass it; grpokit reads the process's rank from LOCAL_RANK, as transformers does when it is set."""

    def __init__(self, output_dir: str | None = None, **kwargs: Any):
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, f.default_factory() if f.default is dataclasses.MISSING else f.default)
        for name, default in UNSUPPORTED.items():  # readable as on TRL's (scripts read e.g. resume_from_checkpoint)
            object.__setattr__(self, name, copy.deepcopy(default))
        self.output_dir = "trainer_output" if output_dir is None else output_dir  # transformers 5 fills it in
        for name, value in kwargs.items():
            setattr(self, name, value)
        if self.load_best_model_at_end and self.metric_for_best_model is None:  # transformers' defaults, filled in
            self.metric_for_best_model = "loss"
        if self.greater_is_better is None and self.metric_for_best_model is not None:
            self.greater_is_better = not self.metric_for_best_model.endswith("loss")
        if self.eval_strategy != "no":
            self.do_eval = True

    def __setattr__(self, name: str, value: Any) -> None:
        """Arguments set after construction (``args.model_init_kwargs = ...``, as TRL's scripts do) get
        the same checks as constructor arguments: nothing set on the config is silently ignored."""
        if name in UNSUPPORTED:
            if not _same(value, UNSUPPORTED[name]):
                raise ConfigError(f"GRPOConfig argument {name}={value!r} is not supported by grpokit; "
                                  f"leave it at TRL's default {UNSUPPORTED[name]!r} (docs/TRL.md lists what is supported)")
        elif name not in _FIELDS:
            raise ConfigError(f"GRPOConfig got {name!r}, which is not an argument of TRL 1.16's GRPOConfig")
        check(name, value, _ANNOTATIONS.get(name, ""))
        if name == "scale_rewards":
            value = {True: "group", False: "none"}.get(value, value)
        object.__setattr__(self, name, value)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


_FIELDS = frozenset(f.name for f in dataclasses.fields(GRPOConfig))
_ANNOTATIONS = {f.name: str(f.type) for f in dataclasses.fields(GRPOConfig)}  # "bool", "str | None" ... (checks.py)


def _same(value: Any, default: Any) -> bool:
    try:
        return bool(value == default) or (value in (None, [], "", {}) and default in (None, [], "", {}))
    except Exception:  # an object that cannot be compared is not the default
        return False


# TRL 1.16 GRPOConfig arguments grpokit does not carry out, with TRL's defaults (accepted only at them).
UNSUPPORTED: dict[str, Any] = {
    "optim_target_modules": None, "bf16_full_eval": False, "fp16_full_eval": False,
    "auto_find_batch_size": False, "logging_nan_inf_filter": True,
    "save_on_each_node": False, "enable_jit_checkpoint": False, "restore_callback_states_from_checkpoint": False,
    "parallelism_config": None, "ddp_backend": None, "deepspeed": None, "debug": "", "skip_memory_metrics": True,
    "vllm_model_impl": "vllm", "vllm_structured_outputs_regex": None, "vllm_group_port": 51216,
    "log_completions_hub_repo": None,
}
