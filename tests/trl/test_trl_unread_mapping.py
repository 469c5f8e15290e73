"""The TRL layer maps a setting only where TRL reads it, so the refusals of settings nothing reads
(validation) and the warnings about them never meet a TRL script's defaults."""

from grpokit.validation import validate


def test_trl_defaults_and_its_reporting_arguments_meet_none_of_these_sentences():
    """TRL sets weight_decay 0 (no parameter groups then), run_name only for a tracker that names runs,
    num_completions_to_print only with log_completions: each as TRL reads them."""
    from grpokit.trl.config import GRPOConfig
    from grpokit.trl.mapping import to_config

    cfg = to_config(GRPOConfig("o"), num_rows=8)
    assert (cfg.optim.decay_norms_and_biases, cfg.record.run_name, cfg.record.samples_prompts) == (True, "", 2)
    validate(cfg)
    given = to_config(GRPOConfig("o", run_name="r", num_completions_to_print=8, weight_decay=0.1), num_rows=8)
    assert (given.optim.decay_norms_and_biases, given.record.run_name, given.record.samples_prompts) == (False, "", 2)
    validate(given)
    logged = to_config(GRPOConfig("o", log_completions=True, num_completions_to_print=24), num_rows=8)
    assert logged.record.samples_prompts == 3  # ceil(24 / num_generations 8): whole groups
    validate(logged)


def test_trl_maps_its_episode_settings_only_for_a_trainer_with_tools():
    """max_tool_calling_iterations and the episode cap max_completion_length are read by TRL only in tool episodes;
    without tools or an environment_factory the env section keeps its defaults (no warning for TRL's defaults)."""
    from grpokit.config import EnvConfig
    from grpokit.trl.config import GRPOConfig
    from grpokit.trl.mapping import to_config

    args = GRPOConfig("o", max_completion_length=64)
    plain = to_config(args, num_rows=8, episodes=False).env
    assert (plain.max_turns, plain.max_episode_tokens) == (EnvConfig().max_turns, EnvConfig().max_episode_tokens)
    tools = to_config(args, num_rows=8, episodes=True).env
    assert (tools.max_turns, tools.max_episode_tokens) == (0, 64)  # None: no turn limit, the cap bounds the episode
