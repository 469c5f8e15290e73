"""Typed configuration: one dataclass per pipeline stage, a docstring under every field.

The dataclass defaults are those of a real run on a user's model (512 new tokens, lr 1e-6, a
checkpoint every 100 steps, evaluation on the user's own held-out data or none). The model and task
default to the built-in demo, whose own settings (8 new tokens, lr 3e-4, 60 steps) live with the task
(``grpokit.data.tasks``) and fill only the fields nobody set, and only while the demo runs
(``train.run_data.resolve_run``). For that every section remembers which of its fields were assigned
(``config_io.assigned``): by its constructor, by attribute, by YAML or by an override.

A run's config is built in layers, each overriding the last: the defaults, an optional preset
(``--preset``, which fills only what the user left alone), an optional YAML file (``--config F``) and
dotted command-line overrides (``rollout.group_size=16``). The fully resolved config is saved as
``config.yaml`` in the run folder. Building a config from dicts, YAML and overrides is in io.py.

``grpokit.validation.validate`` checks every value before any work starts and raises
``ConfigError`` with one sentence that names the field, the value and what would be valid.
``ConfigError`` and the ``section`` decorator live in base.py; the optim section, with every optimizer's
and schedule's options, in optim.py; the rollout and algo sections in rollout.py and algo.py (all of
them importable from here).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .algo import AlgoConfig
from .base import ConfigError, section  # noqa: F401  (ConfigError: imported from here across grpokit)
from .health import HealthConfig
from .optim import OptimConfig
from .rollout import RolloutConfig


@section
class ModelConfig:
    name_or_path: str = "demo"
    """Model to train: "demo" (the tiny model shipped with grpokit), a local folder, or a hub id."""
    dtype: str = "auto"
    """Weights and compute dtype: "auto" (float32 on CPU, bfloat16 on GPU), "float32", "bfloat16" or "float16"."""
    attn_implementation: str = "auto"
    """Attention kernel of the model's forward passes, passed to from_pretrained: "auto" (transformers' choice, sdpa
    where it can), "eager", "sdpa", "flash_attention_2", "flash_attention_3" or "flex_attention" (the flash ones need
    their package and a GPU). The static decode engine's one-token attention is its own either way
    (rollout/static.py)."""
    device: str = "auto"
    """Device: "auto" (cuda when available, else cpu), "cpu", "cuda" or "cuda:N"."""
    trust_remote_code: bool = False
    """Allow model code from the hub (only for models you trust)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    autocast: str = "auto"
    """Mixed-precision compute: "auto" (bfloat16 autocast on GPU when the weights are float32, off on CPU), "bfloat16"
    or "off". No "float16": float16 autocast needs dynamic loss scaling (a GradScaler), which grpokit does not have,
    or its small gradients underflow to 0."""
    cpu_matmul: str = "auto"
    """float32 linear layers on CPU: "onednn" (oneDNN kernels, faster than MKL on AMD CPUs), "torch" (F.linear as is),
    or "auto" (oneDNN on non-Intel x86 CPUs such as AMD EPYC/Ryzen, torch elsewhere and with model.compile)."""
    lora_rank: int = 0
    """LoRA rank r (0 = full fine-tuning); with r > 0 only the adapters train and the reference policy is the base with
    adapters disabled (or, for a model given with a trained adapter, that adapter as given)."""
    lora_alpha: float = 32.0
    """LoRA scaling numerator: the adapter update is (lora_alpha / lora_rank) * B @ A."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA input path (0 keeps training logprobs equal to the old-policy logprobs); > 0 needs
    model.disable_dropout=false."""
    lora_target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    """Modules that get adapters: ["all-linear"] (every linear layer but the output head), module names like [q_proj,
    v_proj], or both ([all-linear, lm_head]); a name that matches no module of the model is refused."""
    lora_save: str = "adapter"
    """What checkpoints hold in model/: "adapter" (the PEFT adapter alone) or "merged" (a plain Hugging Face model with
    adapters merged; the adapter is kept in adapter/ for resume)."""
    disable_dropout: bool = True
    """Set every dropout probability of the policy to 0 when it is built (torch's dropout modules, LoRA's included,
    and transformers' attention_dropout; train/model_options.py). pi_old and the reference are taken in eval mode and
    the update runs in train mode, so with dropout on the ratio pi / pi_old is not 1 even before the first update of
    a batch and the clip acts on dropout noise. false: train with the model's own dropout (TRL's default,
    disable_dropout=False)."""
    quantization: str = "none"
    """QLoRA: "4bit" loads the frozen base in NF4 with bitsandbytes (needs CUDA and lora_rank > 0), or "none"."""
    freeze_vision: bool = True
    """Vision-language models: keep the vision tower (image encoder and its merger) frozen, as VLM-R1 does, and give it
    no LoRA adapter under all-linear; false trains it too (LoRA: all-linear then adapts its linear layers as well,
    PEFT's meaning; docs/VISION.md). The TRL layer sets false: TRL freezes nothing."""
    lm_head_fp32: bool = False
    """ScaleRL (TRL's cast_lm_head_to_fp32): the output layer's weights and logits in float32 while the rest of the
    model is in model.dtype (a tied head makes the shared embedding weight float32 too); needs lm_head without a LoRA
    adapter."""
    neftune_noise_alpha: float = 0.0
    """NEFTune: uniform noise of size alpha / sqrt(sequence length * hidden size) added to the input embeddings during
    training steps (sampling with the hf backend, log-probabilities and update, as TRL's GRPO), never in evaluation; 0 =
    off (the paper uses 5)."""
    kernels: str = "auto"
    """The layers' RMSNorm, SwiGLU and rotary embedding: "auto" (liger-kernel's where CUDA, the liger-kernel package
    and a model family it patches are at hand, the model's own code otherwise), "liger" (require liger-kernel's fused
    Triton kernels, as TRL's use_liger_kernel patches them: one kernel where the model runs several) or "torch" (the
    model's own code). Speed only: values agree with the model's own to the rounding of its dtype; an H100 0.5B GRPO
    step took 7.25 s with them, 8.76 s without (train/liger.py, bench/RESULTS.md)."""
    vocab_kernels: str = "auto"
    """The passes over the vocabulary at both ends of a step: sampling's draw from the decode step's logits and the
    output layer's log-softmax and its gradient in the update. "auto" (grpokit's Triton kernels, one pass over the
    logits each where torch runs several, on CUDA with Triton importable; torch's ops otherwise), "triton" (require
    them) or "torch". The same distribution and values to float32 rounding; sampling draws from another random
    stream than torch's (nn/vocab.py)."""
    compile: bool = False
    """torch.compile the model's backbone for the log-probability passes (the policy's old-log-prob pass and the
    update's forward and backward; TRL's torch_compile); sampling and the reference model stay eager, as
    transformers compiles the training model only. The same values, speed only; the first steps pay the compile."""
    compile_backend: str = "inductor"
    """torch.compile backend with model.compile (TRL's torch_compile_backend): inductor, aot_eager, eager, cudagraphs
    ...; refused without model.compile."""
    compile_mode: str = "default"
    """torch.compile mode with model.compile (TRL's torch_compile_mode): default, reduce-overhead, max-autotune,
    max-autotune-no-cudagraphs."""
    router_aux_loss_coef: float = 0.0
    """Mixture-of-Experts models: weight of the router's load-balancing loss added to the training loss (0 = off; -1 =
    the model config's own router_aux_loss_coef, TRL's default); refused for a model without a router."""


