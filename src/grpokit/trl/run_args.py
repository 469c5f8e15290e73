"""The run-management arguments of TRL's GRPOConfig that GRPOTrainer carries out itself (grpokit/trl/best.py,
bridge.py, trainer.py) or accepts as transformers does: how each is carried out, as docs/TRL.md's table shows it
(mapping.py adds them to HANDLED_ELSEWHERE)."""

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
