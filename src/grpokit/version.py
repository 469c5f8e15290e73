"""grpokit's version, a leaf module: the trainer (a model card) and the CLI (--version) read it here, so
nothing inside the package imports the package root, which lazily loads the trainer. Beside it, the
versions of the packages grpokit depends on, read from their metadata without importing them: where an
installed one is too old for what grpokit calls, the caller says so in one sentence."""

from __future__ import annotations

from importlib import metadata

__version__ = "0.1.0"


def installed(dist: str) -> str | None:
    """The installed version of distribution ``dist`` (a PyPI name), or None when none is installed."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def older_than(version: str, minimum: str) -> bool:
    """Whether ``version`` is below ``minimum`` as PEP 440 orders them (0.10 > 0.9; a version that does
    not parse is not called older)."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version) < Version(minimum)
    except InvalidVersion:
        return False