@section
class DataConfig:
    task: str = "arithmetic"
    """Built-in task that provides prompts, answers, reward and held-out set ("arithmetic", "calculator", "shapes":
    images, docs/VISION.md), or reasoning-gym's tasks: "reasoning_gym:<name>", mixed as "reasoning_gym:a=2,b=1"
    (docs/TASKS.md); unused once `dataset` is set."""
    task_params: dict = field(default_factory=dict)
    """A reasoning_gym task's config (its reasoning-gym config fields; for a mixture one mapping per task name), plus
    "instruction": the sentence appended to each question; refused beside data.dataset, which replaces the task."""
    dataset: str = ""
    """One's own training data: a .jsonl/.json/.parquet/.csv file or a `datasets` hub name (replaces the task: its rows,
    reward and held-out set)."""
    split: str = "train"
    """Split to train on, of a hub dataset or a save_to_disk DatasetDict folder (one the folder lacks is refused); a
    single file, image folder or saved Dataset has no splits, so only the default is accepted for it; refused without
    data.dataset."""
    eval_dataset: str = ""
    """Held-out data for evaluation (file or hub name); empty: the built-in task's held-out split, or none with one's
    own data."""
    eval_split: str = "test"
    """Split of eval_dataset, as `split` is of dataset (a single file: only the default is accepted); refused without
    eval_dataset."""
    prompt_column: str = "prompt"
    """Column of data.dataset and data.eval_dataset holding the prompt text (or a list of chat messages); refused
    when neither is set (config/data_sources.py)."""
    answer_column: str = "answer"
    """Column of data.dataset and data.eval_dataset holding the gold answer; reward functions receive it as `answer`
    and under its own name (empty: none); refused when neither is set."""
    system_prompt: str = ""
    """System message prepended when a chat template is applied; refused when a prompt would not go through one
    (no template, chat_template=never, a plain-text prompt with conversational) or when a row carries a system
    message of its own (a conversation has one), where it would be dropped."""
    chat_template: str = "auto"
    """"auto" (apply the tokenizer's chat template when it has one; chat-message prompts without one are refused),
    "always", "never" (prompts as written; a list of chat messages becomes its contents joined one a line, roles
    dropped), or "conversational" (only to prompts that are lists of chat messages; plain-text prompts are used as
    written, as TRL does)."""
    chat_template_kwargs: dict = field(default_factory=dict)
    """Extra keyword arguments of the tokenizer's apply_chat_template, e.g. {enable_thinking: false} (TRL's
    chat_template_kwargs); refused when no prompt goes through the template."""
    eval_size: int = 500
    """At most this many held-out prompts (data.eval_dataset's, or the task's) are evaluated before and after training
    (0 disables evaluation): greedy, with the rollout section's other settings (max_new_tokens, stop,
    repetition_penalty), as `grpokit eval` reads them from the run."""
    shuffle: bool = True
    """Shuffle the training prompts each epoch (seeded)."""
    drop_last: bool = False
    """Serve whole batches of train.prompts_per_step only, as TRL's RepeatSampler (grpokit.trl sets it): the prompts
    after an epoch's last whole batch are left out of that epoch (the next epoch draws its order anew), and fewer rows
    than one batch are refused. false: batches run on across an epoch's end, every prompt once an epoch (with fewer
    rows than a batch, a batch repeats a prompt: warned once). Read by the plain order only (not with data.domains or
    data.curriculum=frontier)."""
    domains: dict = field(default_factory=dict)
    """Several named domains in one run (docs/DOMAINS.md): {name: {task | dataset, share, reward_functions,
    reward_weights, reward_params, eval_size, ...}}; each brings its own rows, rewards and held-out set, mixed into
    every batch by share; replaces data.task and data.dataset. Empty: one task or dataset, as above."""
    curriculum: str = "off"
    """Prompt sampling (docs/DOMAINS.md): "off" (each prompt once per epoch) or "frontier" (prompts drawn with
    weight 1 - p^G - (1-p)^G, the chance that a group of G has two different outcomes, from each prompt's recent
    pass rate p)."""
    curriculum_key: str = ""
    """With curriculum=frontier: the column whose value buckets prompts for the pass rate (e.g. a difficulty
    column); empty: every prompt is its own bucket."""
    curriculum_threshold: float = 1.0
    """With curriculum=frontier: a completion passes when its judged value is at least this (reward.judge's
    functions summed; with reward.judge empty, the reward as trained)."""
    curriculum_decay: float = 0.5
    """With curriculum=frontier: how much of a bucket's earlier counts each new group keeps (0 = only the last
    group; 1 = all history, equally)."""
    curriculum_floor: float = 0.05
    """With curriculum=frontier: the smallest weight of a bucket (a solved or hopeless prompt is still drawn now
    and then, so its pass rate can move)."""


