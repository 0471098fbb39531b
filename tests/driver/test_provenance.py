"""driver.provenance: where the models listing is, and what a listing gives.

Checks that ``base_url`` is found in every form lm_eval accepts for
``--model_args`` (``k=v,k=v``, several tokens, ``=``-joined, JSON), that the
listing's URL replaces the endpoint (completions and chat completions) and
keeps no credentials in what is logged, and that the listing is read
through the sample model server with the Bearer key, bounded, and fails
as a note; and that a merge pod reports each shard from the record beside
its results, malformed entries zeroed, an unreadable record ignored.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from lmeval_sandbox.model_server import ModelServer

from driver import provenance
from driver.protocol import SHARDS_RECORD
from driver.provenance import shard_records


class Notes:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def note(self, text: str) -> None:
        self.lines.append(text)


@pytest.mark.parametrize(
    "argv",
    [
        ["--model_args", "model=m,base_url=http://h:1/v1/completions,num_concurrent=2"],
        ["--model_args", "model=m", "base_url=http://h:1/v1/completions", "--tasks", "x"],
        ["--model_args=base_url=http://h:1/v1/completions"],
        ["-a", '{"model": "m", "base_url": "http://h:1/v1/completions"}'],
    ],
)
def test_base_url_is_found_in_every_model_args_form(argv: list[str]) -> None:
    assert provenance.model_base_url(["lm_eval", *argv]) == "http://h:1/v1/completions"


def test_a_local_model_has_no_base_url() -> None:
    assert provenance.model_base_url(["--model", "hf", "--model_args", "pretrained=x"]) is None
    assert provenance.model_base_url(["--tasks", "base_url=http://h/v1/completions"]) is None


def test_the_models_url_replaces_the_endpoint() -> None:
    assert provenance.models_url("https://h/v1/completions") == "https://h/v1/models"
    assert provenance.models_url("https://h/v1/chat/completions/") == "https://h/v1/models"
    assert provenance.models_url("http://h:8000/openai/v1/completions") == (
        "http://h:8000/openai/v1/models"
    )
    assert provenance.models_url("file:///etc/passwd") is None


def test_the_listing_is_read_with_the_key_and_a_failure_is_a_note() -> None:
    with ModelServer() as server:
        argv = ["--model_args", server.model_args()]
        notes = Notes()
        listed = provenance.server_models(argv, {"OPENAI_API_KEY": "k"}, notes)  # type: ignore[arg-type]
        assert listed == server.model and notes.lines == []
        assert server.count("GET /v1/models") == 1
    notes = Notes()
    gone = ["--model_args", "base_url=http://user:secret@127.0.0.1:9/v1/completions"]
    assert provenance.server_models(gone, {}, notes) == ""  # type: ignore[arg-type]
    (line,) = notes.lines
    assert line.startswith("server models: GET http://127.0.0.1:9/v1/models failed")
    assert "secret" not in line


def test_the_key_is_sent_as_a_bearer_token_and_a_listing_is_bounded() -> None:
    seen: list[str | None] = []
    body = {"data": [{"id": "a"}, {"id": "b"}, {"no": "id"}, {"id": "x" * 600}]}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/v1/models"
        listed = provenance.fetch_server_models(url, None, "sk-test")
    finally:
        server.shutdown()
        server.server_close()
    assert seen == ["Bearer sk-test"]
    assert listed.startswith("a,b,xxx") and len(listed) == provenance.MAX_SERVER_MODELS_CHARS
    assert listed.endswith("...")


def test_a_merge_reports_each_shard_from_the_record_beside_its_results(tmp_path: Path) -> None:
    results = tmp_path / "toy" / "results_2026-12-04T12-00-00.json"
    results.parent.mkdir()
    results.write_text("{}")
    assert shard_records(str(results)) == []  # an unsharded run: no record
    record = {
        "count": 2,
        "shards": [
            {"index": 0, "documents": {"a": 5, "b": 3}, "requests": 16, "cached": 4,
             "samples_sha256": "ab" * 32, "shard_summary": "shard 0/2: 16 requests, 4 ..."},
            {"index": 1, "documents": "many", "requests": True, "cached": -2},
            "not a shard",
        ],
    }  # fmt: skip
    (results.parent / SHARDS_RECORD).write_text(json.dumps(record))
    assert shard_records(str(results)) == [
        {"index": 0, "documents": 8, "requests": 16, "cached": 4,
         "samples_sha256": "ab" * 32, "summary": "shard 0/2: 16 requests, 4 ..."},
        {"index": 1, "documents": 0, "requests": 0, "cached": 0, "samples_sha256": "",
         "summary": ""},
    ]  # fmt: skip
    (results.parent / SHARDS_RECORD).write_text("{not json")
    assert shard_records(str(results)) == []
