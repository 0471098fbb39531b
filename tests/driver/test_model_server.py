"""The loopback toy model server speaks what lm_eval 0.4.13 expects.

Checks the vLLM-style tokenizer endpoints, the completions response shapes
(parsed by lm_eval's own ``LocalCompletionsAPI`` parsers), determinism,
stop sequences, failure injection, a model made worse on purpose (a fixed
share of prompts, chosen by their hash, answered wrongly), the chat endpoint,
the loopback-only rule and the standalone ``python -m lmeval_sandbox.model_server`` form.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from lmeval_sandbox.model_server import EOS_TOKEN, ModelServer

from tests.driver.conftest import child_env

OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback, never a proxy


def call(url: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with OPENER.open(req, timeout=30) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module")
def srv() -> Iterator[ModelServer]:
    with ModelServer(generation_text="The answer is 4.\n::lmeval::{}\nmore") as server:
        yield server


def test_tokenizer_endpoints(srv: ModelServer) -> None:
    info = call(srv.url + "/tokenizer_info")
    assert info["eos_token"] == EOS_TOKEN
    text = f"h\u00e9llo {EOS_TOKEN} w\u00f6rld"
    tokens = call(srv.url + "/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"]
    assert 256 in tokens and all(isinstance(t, int) for t in tokens)
    assert call(srv.url + "/detokenize", {"tokens": tokens})["prompt"] == text


def test_loglikelihood_response_parses_with_lm_evals_parser(srv: ModelServer) -> None:
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    prompts = [list(b"Question: 2+2?\nAnswer: 4"), list(b"Question: 2+2?\nAnswer: 5")]
    body = {
        "model": "toy",
        "prompt": prompts,
        "temperature": 0,
        "max_tokens": 1,
        "logprobs": 1,
        "seed": 1234,
        "echo": True,
    }
    out = call(srv.completions_url, body)
    assert [c["index"] for c in out["choices"]] == [0, 1]
    for choice, prompt in zip(out["choices"], prompts, strict=True):
        lp = choice["logprobs"]
        assert (
            len(lp["tokens"])
            == len(lp["token_logprobs"])
            == len(lp["top_logprobs"])
            == len(prompt) + 1
        )
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    ctxlen = len(b"Question: 2+2?\nAnswer:")
    parsed = LocalCompletionsAPI.parse_logprobs(out, tokens=prompts, ctxlens=[ctxlen, ctxlen])
    assert len(parsed) == 2
    assert all(
        isinstance(score, float) and score < 0 and isinstance(greedy, bool)
        for score, greedy in parsed
    )
    assert parsed[0][0] != parsed[1][0]
    # Deterministic: the same request gives the same numbers.
    again = call(srv.completions_url, body)
    assert [c["logprobs"] for c in again["choices"]] == [c["logprobs"] for c in out["choices"]]


def test_greedy_flag_follows_top_logprobs(srv: ModelServer) -> None:
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    # Build a sequence of greedy tokens: each next token is the model's top choice.
    prompt = list(b"seed")
    for _ in range(3):
        prompt.append(srv.lm.greedy_token(prompt))
    body = {"prompt": [prompt], "max_tokens": 1, "logprobs": 1, "echo": True}
    ((_score, greedy),) = LocalCompletionsAPI.parse_logprobs(
        call(srv.completions_url, body), ctxlens=[4]
    )
    assert greedy is True


def test_generation_text_stop_and_max_tokens(srv: ModelServer) -> None:
    gen = call(srv.completions_url, {"prompt": ["Q?", "R?"], "max_tokens": 256, "stop": ["\n\n"]})
    assert [c["text"] for c in gen["choices"]] == [srv.generation_text] * 2
    stopped = call(srv.completions_url, {"prompt": "Q?", "max_tokens": 256, "stop": ["\n"]})
    assert stopped["choices"][0]["text"] == "The answer is 4."
    short = call(srv.completions_url, {"prompt": "Q?", "max_tokens": 3})
    assert short["choices"][0]["text"] == "The"


def test_failure_injection_then_recovery() -> None:
    with ModelServer(fail_first=1, error_text="nope ::lmeval::{}") as server:
        with pytest.raises(urllib.error.HTTPError) as err:
            call(server.completions_url, {"prompt": "x", "max_tokens": 1})
        assert err.value.code == 500 and err.value.read().decode() == "nope ::lmeval::{}"
        assert call(server.completions_url, {"prompt": "x", "max_tokens": 1})["choices"]


def test_bad_requests_get_400(srv: ModelServer) -> None:
    with pytest.raises(urllib.error.HTTPError) as err:
        call(srv.completions_url, {"prompt": [{"role": "user"}]})
    assert err.value.code == 400


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.1", "example.com", "::"])
def test_refuses_non_loopback(host: str) -> None:
    with pytest.raises(ValueError, match="loopback"):
        ModelServer(host=host)


def test_standalone(tmp_path: Any) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "lmeval_sandbox.model_server", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(tmp_path),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("serving http://127.0.0.1:")
        url = line.split()[1].removesuffix("/v1/completions")
        assert call(url + "/tokenizer_info")["eos_token"] == EOS_TOKEN
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_chat_endpoint_answers_and_keeps_what_it_received(srv: ModelServer) -> None:
    from lm_eval.models.openai_completions import LocalChatCompletion

    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Question: 2+2?\nAnswer:"},
    ]
    body = {"model": "toy", "messages": messages, "max_tokens": 64, "stop": ["\n"]}
    before = len(srv.chat_messages())
    out = call(srv.chat_url, body)
    # lm_eval's own parser (it reads only think_end_token from the model).
    model = SimpleNamespace(think_end_token=None)
    parsed = LocalChatCompletion.parse_generations(model, out)  # type: ignore[arg-type]
    assert parsed == ["The answer is 4."]
    assert srv.chat_messages()[before:] == [messages]
    with pytest.raises(urllib.error.HTTPError) as caught:
        call(srv.chat_url, {"messages": "not a list"})
    assert caught.value.code == 400


def test_wrong_share_answers_a_fixed_share_of_prompts_wrongly_and_reruns_agree() -> None:
    prompts = [f"Question: what is {i} plus {i}?\nAnswer:" for i in range(400)]
    with ModelServer(generation_text="42", wrong_share=0.3, wrong_text="no") as worse:
        body = {"model": "toy", "prompt": prompts, "max_tokens": 8, "temperature": 0}
        texts = [c["text"] for c in call(worse.completions_url, body)["choices"]]
        again = [c["text"] for c in call(worse.completions_url, body)["choices"]]
        chat = {"model": "toy", "messages": [{"role": "user", "content": prompts[0]}]}
        chat_text = call(worse.chat_url, chat)["choices"][0]["message"]["content"]
        assert worse.count("wrong-answers") == 2 * texts.count("no") + (chat_text == "no")
    assert texts == again and set(texts) == {"42", "no"}
    assert 0.25 < texts.count("no") / len(texts) < 0.35
    wrong = [worse.answers_wrongly(list(p.encode())) for p in prompts]
    assert wrong == [t == "no" for t in texts]
    with ModelServer(generation_text="42") as good:
        assert not any(good.answers_wrongly(list(p.encode())) for p in prompts)
    with pytest.raises(ValueError, match="wrong_share"):
        ModelServer(wrong_share=1.5)
