"""Real lm_eval through the driver against the toy server over HTTPS (a private CA).

With ``$LMEVAL_CA_BUNDLE`` naming the CA, the driver adds it to the image's
authorities and both of lm_eval's HTTP clients (requests for the remote
tokenizer, aiohttp for the batched completions) trust the server: the run
completes. Without it, the run fails and the driver's final message says
first that TLS verification failed and how to fix it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from lmeval_sandbox.model_server import ModelServer
from lmeval_sandbox.pki import serving_ca

from driver.protocol import ENV_CA_BUNDLE, EXIT_DRIVER_ERROR
from tests.driver.conftest import DriverRun, Tasks, lm_eval_cmd, run_driver

pytestmark = pytest.mark.lmeval


@pytest.fixture(scope="module")
def ca_and_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, ModelServer]]:
    ca, pair = serving_ca(tmp_path_factory.mktemp("model-pki"))
    with ModelServer(tls=(str(pair.cert), str(pair.key))) as server:
        yield ca, server


def _run(
    server: ModelServer, tasks: Tasks, env: dict[str, str], root: Path, ca: Path | None
) -> DriverRun:
    env = dict(env)
    if ca is not None:
        env[ENV_CA_BUNDLE] = str(ca)
    return run_driver(
        ["--output-root", str(root), "--progress-interval", "0"],
        lm_eval_cmd(
            "--model",
            "local-completions",
            "--model_args",
            server.model_args(),
            "--tasks",
            f"{tasks.mc},{tasks.gen}",
            "--include_path",
            str(tasks.path),
            "--limit",
            "2",
        ),
        env,
    )


def test_https_endpoint_trusted_through_the_job_ca(
    ca_and_server: tuple[Path, ModelServer],
    tasks: Tasks,
    lmeval_env: dict[str, str],
    tmp_path: Path,
) -> None:
    ca, server = ca_and_server
    assert server.url.startswith("https://127.0.0.1:")
    run = _run(server, tasks, lmeval_env, tmp_path, ca)
    assert run.returncode == 0, run.describe()
    outcome = run.decoded().outcome
    assert outcome is not None and outcome.event == "completed"
    # Both clients went through: the remote tokenizer (requests) and the
    # completions (aiohttp).
    assert server.count("GET /tokenizer_info") > 0
    assert server.count("POST /v1/completions") > 0


def test_https_endpoint_without_the_ca_fails_saying_so(
    ca_and_server: tuple[Path, ModelServer],
    tasks: Tasks,
    lmeval_env: dict[str, str],
    tmp_path: Path,
) -> None:
    _, server = ca_and_server
    run = _run(server, tasks, lmeval_env, tmp_path, None)
    assert run.returncode == 1, run.describe()
    outcome = run.decoded().outcome
    assert outcome is not None and outcome.event == "failed"
    assert outcome.message.startswith("TLS verification of the model endpoint failed"), outcome
    assert "spec.modelTLS.caBundle" in outcome.message
    assert "CERTIFICATE_VERIFY_FAILED" in outcome.message


def test_an_unusable_bundle_is_a_driver_error(
    ca_and_server: tuple[Path, ModelServer],
    tasks: Tasks,
    lmeval_env: dict[str, str],
    tmp_path: Path,
) -> None:
    _, server = ca_and_server
    empty = tmp_path / "empty.crt"
    empty.write_text("")
    run = _run(server, tasks, lmeval_env, tmp_path / "out", empty)
    assert run.returncode == EXIT_DRIVER_ERROR, run.describe()
    outcome = run.decoded().outcome
    assert outcome is not None and outcome.message.startswith("spec.modelTLS.caBundle: ")
    assert run.decoded().started is None  # lm_eval never started
