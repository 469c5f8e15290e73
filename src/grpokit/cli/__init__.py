"""The command line: ``grpokit train | eval | report | presets | vllm-serve`` (``app.py``) and
``grpokit eval`` (``eval.py``)."""

from grpokit.cli.app import main

__all__ = ["main"]