# How every data.* field stands beside data.domains (docs/DOMAINS.md), one rule a field: data/domains.py reads
# the domains by this table, presets fill no field it gives the domains, and tests/data/test_domain_config.py
# checks that every DataConfig field has a rule (a new field cannot be forgotten).
BESIDE_DOMAINS: dict[str, str] = {
    # a domain's own key only: the domains replace the run's value, so a run value beside them is refused (it
    # would reach no domain, or every domain alike: one held-out file for every domain's grader)
    **dict.fromkeys(("task", "task_params", "dataset", "eval_dataset"), "own"),
    # a domain's key of the same name: a domain that leaves it out takes the run's value
    **dict.fromkeys(("split", "eval_split", "eval_size", "prompt_column", "answer_column"), "inherited"),
    # the run's one setting, for every domain's prompts alike (no domain key)
    **dict.fromkeys(("system_prompt", "chat_template", "chat_template_kwargs", "shuffle", "drop_last"), "shared"),
    **dict.fromkeys(
        ("curriculum", "curriculum_key", "curriculum_threshold", "curriculum_decay", "curriculum_floor"), "shared"
    ),
    "domains": "domains",
}


def beside_domains(rule: str) -> tuple[str, ...]:
    """The data.* fields of ``rule`` in BESIDE_DOMAINS ("own", "inherited", "shared"), in its order."""
    return tuple(name for name, r in BESIDE_DOMAINS.items() if r == rule)


