"""Redaction of secrets in the logged command line, and output-path ownership.

The ``started`` marker shows the lm_eval command; these tests check that API
keys and tokens in every form lm_eval accepts never appear, that ordinary
arguments stay readable, and that every spelling of ``--output_path`` is
recognised so the driver can refuse it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from driver.argv import (
    REDACTED,
    find_output_path_flag,
    is_secret_key,
    lm_eval_version,
    new_run_id,
    redact_argv,
    redact_text,
    valid_run_id,
)


@pytest.mark.parametrize(
    "key",
    [
        "api_key",
        "apikey",
        "API_KEY",
        "hf_token",
        "auth_token",
        "authToken",
        "client_secret",
        "password",
        "db_passwd",
        "access_token",
        "secret",
        "aws_secret_access_key",
        "credentials",
    ],
)
def test_secret_keys(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize(
    "key",
    [
        "tokenizer_backend",
        "tokenizer",
        "max_tokens",
        "tokenized_requests",
        "pretrained",
        "base_url",
        "model",
    ],
)
def test_ordinary_keys(key: str) -> None:
    assert not is_secret_key(key)


def test_model_args_pairs() -> None:
    argv = [
        "python",
        "-m",
        "lm_eval",
        "--model",
        "local-completions",
        "--model_args",
        "model=m,api_key=sk-SECRET1,base_url=http://h/v1/completions,tokenizer_backend=remote",
        "--tasks",
        "t",
    ]
    out = redact_argv(argv)
    assert "SECRET1" not in " ".join(out)
    assert (
        out[6]
        == f"model=m,api_key={REDACTED},base_url=http://h/v1/completions,tokenizer_backend=remote"
    )
    assert out[:6] == argv[:6] and out[7:] == argv[7:]


def test_model_args_as_separate_tokens_and_equals_form() -> None:
    out = redact_argv(
        ["--model_args", "pretrained=x", "hf_token=SECRET2", "--model_args=auth_token=SECRET3,a=b"]
    )
    joined = " ".join(out)
    assert "SECRET2" not in joined and "SECRET3" not in joined
    assert "pretrained=x" in joined and "a=b" in joined


def test_secret_flags() -> None:
    out = redact_argv(
        ["--api_key", "SECRET4", "--hf-token=SECRET5", "--tasks", "t", "--apikey", "-SECRET6"]
    )
    joined = " ".join(out)
    for s in ("SECRET4", "SECRET5", "SECRET6"):
        assert s not in joined
    assert out[:2] == ["--api_key", REDACTED]
    assert "--tasks" in out and "t" in out


def test_urls_and_json() -> None:
    text = redact_text("base_url=https://user:SECRET7@host/v1?x=1&token=SECRET8")
    assert "SECRET7" not in text and "SECRET8" not in text and "user" in text and "x=1" in text
    as_json = redact_text(
        json.dumps({"api_key": "SECRET9", "nested": {"password": "SECRET10"}, "n": 1})
    )
    assert "SECRET9" not in as_json and "SECRET10" not in as_json
    assert json.loads(as_json)["n"] == 1


def test_long_keys_and_schemes_still_redacted() -> None:
    # The patterns match keys of at most 64 and schemes of at most 32
    # characters (unbounded runs made redaction quadratic in a word's length):
    # what names a secret is at the end of a key, and a longer scheme still
    # has its password hidden.
    long_key = "x" * 200 + "_api_key=SECRET11"
    assert "SECRET11" not in redact_text(f"model=m,{long_key}")
    long_scheme = "a" * 100 + "://user:SECRET12@host/v1"
    assert "SECRET12" not in redact_text(long_scheme)
    # Words built to make the old patterns backtrack come back whole.
    for word in ("a" * 32_000 + "!=x", "a" * 32_000 + "://", "k" * 20_000 + "://u:" + "p" * 9_000):
        assert redact_text(word)[:100] == word[:100]


def test_plain_arguments_untouched() -> None:
    argv = ["python", "-m", "lm_eval", "--tasks", "a,b", "--num_fewshot", "5", "--limit", "0.5"]
    assert redact_argv(argv) == argv


@pytest.mark.parametrize(
    "argv",
    [
        ["--output_path", "x"],
        ["--output_path=x"],
        ["-o", "x"],
        ["-ox"],
        ["--output", "x"],
        ["--out=x"],
    ],
)
def test_output_path_spellings_found(argv: list[str]) -> None:
    assert find_output_path_flag(["--tasks", "t", *argv]) == argv[0]


def test_no_output_path() -> None:
    assert find_output_path_flag(["--tasks", "t", "--log_samples", "--model_args", "a=b"]) is None


def test_lm_eval_version_from_metadata_directory(tmp_path: Path) -> None:
    (tmp_path / "lm_eval-9.8.7.dist-info").mkdir()
    assert lm_eval_version([str(tmp_path / "missing"), str(tmp_path)]) == "9.8.7"
    assert lm_eval_version([str(tmp_path / "missing")]) is None
    import importlib.metadata

    assert lm_eval_version() == importlib.metadata.version("lm_eval")


def test_run_ids() -> None:
    ids = {new_run_id() for _ in range(50)}
    assert len(ids) == 50 and all(valid_run_id(i) for i in ids)
    for bad in ["", ".", "..", "a/b", "../x", "x" * 200, "-x"]:
        assert not valid_run_id(bad)
