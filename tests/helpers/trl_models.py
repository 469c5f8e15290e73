"""Helpers of the TRL-layer tests: a tiny chat model folder and a fake Hugging Face Hub on 127.0.0.1."""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch

CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def make_chat_model(path: Path, seed: int = 0) -> Path:
    """A tiny Llama with a character tokenizer (letters, digits, a few symbols) and a chat template."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from grpokit.data.tasks.chartok import build_char_tokenizer, save_char_tokenizer

    tok = build_char_tokenizer(
        "abcdefghijklmnopqrstuvwxyz0123456789+-=<>/ \n", (), padding_side="left", model_max_length=None
    )
    tok.chat_template = CHAT_TEMPLATE
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=None,
        eos_token_id=1,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(cfg).save_pretrained(path)
    save_char_tokenizer(tok, path)
    return path


def make_qwen2_model(path: Path, seed: int = 0) -> Path:
    """A tiny Qwen2 (the architecture of TRL's docs' models) with the same character tokenizer and chat template."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpokit.data.tasks.chartok import build_char_tokenizer, save_char_tokenizer

    tok = build_char_tokenizer(
        "abcdefghijklmnopqrstuvwxyz0123456789+-=<>/ \n", (), padding_side="left", model_max_length=None
    )
    tok.chat_template = CHAT_TEMPLATE
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=None,
        eos_token_id=1,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    save_char_tokenizer(tok, path)
    return path


class FakeHub:
    """Just enough of the Hub's HTTP API for ``HfApi.create_repo`` and ``HfApi.create_commit`` with
    regular (inline) files: repositories live in ``self.repos[repo_id][path] = bytes``. Listens on
    127.0.0.1 only."""

    def __init__(self):
        self.repos: dict[str, dict[str, bytes]] = {}
        self.commits: list[tuple[str, str]] = []
        self.revisions: list[str] = []  # the branch of each commit, in order
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _reply(self, body: dict, status: int = 200):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                path = self.path.split("?")[0]
                if path == "/api/repos/create":
                    body = json.loads(raw)
                    repo = "/".join(x for x in (body.get("organization"), body["name"]) if x)
                    hub.repos.setdefault(repo, {})
                    return self._reply({"url": f"{hub.url}/{repo}", "name": repo})
                if path == "/api/validate-yaml":
                    return self._reply({"errors": [], "warnings": []})
                if "/preupload/" in path:
                    files = json.loads(raw)["files"]
                    return self._reply(
                        {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]}
                    )
                if "/commit/" in path:
                    repo = path[len("/api/models/") :].split("/commit/")[0]
                    message = ""
                    for line in raw.decode().splitlines():
                        item = json.loads(line)
                        if item["key"] == "header":
                            message = item["value"]["summary"]
                        elif item["key"] == "file":
                            hub.repos.setdefault(repo, {})[item["value"]["path"]] = base64.b64decode(
                                item["value"]["content"]
                            )
                    hub.commits.append((repo, message))
                    hub.revisions.append(path.split("/commit/")[1])
                    oid = f"{len(hub.commits):040x}"
                    return self._reply({"commitUrl": f"{hub.url}/{repo}/commit/{oid}", "commitOid": oid})
                return self._reply({"error": f"fake hub: no route {path}"}, 404)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeHub":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


QWEN_TOKENS = (
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)


def make_tool_chat_model(path: Path, template: str, seed: int = 0) -> Path:
    """A tiny Qwen3 over printable characters with Qwen's special tokens and ``template`` as its chat
    template (TRL's bundled qwen3.jinja, which TRL recognises for tool calling); eos is <|im_end|>."""
    import string

    from transformers import Qwen3Config, Qwen3ForCausalLM

    from grpokit.data.tasks.chartok import build_char_tokenizer, save_char_tokenizer

    tok = build_char_tokenizer(string.printable, QWEN_TOKENS, padding_side="left", model_max_length=None)
    tok.chat_template = template
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    tok.eos_token = "<|im_end|>"
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=4096,
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    Qwen3ForCausalLM(cfg).save_pretrained(path)
    save_char_tokenizer(tok, path)
    return path