@section
class RewardConfig:
    functions: list[str] = field(default_factory=lambda: ["task"])
    """Reward functions: built-in names, "module:function" import paths, or "task" for the task's own reward."""
    weights: list[float] = field(default_factory=list)
    """One weight per function (empty: all 1.0); the reward is the weighted sum over applicable functions."""
    timeout_s: float = 30.0
    """Per-call time limit of a reward function; a call that runs over gets `failure_value`."""
    failure_value: float = 0.0
    """Reward given to a completion whose reward call raised or timed out."""
    max_failure_fraction: float = 0.5
    """Stop the run when more than this fraction of a step's reward calls fail."""
    num_workers: int = 0
    """Worker processes for reward functions (0 = run in the trainer's process, still with timeouts)."""
    params: dict = field(default_factory=dict)
    """Keyword arguments per built-in function, e.g. {overlong_penalty: {max_length: 16, cache_length: 4}}."""
    judge: list[str] = field(default_factory=list)
    """The reward functions that say whether a completion is right, wherever grpokit asks: dynamic sampling keeps a
    group whose judged values differ, the frontier curriculum counts a pass at data.curriculum_threshold, EDGE-GRPO
    corrects a group judged at most algo.error_correction_max_reward. The judged value is the sum of these
    functions' own values (unweighted, as rewards/<name>/mean logs them; a name as reward.functions or the metrics
    give it, or "task": the run's own reward, the task's verifier, or on one's own data the functions passed to the
    Trainer). Empty: the reward as trained, shaping terms included (a format bonus then makes a wrong answer pass).
    Also spelled algo.dynamic_sampling_on. GFPO ranks by the reward as trained (docs/VARIANTS.md)."""
    normalize_components: bool = False
    """Multi-objective (MO-GRPO): normalise each function's reward within its group before the weighted sum."""
    process_function: str = ""
    """Process reward for algo.advantage=process: "task" or "module:function" returning (end token, reward) steps."""
    convention: str = "grpokit"
    """What reward functions receive as prompts and completions: "grpokit" (the prompt text as the model saw it,
    completions as text) or "trl" (TRL's GRPOTrainer: prompts as the dataset holds them, and for chat-message prompts
    each completion as [{"role": "assistant", "content": ...}]; a returned NaN means None, not applicable, as TRL
    reads it, where under "grpokit" it is the function's failure; a dataset column named completion is not passed)."""


