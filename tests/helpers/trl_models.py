"""Helpers of the TRL-layer tests: a tiny chat model folder and a fake Hugging Face Hub on 127.0.0.1."""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from helpers.models import save_tiny_model

CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def _chat_tokenizer():
    """The character tokenizer of ``make_chat_model`` (letters, digits, a few symbols), left-padded, with
    ``CHAT_TEMPLATE``."""
    from grpokit.data.tasks.chartok import build_char_tokenizer

    tok = build_char_tokenizer(
        "abcdefghijklmnopqrstuvwxyz0123456789+-=<>/ \n", (), padding_side="left", model_max_length=None
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def make_chat_model(path: Path, seed: int = 0) -> Path:
    """A tiny Llama with a character tokenizer (letters, digits, a few symbols) and a chat template."""
    return save_tiny_model(path, _chat_tokenizer(), seed=seed)


def make_gpt2_chat_model(path: Path, n_positions: int = 64) -> Path:
    """A tiny GPT-2 (positions: a learned table of ``n_positions`` rows) with ``make_chat_model``'s tokenizer."""
    import transformers

    from grpokit.data.tasks.chartok import save_char_tokenizer

    tok = _chat_tokenizer()
    config = transformers.GPT2Config(
        vocab_size=len(tok), n_positions=n_positions, n_embd=32, n_layer=1, n_head=2, eos_token_id=1, pad_token_id=0
    )
    transformers.GPT2LMHeadModel(config).save_pretrained(path)
    save_char_tokenizer(tok, path)
    return Path(path)


def make_qwen2_model(path: Path, seed: int = 0) -> Path:
    """A tiny Qwen2 (the architecture of TRL's docs' models) with the same character tokenizer and chat
    template."""
    return save_tiny_model(path, _chat_tokenizer(), arch="qwen2", seed=seed)


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

    from grpokit.data.tasks.chartok import build_char_tokenizer

    tok = build_char_tokenizer(string.printable, QWEN_TOKENS, padding_side="left", model_max_length=None)
    tok.chat_template = template
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    tok.eos_token = "<|im_end|>"
    return save_tiny_model(path, tok, arch="qwen3", seed=seed, max_positions=4096, eos_token_id=eos, head_dim=8)


QWEN2_TOOL_TOKENS = (
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "<tool_response>",
    "</tool_response>",
)


def make_qwen2_tool_model(path: Path, template: str, max_positions: int):
    """A tiny Qwen2 over letters, digits, punctuation, space and newline with Qwen's tool-calling tokens and
    ``template`` as its chat template (one of TRL's, which TRL parses tool calls for); eos is <|im_end|>.
    Returns ``(path, tokenizer)``."""
    import string

    from grpokit.data.tasks.chartok import build_char_tokenizer

    tok = build_char_tokenizer(
        string.ascii_letters + string.digits + string.punctuation + " \n", QWEN2_TOOL_TOKENS, model_max_length=None
    )
    tok.add_special_tokens({"eos_token": "<|im_end|>"})
    tok.chat_template = template
    save_tiny_model(path, tok, arch="qwen2", max_positions=max_positions, eos_token_id=tok.eos_token_id)
    return path, tok


def save_tiny_reward_model(path: Path, tok):
    """A one-layer random Llama sequence classifier (one label, pad id 0) over ``tok``'s vocabulary, saved
    with ``tok`` to ``path`` (a reward model given by folder); returns the model."""
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    torch.manual_seed(1)
    model = LlamaForSequenceClassification(
        LlamaConfig(
            vocab_size=len(tok),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            num_labels=1,
            pad_token_id=0,
        )
    )
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model


SMALL_RUN = dict(
    per_device_train_batch_size=4,
    num_generations=4,
    max_completion_length=4,
    use_cpu=True,
    gradient_checkpointing=False,
    disable_tqdm=True,
)


def small_args(config_cls, out, **kw):
    """``config_cls`` (TRL's or grpokit.trl's GRPOConfig) for a short CPU run writing to ``out``: one group
    of 4 completions of at most 4 tokens a step, no gradient checkpointing, no progress bar; ``kw`` adds
    or overrides arguments."""
    return config_cls(**{"output_dir": str(out), **SMALL_RUN, **kw})


def make_chain_model(path: Path, chain: list[str], template: str, extra_tokens: tuple[str, ...] = ()) -> Path:
    """A tiny Qwen3 (``make_tool_chat_model``'s tokenizer plus ``extra_tokens``, e.g. a whole tool call as one
    token; ``template`` its chat template) that writes ``chain``
    whatever the prompt: its next token depends on the current token only (attention and MLP outputs zeroed,
    one-hot embeddings, a bigram head), ``chain[i]`` -> ``chain[i + 1]`` and any other token -> ``chain[0]``, each
    by a logit margin of 60, so sampling at temperature 1 draws the chain on any sampler."""
    import string

    import torch
    import transformers

    from grpokit.data.tasks.chartok import build_char_tokenizer, save_char_tokenizer

    tok = build_char_tokenizer(string.printable, QWEN_TOKENS + extra_tokens, padding_side="left", model_max_length=None)
    tok.chat_template, tok.eos_token = template, "<|im_end|>"
    V = len(tok)
    d = -(-V // 8) * 8
    config = transformers.Qwen3Config(
        vocab_size=V, hidden_size=d, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=d // 2, max_position_embeddings=4096, tie_word_embeddings=False,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    model = transformers.Qwen3ForCausalLM(config)
    ids = [tok.convert_tokens_to_ids(t) for t in chain]
    head = torch.zeros(V, d)
    head[ids[0], :] = 60.0  # from any token: the chain's first
    for a, b in zip(ids, ids[1:]):
        head[:, a] = 0.0
        head[b, a] = 60.0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "o_proj" in name or "down_proj" in name:
                p.zero_()
        model.model.embed_tokens.weight.copy_(torch.eye(V, d))
        model.lm_head.weight.copy_(head / d**0.5)  # the final RMSNorm scales a one-hot row by sqrt(d)
    model.save_pretrained(path)
    save_char_tokenizer(tok, path)
    return Path(path)
