"""A fake vLLM server for tests: exactly the endpoints and payloads grpokit uses, on 127.0.0.1.

Every shape below was read in the source of vLLM 0.33.0 (paths under ``vllm/``); 0.10.2 serves the
same routes from ``entrypoints/openai/api_server.py``, and ``flavor="0.10.2"`` gives its two different
answers (an empty /reset_prefix_cache, a plain-text 500 when a worker method fails). It samples with a tiny local torch
model held by fake GPU workers, and its workers are built the way vLLM builds them: grpokit's worker extension is
appended to the worker class's bases, so ``/collective_rpc`` runs the real extension code.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import torch

from .fake_vllm_lora import FakeLoRA, runtime_lora_enabled


class FakeVLLMModel:
    """What ``model_runner.get_model()`` returns: an nn.Module with vLLM's ``load_weights(iterable)``."""

    def __init__(self, hf_model):
        self.hf = hf_model
        self.loaded_names: list[str] = []

    def load_weights(self, weights):
        # like vLLM's models: look each name up in the module's parameters and copy in place
        # (tied lm_head is the embedding's parameter, so it needs no entry of its own)
        params = dict(self.hf.state_dict(keep_vars=True))
        done = set()
        for name, tensor in weights:
            with torch.no_grad():
                params[name].copy_(tensor)  # a KeyError here is what vLLM raises for an unknown name
            self.loaded_names.append(name)
            done.add(name)
        return done


class FakeWorkerBase:
    """The attributes of vLLM's GPU ``Worker`` (``v1/worker/gpu_worker.py``) the extension uses."""

    def __init__(self, hf_model, rank: int, logprobs_mode: str, lora_config=None):
        self.rank = rank
        self.vllm_config = SimpleNamespace(
            model_config=SimpleNamespace(logprobs_mode=logprobs_mode, dtype=hf_model.dtype), lora_config=lora_config
        )
        self.model_runner = SimpleNamespace(model=FakeVLLMModel(hf_model))
        self.model_runner.get_model = lambda: self.model_runner.model

    def execute_model(self):  # stands for the many methods a real worker has
        raise NotImplementedError


def make_worker_class(extension: type | None) -> type:
    """``v1/worker/worker_base.py`` WorkerWrapperBase.init_worker: refuse clashing names, then extend ``__bases__``."""
    cls = type("Worker", (FakeWorkerBase,), {})
    if extension is not None:
        for attr in dir(extension):
            if not attr.startswith("__"):
                assert not hasattr(cls, attr), f"Worker class {cls} already has an attribute {attr}"
        cls.__bases__ = cls.__bases__ + (extension,)
    return cls


def error_body(message: str, err_type: str, code: int, param: str | None = None) -> dict:
    # serve/engine/protocol.py ErrorResponse/ErrorInfo, filled by serve/exception_handling/*
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