@section
class EnvConfig:
    tools: list[str] = field(default_factory=list)
    """Tools the model may call in multi-turn episodes: built-in "calculator" / "python" (sandboxed code) or
    "module:function" (typed, with a docstring)."""
    environment: str = ""
    """Environment class for episodes, "module:Class" (TRL's environment_factory: reset(**row), public methods are
    tools, optional get_reward and done)."""
    max_turns: int = 4
    """Most model turns per episode when tools or an environment are set (without either an episode is one turn); the
    last allowed turn's tool calls are not run (finish reason "turns", as TRL's max_tool_calling_iterations). 0 = no
    turn limit: an episode runs until the model answers or max_episode_tokens is reached (TRL's
    max_tool_calling_iterations=None)."""
    max_episode_tokens: int = 8192
    """Cap on an episode's tokens after the prompt, model and environment together (0 = none; rollout.max_new_tokens
    caps each turn)."""
    tool_format: str = "auto"
    """How calls and results are written: "chat_template" (the tokenizer's tool format), "tags"
    (<tool_call>..</tool_call>, <tool_result>..</tool_result>; the prompt does not list the tools) or "auto"
    (chat_template when the tokenizer's template shows tools; one that ignores them, or cannot write the tokens
    after a tool call because it renders earlier turns differently once a tool message follows, falls back to tags
    with a warning, and is refused with chat_template; Qwen3's gets grpokit's rewrite for those tokens instead)."""
    tool_timeout_s: float = 10.0
    """Time limit of one tool call; a call that runs over becomes an error message in the episode."""
    episode_timeout_s: float = 60.0
    """Total tool time of one episode; when used up the episode ends (finish reason "timeout")."""
    max_tool_output_chars: int = 1000
    """Longest tool result shown to the model in characters (longer ones are cut and marked, counted in
    tools/truncated_frequency and warned about once; 0 = no cap, as TRL, which cuts none)."""
    max_tool_nesting: int = 20
    """Deepest bracket nesting of a tool call's JSON arguments and of a tool's result; deeper ones become an error
    message (0 = no cap)."""
    reset_timeout_s: float = 30.0
    """Time limit of one environment reset() (with its constructor); a batch's resets run side by side, so hung ones
    cost one limit, not one each; a reset that raises or runs over starts that prompt's episodes from the bare
    prompt. It also bounds building the one environment that lists the tools at start."""
    max_observation_chars: int = 8000
    """Longest reset() observation joined to the prompt in characters (longer ones are cut and marked, counted in
    episodes/observations_truncated and warned about once; 0 = no cap)."""
    max_failure_fraction: float = 0.5
    """Stop the run (one sentence) when environment resets fail, or tool calls run past env.tool_timeout_s, in more than
    this fraction of a batch's episodes."""
    allow_unsafe_code_execution: bool = False
    """Let the python tool run where the sandbox cannot isolate (rlimits only; it could read files and use the
    network)."""


