"""TRL's GRPOConfig arguments, one module per group, each holding its arguments' mapping rules onto
grpokit's Config, their arithmetic and their single-value checks together:

    loss.py         beta, epsilon*, delta, loss_type and its settings, scale_rewards, reward_weights,
                    the reference sync, the entropy terms, off_policy_mask_threshold
    sampling.py     generation settings, generation_kwargs, chat template, tool turns, vLLM and its
                    importance sampling
    batch.py        batch sizes, generations, steps, epochs (and the step arithmetic the others count with)
    optimizer.py    learning rate, optimizer, optim_args, schedule, warm-up
    checkpoints.py  output_dir, save_*, hub_strategy
    reporting.py    report_to, logging_*, completions, log levels, project
    model.py        precision, model_init_kwargs, checkpointing, device, compile, kernels, model terms
    run.py          seeds, data order, processes (DDP, FSDP), the evaluation schedule
    by_trainer.py   the arguments GRPOTrainer carries out itself (no Config field)

grpokit/trl/mapping.py joins the groups' rules into ``MAPPING`` (docs/TRL.md's table, in its order) and
runs it; ``checks.py`` joins their ``CHECKS`` and ``GATES`` and runs them (``predicates.py``: what they are written
with); ``rule.py`` is one row of the table; ``inherited.py`` names transformers' fields grpokit carries out.
GRPOConfig's field declarations stay in grpokit/trl/config.py, in TRL's order (its API); config.py runs
the checks here, so nothing here imports it (``rule.TrlArgs`` names its type) and mapping.py sits above both.
"""
