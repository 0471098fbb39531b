"""A tiny deterministic OpenAI-compatible model server on loopback, for tests.

Why this module exists: the project's tests run real ``lm_eval`` evaluations
offline, and the machines allow loopback traffic only. lm_eval's
``local-completions`` model talks to any OpenAI-style completions endpoint,
and with ``tokenizer_backend=remote`` it also asks the server to tokenize
(vLLM's ``/tokenizer_info``, ``/tokenize``, ``/detokenize``), so a small
standard-library server is enough to exercise the whole API path without
model weights:

* a byte-level tokenizer (ids 0-255 are bytes, 256 is ``<|endoftext|>``), so
  tokenization is lossless and identical on every machine;
* loglikelihoods from a hash of the preceding tokens, so identical runs give
  identical scores and some answers are "greedy";
* a canned generation text, which tests set to make the model "say" things,
  e.g. forged ``::lmeval::`` marker lines;
* a model made worse on purpose (``wrong_share``, ``--wrong-share``): that
  share of generation prompts is answered with ``wrong_text`` instead, which
  prompts is decided by a hash of the prompt (so reruns agree, and the same
  documents are wrong every time), for the regression gate's tests; the
  loglikelihoods are unchanged;
* optional failure injection (the first N completion requests fail with a
  chosen error body) and per-request delay, for failure and cancel tests;
* an OpenAI-style chat endpoint (``/v1/chat/completions``, lm_eval's
  ``local-chat-completions``) that answers with the same canned text and
  keeps the messages it received (``chat_requests``), so a test can show
  what reached the model (a system instruction, a chat-formatted prompt);
* HTTPS with a given certificate and key (``tls=(cert, key)``), so tests can
  show the evaluation trusting, or refusing, a certificate from a private CA.

Use ``ModelServer`` as a context manager, or run
``python -m lmeval_sandbox.model_server --port N`` standalone. It refuses to
bind anything but a loopback address, except, with ``--pod-ip``, the private
address of the pod it runs in (a real node's pod, behind a Service: the
address lives in the pod's own network namespace on the node's bridge).

Request and response shapes follow lm_eval 0.4.13
(``lm_eval/models/openai_completions.py``, ``api_models.py`` and
``RemoteTokenizer`` in ``lm_eval/utils.py``): loglikelihood requests send
``echo: true, logprobs: 1, max_tokens: 1`` and read
``choices[i].logprobs.token_logprobs[ctxlen:-1]`` plus ``top_logprobs`` for
greediness; generation requests read ``choices[i].text``.
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import json
import signal
import ssl
import sys
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

EOS_TOKEN = "<|endoftext|>"  # noqa: S105 - a token of text, not a secret
EOS_ID = 256
MAX_MODEL_LEN = 2048
GREEDY_LOGPROB = -0.05
# Longest request body accepted; lm_eval's requests are a few KB.
MAX_BODY = 16 * 1024 * 1024
# Chat requests kept for tests to read (the oldest are dropped beyond this).
MAX_CHAT_REQUESTS = 1000


class ByteTokenizer:
    """Lossless byte-level tokenizer with one special token (EOS)."""

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for i, part in enumerate(text.split(EOS_TOKEN)):
            if i:
                ids.append(EOS_ID)
            ids.extend(part.encode("utf-8"))
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        out: list[str] = []
        pending = bytearray()
        for tok in ids:
            if tok == EOS_ID:
                out.append(pending.decode("utf-8", "replace"))
                pending.clear()
                out.append(EOS_TOKEN)
            else:
                pending.append(tok & 0xFF)
        out.append(pending.decode("utf-8", "replace"))
        return "".join(out)

    @staticmethod
    def token_text(tok: int) -> str:
        """The display string of one token, OpenAI-style for non-ASCII bytes."""
        if tok == EOS_ID:
            return EOS_TOKEN
        return chr(tok) if tok < 0x80 else f"bytes:\\x{tok:02x}"


def _hash(*parts: Sequence[int] | int) -> int:
    data = json.dumps(parts, separators=(",", ":")).encode()
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big")


class HashModel:
    """Deterministic "language model": logprobs from hashes of a 4-token context."""

    window = 4

    def greedy_token(self, prefix: Sequence[int]) -> int:
        return _hash(list(prefix[-self.window :])) % (EOS_ID + 1)

    def logprob(self, prefix: Sequence[int], tok: int) -> float:
        if tok == self.greedy_token(prefix):
            return GREEDY_LOGPROB
        return -round(0.5 + (_hash(list(prefix[-self.window :]), tok) % 10_000) / 1000.0, 4)


class ModelServer:
    """The server; ``start()``/``stop()`` or ``with ModelServer() as server:``."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        generation_text: str = "42",
        model: str = "toy",
        fail_first: int = 0,
        error_text: str = "internal error",
        delay: float = 0.0,
        tls: tuple[str, str] | None = None,
        wrong_share: float = 0.0,
        wrong_text: str = "I do not know",
        hold_file: str | None = None,
        pod_ip: bool = False,
    ) -> None:
        if not 0.0 <= wrong_share <= 1.0:
            raise ValueError(f"wrong_share must be between 0 and 1, not {wrong_share}")
        self.host = _pod_ip(host) if pod_ip else _loopback_only(host)
        self.wrong_share = wrong_share
        self.wrong_text = wrong_text
        self.tls = tls
        self.port = port
        self.generation_text = generation_text
        self.model = model
        self.fail_first = fail_first
        self.error_text = error_text
        self.delay = delay
        # Answers wait until this file exists: a test holds a job running for
        # as long as it needs (an upgrade) and lets it finish by creating it.
        self.hold_file = Path(hold_file) if hold_file else None
        self.tokenizer = ByteTokenizer()
        self.lm = HashModel()
        self.counts: dict[str, int] = {}
        self.chat_requests: list[list[dict[str, Any]]] = []
        # The Authorization header of the last chat request (an API key's way in).
        self.last_authorization: str | None = None
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def wait_for_release(self) -> None:
        """Hold an answer until `hold_file` exists (no hold without one)."""
        while self.hold_file is not None and not self.hold_file.exists():
            time.sleep(0.1)

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> ModelServer:
        server = self

        class Handler(_Handler):
            owner = server

        httpd = _QuietServer((self.host, self.port), Handler)
        if self.tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*self.tls)
            # The handshake happens in each request's thread, on first read: a
            # client that refuses the certificate never stalls the accept loop.
            httpd.socket = context.wrap_socket(
                httpd.socket, server_side=True, do_handshake_on_connect=False
            )
        self._httpd = httpd
        self.port = int(httpd.server_address[1])
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> ModelServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:41234`` (``https://`` with TLS)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    @property
    def completions_url(self) -> str:
        return self.url + "/v1/completions"

    @property
    def chat_url(self) -> str:
        return self.url + "/v1/chat/completions"

    def chat_messages(self) -> list[list[dict[str, Any]]]:
        """The ``messages`` of every chat request so far (a copy)."""
        with self._lock:
            return [list(messages) for messages in self.chat_requests]

    def model_args(self, **extra: str) -> str:
        """lm_eval ``--model_args`` for ``local-completions`` against this server."""
        args = {
            "model": self.model,
            "base_url": self.completions_url,
            "tokenizer_backend": "remote",
            **extra,
        }
        return ",".join(f"{k}={v}" for k, v in args.items())

    def count(self, endpoint: str) -> int:
        with self._lock:
            return self.counts.get(endpoint, 0)

    def answers_wrongly(self, prompt: Sequence[int]) -> bool:
        """Whether this server answers the generation `prompt` (its tokens) wrongly:
        a fixed share of prompts, chosen by the prompt's hash."""
        if self.wrong_share <= 0.0:
            return False
        return _hash(list(prompt), -1) % 1_000_000 < round(self.wrong_share * 1_000_000)

    def _answer(self, prompt: Sequence[int]) -> str:
        if self.answers_wrongly(prompt):
            self._bump("wrong-answers")
            return self.wrong_text
        return self.generation_text

    def _bump(self, endpoint: str) -> int:
        with self._lock:
            self.counts[endpoint] = self.counts.get(endpoint, 0) + 1
            return self.counts[endpoint]

    # -- API ---------------------------------------------------------------

    def tokenizer_info(self) -> dict[str, Any]:
        return {
            "tokenizer_class": "ByteLevelTokenizer",
            "eos_token": EOS_TOKEN,
            "bos_token": None,
            "pad_token": EOS_TOKEN,
            "model_max_length": MAX_MODEL_LEN,
            "max_model_len": MAX_MODEL_LEN,
            "chat_template": None,
        }

    def completions(self, body: dict[str, Any]) -> dict[str, Any]:
        prompts = _prompts(body.get("prompt"), self.tokenizer)
        echo = bool(body.get("echo"))
        logprobs = body.get("logprobs")
        max_tokens = int(body.get("max_tokens") or 16)
        stop = body.get("stop") or []
        stops = [stop] if isinstance(stop, str) else [s for s in stop if isinstance(s, str)]
        choices = []
        for index, prompt in enumerate(prompts):
            if echo:
                choices.append(self._echo_choice(index, prompt, logprobs is not None))
            else:
                answer = self._answer(prompt)
                choices.append(self._generate_choice(index, max_tokens, stops, answer))
        return {
            "id": f"cmpl-{self._bump('completion-ids')}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model,
            "choices": choices,
            "usage": {"prompt_tokens": sum(len(p) for p in prompts), "completion_tokens": 1},
        }

    def chat_completions(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages
        ):
            raise ValueError("messages must be a list of {role, content} objects")
        with self._lock:
            self.chat_requests.append(messages)
            del self.chat_requests[:-MAX_CHAT_REQUESTS]
        max_tokens = int(body.get("max_tokens") or 16)
        stop = body.get("stop") or []
        stops = [stop] if isinstance(stop, str) else [s for s in stop if isinstance(s, str)]
        conversation = json.dumps(messages, sort_keys=True, separators=(",", ":"))
        answer = self._answer(self.tokenizer.encode(conversation))
        choice = self._generate_choice(0, max_tokens, stops, answer)
        return {
            "id": f"chatcmpl-{self._bump('chat-ids')}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": choice["text"]},
                    "finish_reason": choice["finish_reason"],
                }
            ],
            "usage": {"prompt_tokens": 0, "completion_tokens": 1},
        }

    def _echo_choice(self, index: int, prompt: list[int], with_logprobs: bool) -> dict[str, Any]:
        # echo + max_tokens=1: the prompt's tokens, then one generated token.
        generated = self.lm.greedy_token(prompt)
        toks = [*prompt, generated]
        token_logprobs: list[float | None] = [None]
        top_logprobs: list[dict[str, float] | None] = [None]
        for i in range(1, len(toks)):
            prefix, tok = toks[:i], toks[i]
            lp = self.lm.logprob(prefix, tok)
            token_logprobs.append(lp)
            top: dict[str, float] = {
                self.tokenizer.token_text(self.lm.greedy_token(prefix)): GREEDY_LOGPROB
            }
            top.setdefault(self.tokenizer.token_text(tok), lp)
            top_logprobs.append(top)
        texts = [self.tokenizer.token_text(t) for t in toks]
        offsets, pos = [], 0
        for t in texts:
            offsets.append(pos)
            pos += len(t)
        return {
            "index": index,
            "text": self.tokenizer.decode(toks),
            "logprobs": {
                "tokens": texts,
                "token_logprobs": token_logprobs,
                "top_logprobs": top_logprobs,
                "text_offset": offsets,
            }
            if with_logprobs
            else None,
            "finish_reason": "length",
        }

    def _generate_choice(
        self, index: int, max_tokens: int, stops: list[str], answer: str
    ) -> dict[str, Any]:
        text = self.tokenizer.decode(self.tokenizer.encode(answer)[:max_tokens])
        finish = "length"
        for s in stops:
            at = text.find(s) if s else -1
            if at >= 0:
                text, finish = text[:at], "stop"
        return {"index": index, "text": text, "logprobs": None, "finish_reason": finish}