@section
class TrainConfig:
    steps: int = 500
    """Number of training steps (each: rollout, rewards, advantages, num_iterations updates); the demo task runs 60."""
    prompts_per_step: int = 16
    """P: prompts per step; the batch holds P * group_size completions."""
    micro_batch_size: int = 0
    """Completions per forward/backward pass (0 = the whole batch); must divide P * group_size."""
    updates_per_batch: int = 1
    """Optimizer updates per pass over a sampled batch: its rows are cut, in order, into this many equal slices, one
    update each (a group may be split), num_iterations times; TRL's steps_per_generation / gradient_accumulation_steps
    (with accumulation_slices > 1: TRL's steps_per_generation, the slices a batch is cut into). Above 1, as TRL:
    pi_old comes from a pass at sampling (later slices follow an update, so their ratio and clipping act), and a
    token-summed loss (token-mean) divides by the batch's tokens / updates_per_batch, the same for every slice."""
    accumulation_slices: int = 1
    """Slices whose gradients make one optimizer update. 1: every slice is its own update. k > 1: the slices
    of successive batches form one stream (each batch's num_iterations passes, then the next batch) and every
    k consecutive slices make one update, so an update may span two sampled batches, and a batch is sampled
    from the weights of the last finished update (TRL's gradient_accumulation_steps when steps_per_generation
    is not a multiple of it). Each slice divides its loss by its rows x k sequences and by its batch's tokens x
    k / updates_per_batch tokens, TRL's normalisers. One process only (not with fsdp); no entropy bonus, no
    lambda-grpo."""
    max_updates: int = 0
    """Stop right after this many optimizer updates, even inside a step's batch (0: train.steps alone
    decides); grpokit.trl sets TRL's max_steps here."""
    accumulation_epoch_steps: int = 0
    """With accumulation_slices = k > 1: every this many steps (an epoch of the data) the pending update is
    applied even when it holds fewer than k slices, and those slices divide their loss by that shorter window;
    the next window starts with the next epoch (transformers closes each epoch so). 0: windows run on across epochs."""
    micro_batch_tokens: int = 0
    """Token cap of one forward/backward pass of the update (prompt + completion tokens; 0 = none):
    consecutive completions are cut into the fewest balanced micro-batches under it; same gradient."""
    activation_memory_mb: int = -1
    """Memory budget for the activations one forward/backward pass of the update keeps for backward
    (estimated from the model's shape: ~(10 x hidden + 4 x intermediate) values per token and layer);
    it becomes a token cap like micro_batch_tokens (the smaller wins). -1 = auto (a quarter of the
    memory free at start: the host's available memory on CPU, at least 512 MB; torch.cuda.mem_get_info
    on CUDA), 0 = no budget. Not applied with train.fsdp (ranks must run
    equal numbers of micro-batches)."""
    memory_plan: str = "auto"
    """"auto": at start, turn activation checkpointing on when one micro-batch's activations (micro_batch_size rows, or
    the whole batch, at the longest prompt + max_new_tokens) exceed activation_memory_mb, and keep the reference model
    (beta > 0, full fine-tuning) on CPU between its passes when the training state plus the reference would take over
    half of the GPU; one log line says what was chosen and why (train/memory.py). "manual": neither
    (model.gradient_checkpointing still applies)."""
    packing: str = "auto"
    """Padding-free log-prob and update passes (train/packing.py): "packed" packs each micro-batch's sequences end to
    end in one row with per-sequence positions (Llama/Qwen2/Qwen3/Mistral; others stay padded), "padded" keeps padded
    rows (with prompt sharing), "auto" = packed with CUDA, padded on CPU. A packed row of over 4096 tokens stays padded
    unless model.attn_implementation takes packed rows without a dense mask (flash_attention_2/3, flex_attention):
    SDPA and eager attention would build and compute an (S, S) mask for it. "prefix_tree" packs each micro-batch's
    sequences as a prefix tree (train/prefix_tree.py): a prefix several sequences share (the prompt, an episode's
    first turns) is computed once, with a 4-D mask that follows the tree, for the same values and gradients; it needs
    model.attn_implementation sdpa or eager and a Llama/Qwen2/Qwen3/Mistral model (refused otherwise), logs
    train/shared_prefix_tokens_saved, and a micro-batch of over 4096 distinct tokens runs padded."""
    seed: int = 0
    """Seed for data order, sampling and initialisation."""
    out: str = ""
    """Run folder (empty: a new folder under runs/)."""
    save_every: int = 100
    """Write a checkpoint every N steps and at the end (0 = only at the end, as the demo task does)."""
    keep_checkpoints: int = 2
    """How many step checkpoints to keep (the newest)."""
    save_last: bool = True
    """Write a checkpoint at the end of training (and when Ctrl-C stops it); False with save_every 0 writes none at all
    (TRL's save_strategy="no")."""
    save_only_model: bool = False
    """Checkpoints hold the model and the step only, no optimizer, schedule or RNG state (smaller); a resume from one
    loads the weights and starts a fresh optimizer and schedule, as transformers' save_only_model."""
    overwrite: bool = False
    """Start a new run in a folder that already holds one (train.out), deleting its checkpoints and
    records; without it such a start is refused (``grpokit train --overwrite`` sets it)."""
    move_earlier_run: bool = False
    """Start a new run in a folder that already holds one (train.out) by moving that run whole (its checkpoints,
    their links and its records) into ``<train.out>/earlier-runs/<time>/``, said in one printed line; nothing is
    deleted. The TRL layer sets it: TRL scripts reuse output_dir run after run (train.overwrite wins when set)."""
    stop_grace_s: float = 10.0
    """After SIGINT, SIGTERM, SIGUSR1 or SIGHUP (Ctrl-C, a cluster's preemption): how long the step in
    progress may still run before it is cut short (its sampling and scoring; an update under way always
    finishes), after which a checkpoint of the last finished step is written (docs/FAULTS.md)."""
    eval_every: int = 0
    """Evaluate on held-out prompts every N steps (0 = only before and after training)."""
    threads: int = 0
    """CPU threads for torch: 0 = auto (one thread for models under 20M parameters, whose small matmuls
    gain nothing from threads and lose up to 20x on a shared machine; torch's default otherwise)."""
    deterministic: bool = False
    """Use deterministic torch algorithms (bit-exact resume on CPU)."""
    fsdp: bool = False
    """Shard parameters, gradients and optimizer state across ranks with FSDP2 (for models that do not fit one device);
    needs torchrun."""
    dist_timeout_s: float = 0
    """Under torchrun: seconds a collective (all-reduce, barrier) may wait for the other ranks before the run fails (0 =
    torch's default)."""
    stages: list[dict] = field(default_factory=list)
    """Rounds (docs/DOMAINS.md): [{domain: name (or a list), steps: n, lr, group_size, max_new_tokens, temperature,
    reward_weights, teacher}, ...], run in order; every key but steps is optional (a stage without domain samples every
    domain by share; an override left out is the run's own value). train.steps becomes their sum. Empty: one stage."""


