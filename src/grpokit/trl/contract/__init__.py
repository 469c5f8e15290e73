"""TRL's extension contract on grpokit.trl's GRPOTrainer: what a subclass or a script may override, call,
read or assign, and how grpokit honours it.

``hooks`` decides which overridden methods are honoured and where; ``stages`` and ``generation`` turn
them into grpokit stages (``_generate_and_score_completions`` is ``generation``); ``overrides`` puts
them in the Trainer's slots; ``methods`` carries TRL's other methods; ``attributes``, ``assignable``
and ``surface`` are the attributes TRL sets, those a user may replace, and those scripts read.
"""