def _prompts(prompt: Any, tokenizer: ByteTokenizer) -> list[list[int]]:
    """Normalise every prompt form of the completions API to token lists."""
    if isinstance(prompt, str):
        return [tokenizer.encode(prompt)]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) for t in prompt):
            return [list(prompt)]
        out: list[list[int]] = []
        for item in prompt:
            if isinstance(item, str):
                out.append(tokenizer.encode(item))
            elif isinstance(item, list) and all(isinstance(t, int) for t in item):
                out.append(list(item))
            else:
                raise ValueError("prompt items must be strings or token lists")
        return out
    raise ValueError("prompt must be a string, a token list, or a list of those")


def _loopback_only(host: str) -> str:
    if host == "localhost":
        return "127.0.0.1"
    try:
        if ipaddress.ip_address(host).is_loopback:
            return host
    except ValueError:
        pass
    raise ValueError(f"model server binds loopback addresses only, not {host!r}")


def _pod_ip(host: str) -> str:
    try:
        if ipaddress.ip_address(host).is_private:
            return host
    except ValueError:
        pass
    raise ValueError(f"--pod-ip: {host!r} is not a private address (a pod's own)")


class _QuietServer(ThreadingHTTPServer):
    """A client that hangs up (lm_eval killed mid-request) is not an error."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Nor is one that refuses our certificate (the TLS tests' point).
        if not isinstance(sys.exc_info()[1], ConnectionError | ssl.SSLError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    owner: ModelServer
    server_version = "lmeval-toy-model/1"

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: lm_eval's own logs are what the tests read."""

    def _send(self, status: int, payload: Any) -> None:
        data = (payload if isinstance(payload, str) else json.dumps(payload)).encode("utf-8")
        self.send_response(status)
        ctype = "text/plain" if isinstance(payload, str) else "application/json"
        self.send_header("Content-Type", f"{ctype}; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise ValueError("request body too large")
        parsed = json.loads(self.rfile.read(length) or b"{}")
        if not isinstance(parsed, dict):
            raise ValueError("request body must be a JSON object")
        return parsed

    def do_GET(self) -> None:
        owner = self.owner
        path = self.path.split("?", 1)[0].rstrip("/")
        owner._bump("GET " + path)
        if path == "/tokenizer_info":
            self._send(200, owner.tokenizer_info())
        elif path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": owner.model, "object": "model"}]})
        elif path in ("/health", ""):
            self._send(200, {"status": "ok"})
        else:
            self._send(404, {"error": f"no such endpoint: {path}"})

    def do_POST(self) -> None:
        owner = self.owner
        path = self.path.split("?", 1)[0].rstrip("/")
        n = owner._bump("POST " + path)
        try:
            body = self._body()
            if path == "/tokenize":
                prompt = body.get("prompt")
                if not isinstance(prompt, str):
                    raise ValueError("prompt must be a string")
                toks = owner.tokenizer.encode(prompt)
                self._send(
                    200, {"tokens": toks, "count": len(toks), "max_model_len": MAX_MODEL_LEN}
                )
            elif path == "/detokenize":
                ids = body.get("tokens")
                if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
                    raise ValueError("tokens must be a list of integers")
                self._send(200, {"prompt": owner.tokenizer.decode(ids)})
            elif path == "/v1/completions":
                owner.wait_for_release()
                if owner.delay > 0:
                    time.sleep(owner.delay)
                if n <= owner.fail_first:
                    self._send(500, owner.error_text)
                    return
                self._send(200, owner.completions(body))
            elif path == "/v1/chat/completions":
                owner.last_authorization = self.headers.get("Authorization")
                owner.wait_for_release()
                if owner.delay > 0:
                    time.sleep(owner.delay)
                self._send(200, owner.chat_completions(body))
            else:
                self._send(404, {"error": f"no such endpoint: {path}"})
        except (ValueError, TypeError) as exc:
            self._send(400, {"error": {"message": str(exc), "type": "invalid_request_error"}})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lmeval_sandbox.model_server",
        description="Deterministic OpenAI-compatible toy model server (loopback only).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--model", default="toy")
    parser.add_argument("--generation-text", default="42")
    parser.add_argument("--fail-first", type=int, default=0)
    parser.add_argument("--error-text", default="internal error")
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument(
        "--wrong-share",
        type=float,
        default=0.0,
        help="answer this share of generation prompts wrongly (chosen by the prompt's hash)",
    )
    parser.add_argument("--wrong-text", default="I do not know")
    parser.add_argument("--tls-cert", help="PEM certificate: serve HTTPS (with --tls-key)")
    parser.add_argument("--tls-key", help="PEM key of --tls-cert")
    parser.add_argument(
        "--hold-file", help="hold every completion until this file exists (tests' gate)"
    )
    parser.add_argument(
        "--pod-ip",
        action="store_true",
        help="--host is the pod's own private address (a Service's endpoint), not loopback",
    )
    args = parser.parse_args(argv)
    if bool(args.tls_cert) != bool(args.tls_key):
        parser.error("--tls-cert and --tls-key go together")
    server = ModelServer(
        host=args.host,
        port=args.port,
        generation_text=args.generation_text,
        model=args.model,
        fail_first=args.fail_first,
        error_text=args.error_text,
        delay=args.delay,
        tls=(args.tls_cert, args.tls_key) if args.tls_cert else None,
        wrong_share=args.wrong_share,
        wrong_text=args.wrong_text,
        hold_file=args.hold_file,
        pod_ip=args.pod_ip,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with server:
        print(f"serving {server.completions_url} and {server.chat_url}", flush=True)
        while not stop.wait(0.5):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
