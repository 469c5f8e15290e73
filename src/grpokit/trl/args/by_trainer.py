"""The GRPOConfig arguments GRPOTrainer carries out itself, or accepts as TRL and transformers do, and
no Config field holds: how each is carried out, as docs/TRL.md's table shows it (``HANDLED_ELSEWHERE``,
rendered by mapping.py after the rules). The run-management ones (``RUN_MANAGEMENT``) are carried out in
grpokit/trl/best.py, bridge.py and trainer.py; their single-value checks are in their groups (run.py,
reporting.py, batch.py).
"""

RUN_MANAGEMENT: dict[str, str] = {
    "data_seed": "no effect, as in TRL 1.16: its GRPO prompt sampler (RepeatSampler) is seeded by seed, not data_seed "
    "(measured; transformers' documentation says otherwise)",
    "hub_revision": "branch the pushes commit to (None: main; it must exist, as with transformers)",
    "hub_always_push": "no effect: grpokit pushes each checkpoint "
    "synchronously, so none is skipped (what True asks "
    "for)",
    "average_tokens_across_devices": "no effect, as in TRL 1.16's GRPO (read from its code): its loss divides by token "
    "counts it gathers itself and ignores transformers' num_items_in_batch; grpokit "
    "normalises by the whole batch's counts",
    "ignore_data_skip": "a resume starts the prompts at the beginning of the checkpoint's epoch, as transformers",
    "do_train": "no effect, as in transformers (a flag for scripts)",
    "do_eval": "no effect, as in transformers (True when eval_strategy is not 'no')",
    "do_predict": "no effect, as in transformers (a flag for scripts)",
    "torch_empty_cache_steps": "torch.cuda.empty_cache() when a TRL step begins whose count of completed steps is a "
    "multiple of it (transformers: in each of that step's micro-batches)",
    "include_num_input_tokens_seen": "not 'no': log entries get num_input_tokens_seen (TRL's running num_tokens), "
    "training entries train_runtime and train_tokens_per_second, as transformers under TRL",
    "use_cache": "no effect on any number: TRL only sets model.config.use_cache (a KV cache while sampling changes "
    "speed, not the samples' distribution; no loss reads it); grpokit's decode always caches",
    "log_level": "transformers' logging verbosity on the main process (passive: unchanged)",
    "log_level_replica": "transformers' logging verbosity on the other processes (passive: unchanged)",
    "eval_delay": "no evaluation by eval_strategy before this many TRL steps (eval_on_start and evaluate() calls "
    "still run)",
    "metric_for_best_model": "after each evaluation by eval_strategy, eval_<metric> (the prefix added when missing) is "
    "compared with state.best_metric; best_global_step and, at each save, best_model_checkpoint "
    "(output_dir/checkpoint-N) go to trainer_state.json (None: 'loss' with load_best_model_at_end)",
    "greater_is_better": "direction of metric_for_best_model (None: True unless its name ends with 'loss')",
    "load_best_model_at_end": "the best checkpoint's weights are loaded after "
    "the final log; save_total_limit's rotation "
    "keeps it; needs eval_strategy = save_strategy and save_steps a multiple of eval_steps",
}

