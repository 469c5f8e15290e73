"""The rollout section (stage 2): group size, sampling, engines, vLLM, TIS and mismatch masking."""

from __future__ import annotations

from dataclasses import field

from .base import section


@section
class RolloutConfig:
    group_size: int = 8
    """G: completions sampled per prompt."""
    max_new_tokens: int = 512
    """Maximum completion length in tokens; longer completions are cut (finish reason "length"). 512 is TRL's default;
    the demo task uses 8."""
    temperature: float = 1.0
    """Sampling temperature (> 0); training logprobs use the same temperature unless algo.loss_temperature sets
    another."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p (1.0 = off)."""
    top_k: int = 0
    """Keep only the k most likely tokens (0 = off)."""
    min_p: float = 0.0
    """Drop tokens whose probability is below min_p times the top token's (0 = off)."""
    repetition_penalty: float = 1.0
    """HF's repetition penalty (> 0; 1.0 = off): a token already in the prompt or the completion has its logit divided
    by it when positive, multiplied when not, before temperature. Sampling only (both hf engines; passed on to vLLM): on
    the hf engines the recorded sampling logprobs are of the penalised distribution (which ones vLLM reports is not
    checked here); the trained logprobs are not penalised (as TRL)."""
    stop: list[str] = field(default_factory=list)
    """Stop strings: a completion ends after the first token that completes one (finish reason "stop")."""
    max_prompt_tokens: int = 0
    """Longest prompt in tokens (0 = the model's context: max_position_embeddings, or vllm_max_model_len); every prompt
    is measured at start, and a longer one is refused in one sentence, or cut with truncate_prompts."""
    truncate_prompts: bool = False
    """Cut a prompt longer than max_prompt_tokens to its last max_prompt_tokens tokens (TRL's max_prompt_length, from
    the left) instead of refusing the run; how many were cut is logged once."""
    backend: str = "hf"
    """Rollout engine: "hf" (transformers, CPU or GPU), "vllm" (a vLLM engine on the trainer's GPU) or "vllm_server" (a
    vLLM server at vllm_url)."""
    engine: str = "auto"
    """backend=hf: the decode loop: "auto" (static where the model's shape allows, else dynamic), "static"
    (pre-allocated cache), "dynamic" (the model's own forward and DynamicCache), or "generate" (transformers'
    model.generate with rollout.generation_kwargs: beam search and the other GenerationConfig options; records no
    sampling logprobs, so the old logprobs come from the training pass)."""
    generation_kwargs: dict = field(default_factory=dict)
    """engine=generate: extra GenerationConfig settings on top of the sampling fields, e.g. {num_beams: 2,
    length_penalty: -0.1} (TRL's generation_kwargs); keys with a rollout field of their own (temperature, top_p, top_k,
    min_p, max_new_tokens, repetition_penalty, stop) are set there; a key that is no GenerationConfig setting (a typo
    transformers would keep unread) is refused, naming the closest; the other engines refuse generation_kwargs."""
    cuda_graphs: bool = True
    """backend=hf on CUDA: replay each decode step of the static engine as a CUDA graph (same tokens, far fewer kernel
    launches); false runs it eagerly."""
    sample_group_size: int = 0
    """GFPO: completions sampled per prompt before the best group_size are kept (0 = no oversampling)."""
    gfpo_criterion: str = "length"
    """GFPO: which completions to keep: "length" (shortest) or "token_efficiency" (highest reward per token)."""
    gfpo_adaptive: bool = False
    """GFPO adaptive: oversample only hard prompts (mean reward of the first group_size below the threshold)."""
    gfpo_adaptive_threshold: float = 0.5
    """GFPO adaptive: a prompt is hard when its first group_size samples average below this reward."""
    vllm_gpu_memory_utilization: float = 0.3
    """backend=vllm: fraction of the GPU memory the colocated engine may take (the trainer needs the rest)."""
    vllm_max_model_len: int = 0
    """backend=vllm: the colocated engine's context length in tokens, prompt plus completion (vLLM's max_model_len; 0 =
    the model's own)."""
    vllm_tensor_parallel_size: int = 1
    """backend=vllm: GPUs per colocated engine (vLLM tensor parallelism, TRL's vllm_tensor_parallel_size): each group of
    this many consecutive trainer ranks shares one engine sharded over their GPUs, which samples the group's prompts
    together (1 = one whole engine per rank; must divide the number of ranks)."""
    vllm_sleep: bool = True
    """backend=vllm: put the engine to sleep (release its memory) during the update and wake it for sampling."""
    vllm_url: str = "http://127.0.0.1:8000"
    """backend=vllm_server: base URL of the server started by `grpokit vllm-serve` (docs/SCALING.md)."""
    vllm_sync_dir: str = ""
    """backend=vllm_server: folder on a filesystem the server reads at the same path; weights go to <it>/<run
    name>/step-N ("" = <run folder>/vllm-weights)."""
    vllm_startup_timeout: float = 600.0
    """backend=vllm_server: seconds to wait for the server to become ready (it may still be loading the model)."""
    vllm_request_timeout: float = 3600.0
    """backend=vllm_server: seconds one sampling request or weight load may take before the run stops."""
    tis_cap: float = 2.0
    """Truncated importance sampling: per-token weight min(pi_old / pi_sampler, tis_cap) on the loss when a separate
    engine (vllm) or stale samples are used (0 = off)."""
    tis_mode: str = "token_truncate"
    """How the TIS weight is formed from r = pi_old / pi_sampler (TRL's vllm_importance_sampling_mode names):
    "token_truncate" (r_t clamped to [tis_min, tis_cap]), "token_mask" (r_t inside [tis_min, tis_cap], 0 outside),
    "sequence_truncate" / "sequence_mask" (the same with the completion's product of token ratios, one weight for all
    its tokens)."""
    tis_min: float = 0.0
    """Lower bound of the TIS weight: *_truncate raises a smaller weight to it, *_mask sets it to 0 (0 = no lower
    bound)."""
    mismatch_mask: str = "none"
    """Sampler/trainer mismatch masking: "none", "token" (IcePop: a token whose pi_old / pi_sampler is outside
    [mismatch_low, mismatch_high] leaves the gradient) or "sequence" (MIS: a completion whose geometric-mean ratio is
    outside leaves it whole); applies with every engine, on top of TIS where TIS applies."""
    mismatch_low: float = 0.5
    """Lower bound of the ratio pi_old / pi_sampler kept by mismatch_mask, and of the mismatch/outside_fraction metric
    (0 < low <= 1)."""
    mismatch_high: float = 2.0
    """Upper bound of the ratio pi_old / pi_sampler kept by mismatch_mask, and of the mismatch/outside_fraction metric
    (>= 1)."""
    async_staleness: int = 0
    """Asynchronous rollout: sample the next batches in the background with a policy at most this many steps old (0 =
    synchronous). Batch j is sampled by the policy after exactly max(0, j - async_staleness) steps
    (rollout/async_plan.py; steps are sampling rounds, each of algo.num_iterations x train.updates_per_batch
    updates), so an asynchronous run is deterministic and resumes exactly."""
    async_partial_tokens: int = 0
    """Partial rollouts (with async_staleness > 0, the sampler thread or async_workers, one-turn text prompts): a
    batch's decode picks up the newer weights every this many tokens, its KV cache recomputed under them, each token
    keeping the version and the sampler logprob it was drawn with (0 = off: a batch is drawn by one version).
    Segment m of batch j is drawn by version min(j - async_staleness + m, j) (rollout/partial.py), so no token is
    more than async_staleness steps old and the run stays deterministic."""
    async_workers: int = 0
    """With async_staleness > 0: 0 samples in a thread of the trainer's process; N >= 1 in N worker processes
    (rollout/async_process.py; one turn; with several trainer ranks, N per rank), on async_worker_device, weights
    passed as shared-memory tensors (CUDA IPC handles when the trainer's snapshot is on a card)."""
    async_worker_device: str = ""
    """Where the async_workers sample: "" (the trainer's own device: its CPU cores, or its card), cpu, cuda or
    cuda:N (e.g. a second card of the trainer's host, so that sampling and the update do not share one; with
    several trainer ranks only "", each rank's own card). Workers on other hosts pick theirs with
    ``grpokit rollout-worker --device``."""
    async_remote_workers: int = 0
    """With async_staleness > 0: this many more rollout workers, each ``grpokit rollout-worker --connect HOST:PORT``
    on any host that reaches the trainer (rollout/async_remote.py); the run waits for them at its start. They
    prove the secret in GRPOKIT_ROLLOUT_KEY, get the policy by value and each version's weights through a gloo
    pair of torch.distributed, with the same deadlines and faults as async_workers (one turn; each on the device
    of its ``--device``)."""
    async_listen: str = "127.0.0.1:29710"
    """HOST:PORT where the trainer accepts its remote rollout workers (async_remote_workers); 0.0.0.0:PORT for
    every interface. Under torchrun rank r listens on PORT + r."""
    async_worker_threads: int = 0
    """Intra-op CPU threads of each rollout worker process (async_workers). 0: for workers on a card one each (the
    card samples); for workers on the CPU the trainer's threads (train.threads) split evenly between the trainer
    and its workers, at least one each, so that the processes together run no more threads than the trainer alone
    (on 2 cores, 2 threads in the trainer and 2 in a worker made a SmolLM2 step 4-7x slower); N > 0: N per worker,
    the trainer keeping all of its own."""
    async_timeout_s: float = 600.0
    """Deadline, in seconds, of a rollout worker's start, of each weight sync and of each batch it samples; a
    worker that misses one is a fault (async_worker_fault). The sampler thread's: the trainer waits at most this
    long for a step's batch, then stops the run in one sentence (naming the rank under torchrun)."""
    async_worker_fault: str = "stop"
    """What a rollout worker's fault (it died, hung, failed or returned a malformed batch) does: stop (the run
    ends with one sentence naming the worker) or drop (the worker is removed, another one samples its batch;
    the run stops when none is left)."""