@section
class RecordConfig:
    sinks: list[str] = field(default_factory=lambda: ["console"])
    """Metric sinks besides the always-on metrics.jsonl: console, tensorboard, wandb, mlflow, trackio."""
    samples_every: int = 10
    """Write a few prompts with all their completions to samples.jsonl every N steps (0 = never)."""
    samples_prompts: int = 2
    """How many prompts (each with all G completions) go into each sample dump (refused with samples_every=0)."""
    samples_images: bool = True
    """Image prompts: each sample row's image written to images/ (scaled up, the gold box and each completion's box
    drawn) and named in the row's image column, for the report; false keeps the samples text only (TRL's
    log_multimodal)."""
    report: bool = True
    """Write report.html into the run folder when training ends."""
    console_every: int = 10
    """Without a terminal, the console prints one line per this many steps."""
    run_name: str = ""
    """Name of the run in the trackers (wandb, mlflow, trackio; refused without one); "" = the run folder's name."""
    project: str = ""
    """Project of the tracker runs (wandb project, mlflow experiment, trackio project); "" = "grpokit"."""


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    data: DataConfig = field(default_factory=DataConfig)
    """Prompts and answers (stage 1)."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Sampling of G completions per prompt (stage 2)."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Reward functions (stage 3)."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """Advantages and loss (stages 4 and 5): the GRPO family lives here."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """Tools and environments of multi-turn episodes (stage 2)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and schedule (stage 6)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """The loop: steps, batch sizes, seeds, checkpoints."""
    record: RecordConfig = field(default_factory=RecordConfig)
    """Metrics, samples and report (stage 7)."""
    health: HealthConfig = field(default_factory=HealthConfig)
    """Health monitors: thresholds of the alarms (stage 7)."""