HANDLED_ELSEWHERE: dict[str, str] = {  # arguments the trainer itself carries out (grpokit/trl/trainer.py)
    "push_to_hub": "GRPOTrainer pushes the final model (and, with hub_strategy every_save, each checkpoint)",
    "hub_model_id": "repository of push_to_hub (None: output_dir's name)",
    "hub_token": "token of push_to_hub",
    "hub_private_repo": "private flag of push_to_hub",
    "remove_unused_columns": "True drops every dataset column but prompt",
    "per_device_eval_batch_size": "completions per batch of evaluate()",
    "num_generations_eval": "completions per eval prompt in evaluate() (None: num_generations)",
    "eval_on_start": "evaluate() before the first step",
    "logging_first_step": "log_history also gets step 1",
    "resume_from_checkpoint": "train() resumes from it when called without one",
    "tf32": "sets torch.backends.cuda.matmul.allow_tf32 and cudnn.allow_tf32 (None: unchanged)",
    "dataloader_num_workers": "no effect: grpokit holds the prompts in memory, there is no DataLoader",
    "dataloader_pin_memory": "no effect (no DataLoader)",
    "dataloader_persistent_workers": "no effect (no DataLoader)",
    "dataloader_prefetch_factor": "no effect (no DataLoader)",
    "accelerator_config": "no effect: it configures accelerate's DataLoader dispatch; grpokit uses neither",
    "pad_to_multiple_of": "no effect: padding changes no log-prob, loss or "
    "gradient; grpokit pads or packs as it chooses",
    "log_unique_prompts": "no effect: samples.jsonl already holds each prompt once with its group",
    "enable_jit_checkpoint": "True: what grpokit's loop always does on SIGTERM: the step in progress finishes "
    "(train.stop_grace_s) and a checkpoint of the last finished step is written (train/stopping.py); refused with "
    "save_strategy no or save_steps <= 0, where transformers still writes one and grpokit does not",
    "vllm_group_port": "not read (as TRL without use_vllm and vllm_mode server); with them only TRL's default "
    "51216: grpokit's server client has no NCCL group",
}
HANDLED_ELSEWHERE.update(RUN_MANAGEMENT)
HANDLED_ELSEWHERE.update(
    {  # transformers' Trainer behaviours, carried out by GRPOTrainer with transformers' meaning
        "logging_nan_inf_filter": "True: a NaN or inf step loss is logged (and counted in train_loss) as the log "
        "window's running loss, as transformers; False: as is (grpokit skips the update of a non-finite step, "
        "where transformers applies it)",
        "skip_memory_metrics": "False: transformers' TrainerMemoryTracker adds init_/train_/eval_mem_* deltas to "
        "train()'s and evaluate()'s metrics (the model load counts in the first of them: grpokit loads it then)",
        "restore_callback_states_from_checkpoint": "checkpoints hold the ExportableState callbacks' states "
        "(stateful_callbacks); True: a resumed run rebuilds those callbacks from them, as transformers",
    }
)
HANDLED_ELSEWHERE.update(
    {  # accepted with no effect, as in TRL's GRPO (its trainer overrides what reads them)
        "use_transformers_continuous_batching": "sampling with continuous batching: "
        "grpokit's own decode loop, which drops "
        "finished rows from the batch (same distribution); refused for a vision model, as TRL",
        "transformers_continuous_batching_config": "checked as transformers' "
        "ContinuousBatchingConfig keywords; sizes "
        "a paged "
        "cache grpokit's decode loop does not have",
        "use_transformers_paged": "deprecated alias: True sets "
        "use_transformers_continuous_batching, with TRL's "
        "FutureWarning",
        "label_smoothing_factor": "no effect, as TRL: transformers applies it in "
        "Trainer.compute_loss, which GRPOTrainer replaces",
        "liger_kernel_config": "no effect: with use_liger_kernel grpokit applies liger-kernel's RMSNorm, SwiGLU and "
        "RoPE kernels (model.kernels); its fused loss is never needed (grpokit's output layer is chunked)",
        "prediction_loss_only": "no effect, as TRL: GRPO's prediction_step returns the loss only",
        "eval_do_concat_batches": "no effect, as TRL (no predictions)",
        "eval_use_gather_object": "no effect, as TRL (no predictions)",
        "eval_accumulation_steps": "no effect, as TRL (no predictions)",
        "include_for_metrics": "no effect, as TRL (GRPOTrainer takes no compute_metrics)",
        "batch_eval_metrics": "no effect, as TRL (GRPOTrainer takes no compute_metrics)",
        "dataloader_drop_last": "no effect, as TRL: its RepeatSampler yields whole generation batches only",
        "dataloader_multiprocessing_context": "no effect (no DataLoader workers)",
        "label_names": "no effect, as TRL (GRPO inputs carry no labels)",
        "train_sampling_strategy": "no effect, as TRL: RepeatSampler replaces "
        "transformers' sampler (shuffle_dataset decides)",
        "length_column_name": "no effect, as TRL (group_by_length's column; RepeatSampler does not read it)",
        "ds3_gather_for_generation": "no effect: DeepSpeed ZeRO-3 only (deepspeed is refused)",
        "local_rank": "no effect: the rank comes from LOCAL_RANK, as transformers when it is set",
        "log_on_each_node": "grpokit logs on global rank 0 only (log_on_each_node=False); one node: the same",
        "dataloader_in_order": "no effect (no DataLoader workers)",
        "ddp_find_unused_parameters": "no effect: grpokit all-reduces gradients "
        "itself, no DistributedDataParallel wrapper",
        "ddp_bucket_cap_mb": "no effect (no DistributedDataParallel wrapper)",
        "ddp_broadcast_buffers": "no effect (no DistributedDataParallel wrapper)",
        "ddp_static_graph": "no effect (no DistributedDataParallel wrapper)",
    }
)
