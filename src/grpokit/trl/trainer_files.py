"""What transformers' Trainer writes to output_dir, for grpokit.trl's GRPOTrainer (a mixin of it):
metrics files, trainer_state.json, the model card, the saved model and its upload, and TRL's
``checkpoint-N`` names for grpokit's checkpoints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import callback_states
from .checkpoint_links import name_checkpoint, save_args
from .inputs import push_folder


class TrainerFiles:
    """output_dir's files as transformers writes them; the GRPOTrainer supplies ``cfg``, ``state``,
    ``args``, ``model``, ``processing_class``, ``accelerator`` and ``_get()``."""

    def log_metrics(self, split: str, metrics: dict[str, float]) -> None:
        """Print ``metrics`` under ``***** split metrics *****``, as transformers (main process only)."""
        if self.accelerator.is_main_process:
            print(f"***** {split} metrics *****")
            for key in sorted(metrics):
                print(f"  {key:<{max(map(len, metrics))}} = {metrics[key]}")

    def save_metrics(self, split: str, metrics: dict[str, float], combined: bool = True) -> None:
        """Write ``<output_dir>/<split>_results.json`` (and merge into all_results.json), as transformers."""
        out = Path(self.cfg.train.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{split}_results.json").write_text(json.dumps(metrics, indent=4, sort_keys=True))
        if combined:
            path = out / "all_results.json"
            merged = {**(json.loads(path.read_text()) if path.exists() else {}), **metrics}
            path.write_text(json.dumps(merged, indent=4, sort_keys=True))

    def save_state(self) -> None:
        """Write TRL's ``trainer_state.json`` to output_dir."""
        Path(self.cfg.train.out).mkdir(parents=True, exist_ok=True)
        self.state.save_to_json(str(Path(self.cfg.train.out) / "trainer_state.json"))

    def create_model_card(
        self, model_name: str | None = None, dataset_name: str | None = None, tags: str | list[str] | None = None
    ) -> Path | None:
        """TRL's (its parameters; called at every checkpoint and by push_to_hub, as TRL's): write
        output_dir/README.md, grpokit's model card (base model, data, rewards, settings) with ``model_name``
        as its title, ``dataset_name`` as its data and ``tags`` beside grpokit's; the main process only."""
        if not self.accelerator.is_main_process:
            return None
        names = dict(model_name=model_name, dataset_name=dataset_name, tags=tags)
        return self._write_model_card(Path(self.cfg.train.out), **names)

    def _name_checkpoint(self, path: Path, step: int) -> None:
        """TRL's ``output_dir/checkpoint-N`` for grpokit's checkpoint ``path`` (checkpoint_links.py), its
        trainer_state.json with the callbacks' states (callback_states.py); first the model card, as TRL's
        ``_save_checkpoint`` calls ``create_model_card(model_name=...)`` (a subclass's override too)."""
        self.create_model_card(model_name=card_model_name(self.args))
        stop = self.bridge.user.control.should_training_stop or step >= self.state.max_steps
        callback_states.at_save(self.state, self.bridge.user.callbacks, stop)
        out, main = Path(self.cfg.train.out), self.accelerator.is_main_process
        name_checkpoint(path, step, out, self.state, self._saved_steps, main, self.args)

    def _write_model_card(self, out: Path, **names: Any) -> Path:
        """``out``/README.md: grpokit's model card (base model, data, rewards, settings; ``names``: model_card's
        model_name, dataset_name, tags)."""
        from grpokit.train.model_card import model_card

        out.mkdir(parents=True, exist_ok=True)
        card = model_card(self.cfg, self.state.global_step, [s.name for s in self._get().runner.specs], **names)
        (out / "README.md").write_text(card)
        return out / "README.md"

    def save_model(self, output_dir: str | None = None) -> Path:
        """Write the policy (the adapter with LoRA), its tokenizer, the arguments (training_args.bin) and a
        model card to ``output_dir`` (default: the GRPOConfig's), as TRL's ``save_model``."""
        out = Path(output_dir or self.cfg.train.out)
        out.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(out, safe_serialization=True)
        self.processing_class.save_pretrained(out)
        save_args(self.args, out)
        self._write_model_card(out)
        return out

    def push_to_hub(
        self,
        commit_message: str = "End of training",
        blocking: bool = True,
        token: str | None = None,
        revision: str | None = None,
        private: bool | None = None,
        **kwargs: Any,
    ) -> str | None:
        """Save the model to output_dir, write its card through ``create_model_card`` (``kwargs`` are its
        keywords; ``model_name`` by default TRL's, the model's ``model_tags`` joining ``tags``) and upload
        output_dir to ``hub_model_id`` (huggingface_hub; the endpoint is ``HF_ENDPOINT`` when set), as
        transformers' ``push_to_hub``. Returns the commit URL (None off the main process)."""
        if getattr(self, "bridge", None) is not None:  # transformers' on_push_begin, before the upload
            self.bridge.user("on_push_begin")
        if kwargs.get("model_name") is None:
            kwargs["model_name"] = card_model_name(self.args)
        folder = self.save_model()
        if not self.accelerator.is_main_process:
            return None
        model_tags = getattr(self.model, "model_tags", None)
        # transformers' push_to_hub adds the model's own tags (a string made a list, a tag given already not
        # repeated) before it calls create_model_card: kept here, not left to model_card._metadata, because a
        # subclass's create_model_card override receives these tags, as under transformers
        if model_tags is not None:
            given = kwargs.get("tags") or []
            given = [given] if isinstance(given, str) else list(given)
            kwargs["tags"] = given + [t for t in model_tags if t not in given]
        self.create_model_card(**kwargs)
        return push_folder(
            folder,
            self.hub_model_id,
            commit_message,
            token or self.args.hub_token,
            self.args.hub_private_repo if private is None else private,
            revision or self.args.hub_revision,
        )


def card_model_name(args: Any) -> str:
    """TRL's model name for the card of a checkpoint or a push: hub_model_id's last part, else output_dir's name."""
    return args.hub_model_id.split("/")[-1] if args.hub_model_id else Path(args.output_dir).name
