"""grpokit's version, a leaf module: the trainer (a model card) and the CLI (--version) read it here, so
nothing inside the package imports the package root, which lazily loads the trainer."""

__version__ = "0.1.0"