class FakeVLLMServer:
    """Start with ``with FakeVLLMServer(model) as srv:``; ``srv.url`` is ``http://127.0.0.1:<port>``."""

    def __init__(
        self,
        hf_model,
        *,
        served_name: str = "tiny",
        workers: int = 1,
        dev_mode: bool = True,
        extension: bool = True,
        logprobs_mode: str = "processed_logprobs",
        start_delay: float = 0.0,
        completion_delay: float = 0.0,
        busy_prefix_cache: int = 0,
        seed: int = 0,
        flavor: str = "0.33.0",
        max_lora_rank: int | None = None,
    ):
        from grpokit.rollout.vllm_worker import WeightSyncExtension

        self.served_name, self.dev_mode, self.start_delay, self.completion_delay = (
            served_name,
            dev_mode,
            start_delay,
            completion_delay,
        )
        self.busy_prefix_cache = busy_prefix_cache  # answer {"success": false} this many times first
        self.flavor = flavor  # "0.33.0" or "0.10.2": the two differ in the answers marked below
        # --enable-lora --max-lora-rank (None: without); the routes need VLLM_ALLOW_RUNTIME_LORA_UPDATING at start
        self.lora, self.runtime_lora = FakeLoRA(max_lora_rank, flavor=flavor), runtime_lora_enabled()
        cls = make_worker_class(WeightSyncExtension if extension else None)
        # tensor-parallel ranks: each worker gets the full model here (vLLM's would hold a shard)
        import copy

        self.workers = [
            cls(hf_model if r == 0 else copy.deepcopy(hf_model), r, logprobs_mode, self.lora.config())
            for r in range(workers)
        ]
        self.model = hf_model.eval()
        self.eos = hf_model.config.eos_token_id
        self.generator = torch.Generator().manual_seed(seed)
        self.calls: list[tuple[str, str, dict | None]] = []
        self.sampled: list[tuple[list[int], list[float], str]] = []  # (token ids, logprobs, finish reason) per choice
        self.lock = threading.Lock()
        with socket.socket() as s:  # pick a free port now; listen on it only after start_delay
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.httpd: ThreadingHTTPServer | None = None

    # ---------------------------------------------------------------- lifecycle

    def __enter__(self):
        def serve():
            time.sleep(self.start_delay)  # vLLM only listens once its engine is up (nothing answers before)
            self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
            self.httpd.daemon_threads = (
                False  # server_close() then waits for requests in flight (torch in a dying thread aborts)
            )
            self.httpd.serve_forever(poll_interval=0.05)

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        if self.start_delay == 0:
            while self.httpd is None:
                time.sleep(0.01)
        return self

    def __exit__(self, *exc):
        deadline = time.monotonic() + 5 + self.start_delay
        while self.httpd is None and time.monotonic() < deadline:
            time.sleep(0.01)
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()

    # ---------------------------------------------------------------- endpoints

    def route(self, method: str, path: str, body: dict | None) -> tuple[int, dict | None]:
        self.calls.append((method, path, body))
        routes = {
            ("GET", "/health"): self.health,
            ("GET", "/v1/models"): self.models,
            ("POST", "/v1/completions"): self.completions,
        }
        if self.dev_mode:  # launchers/api_server/routers.py: dev routers only with VLLM_SERVER_DEV_MODE
            routes.update(
                {
                    ("POST", "/collective_rpc"): self.collective_rpc,
                    ("POST", "/reset_prefix_cache"): self.reset_prefix_cache,
                }
            )
        if self.runtime_lora:  # serve/lora/api_router.py attach_router
            routes[("POST", "/v1/load_lora_adapter")] = lambda b: self.lora.load(b, error_body)
            routes[("POST", "/v1/unload_lora_adapter")] = lambda b: self.lora.unload(b, error_body)
        if (method, path) not in routes:
            known = any(p == path for _, p in routes)
            code, phrase = (405, "Method Not Allowed") if known else (404, "Not Found")
            return code, error_body(phrase, phrase, code)  # serve/exception_handling/handlers/http.py
        return routes[(method, path)](body)

    def health(self, body):  # serve/instrumentator/health.py:22: empty 200
        return 200, None

    def models(
        self, body
    ):  # openai/models/api_router.py:20, openai/models/serving.py:64, serve/engine/protocol.py:90-118
        card = {
            "id": self.served_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": self.served_name,
            "parent": None,
            "max_model_len": 128,
            "permission": [{"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission"}],
        }
        return 200, {"object": "list", "data": [card, *self.lora.cards(self.served_name)]}

    def collective_rpc(self, body):  # serve/dev/rpc/api_router.py:23-59
        method = body.get("method")
        if method is None:
            return 400, error_body("Missing 'method' in request body", "Bad Request", 400)
        results = []
        for w in self.workers:
            try:
                func = getattr(w, method)  # v1/serial_utils.py:485 run_method
            except AttributeError:
                return self.worker_failed(f"Method {method!r} is not implemented.")
            try:
                out = func(*body.get("args", []), **body.get("kwargs", {}))
            except Exception as e:  # noqa: BLE001 - the same path as above
                return self.worker_failed(str(e))
            results.append(out if out is None or isinstance(out, (dict, list)) else str(out))
        return 200, {"results": results}

    def worker_failed(self, err: str):
        """A worker's exception: v1/executor/multiproc_executor.py (FAILURE -> RuntimeError), v1/engine/core.py:1850."""
        if self.flavor == "0.10.2":  # no handler for raw exceptions there: Starlette's plain-text 500
            return 500, "Internal Server Error"
        # 0.33: the raw-Exception handler (serve/exception_handling/error_response.py) -> JSON 500
        msg = (
            f"Call to collective_rpc method failed: Worker failed with error '{err}', "
            "please check the stack trace above for the root cause"
        )
        return 500, error_body(msg, "InternalServerError", 500)

    def reset_prefix_cache(self, body):  # serve/dev/cache/api_router.py:20-48 -> {"success": bool}
        if self.flavor == "0.10.2":  # entrypoints/openai/api_server.py: empty 200, success not reported
            return 200, None
        if self.busy_prefix_cache > 0:
            self.busy_prefix_cache -= 1
            return 200, {"success": False}
        return 200, {"success": True}

    def completions(self, body):
        """``openai/completion/protocol.py:49`` request, ``:668-720`` response; ``serving.py:560-700``."""
        if self.completion_delay:
            time.sleep(self.completion_delay)
        model = self.model if body.get("model") in (None, self.served_name) else None
        if model is None:  # an adapter's name: base + adapter (fake_vllm_lora.py)
            model = self.lora.model_for(body["model"], self.model)
        if model is None:  # serve/engine/serving.py:75-84
            return 404, error_body(
                f"The model `{body['model']}` does not exist. Valid aliases: {self.served_name}.",
                "NotFoundError",
                404,
                "model",
            )
        prompts = body["prompt"]
        if not (isinstance(prompts, list) and prompts and all(isinstance(p, list) for p in prompts)):
            return 400, error_body("the fake serves only a list of token-id lists", "BadRequestError", 400, "prompt")
        for key, off in (("top_p", 1.0), ("top_k", 0), ("min_p", 0.0), ("repetition_penalty", 1.0)):
            if body.get(key, off) not in (off, -1 if key == "top_k" else off):
                return 400, error_body(
                    f"the fake samples with temperature only; {key}={body[key]}", "BadRequestError", 400, key
                )
        if body.get("stop"):
            return 400, error_body("the fake has no stop strings", "BadRequestError", 400, "stop")
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        choices, n_prompt, n_gen = [], 0, 0
        for ids in prompts:
            for _ in range(body.get("n", 1)):
                out, lps, reason = self.sample(model, ids, body.get("max_tokens", 16), body.get("temperature", 1.0))
                self.sampled.append((out, lps, reason))
                # token strings: generate/base/serving.py:322 format_token_id_placeholder -> "token_id:<id>"
                toks = [f"token_id:{t}" if as_ids else f"<{t}>" for t in out]
                logprobs = None
                if body.get("logprobs") is not None:  # serving.py:714 _create_completion_logprobs
                    logprobs = {
                        "text_offset": [sum(len(t) for t in toks[:i]) for i in range(len(toks))],
                        "token_logprobs": lps,
                        "tokens": toks,
                        "top_logprobs": [{tok: lp} for tok, lp in zip(toks, lps)],
                    }
                choices.append(
                    {
                        "index": len(choices),
                        "text": "".join(toks),
                        "logprobs": logprobs,
                        "finish_reason": reason,
                        "stop_reason": None,
                        "token_ids": None,
                        "prompt_logprobs": None,
                        "prompt_token_ids": None,
                    }
                )
                n_gen += len(out)
            n_prompt += len(ids)
        return 200, {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.served_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": n_prompt,
                "total_tokens": n_prompt + n_gen,
                "completion_tokens": n_gen,
                "prompt_tokens_details": None,
            },
        }

    @torch.no_grad()
    def sample(self, model, prompt: list[int], max_tokens: int, temperature: float):
        """Ancestral sampling with ``model`` (rank 0's weights, with an adapter or not); logprobs after
        temperature ("processed_logprobs")."""
        with self.lock:
            ids, out, lps = list(prompt), [], []
            for _ in range(max_tokens):
                logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
                logp = torch.log_softmax(logits / temperature, dim=-1)
                t = int(torch.multinomial(logp.exp(), 1, generator=self.generator))
                ids.append(t), out.append(t), lps.append(float(logp[t]))
                if t == self.eos:  # v1/core/sched/utils.py check_stop: EOS is kept, finish "stop", stop_reason None
                    return out, lps, "stop"
            return out, lps, "length"

    # ---------------------------------------------------------------- HTTP plumbing

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, method):
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                try:
                    body = json.loads(raw) if raw else None
                except json.JSONDecodeError:
                    body = None
                path = self.path.split("?", 1)[0]
                code, payload = server.route(method, path, body)
                text = isinstance(payload, str)
                data = b"" if payload is None else payload.encode() if text else json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain; charset=utf-8" if text else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._answer("GET")

            def do_POST(self):
                self._answer("POST")

            def log_message(self, *args):
                pass

        return Handler
