"""TLS to the model endpoint and chat models, end to end (issue 18, items 2 and 3).

The sample model server serves HTTPS on 127.0.0.1 with a certificate from a
throwaway CA that nothing else trusts. Jobs run through the poller, the
local runner (the job pod as local processes), the real driver and real
lm_eval:

- ``local-completions`` with ``spec.modelTLS.caBundle`` naming a ConfigMap
  that holds the CA: the pod mounts it, the driver adds it to the trusted
  authorities, the job Succeeds;
- the same job without the CA ends Failed, its message saying that TLS
  verification of the model endpoint failed;
- ``modelArgs`` ``verify_certificate=false`` ends Failed before any pod
  exists (the poller setting allow-insecure-model-endpoints is off);
- the chat sample (``deploy/samples/chat-model.yaml``), as
  ``local-chat-completions`` and as ``openai-chat-completions`` (its API key
  from a Secret), on a generate_until task from the sample tasks
  ConfigMap, over HTTPS with the CA from a Secret, with
  ``systemInstruction``, ``chatTemplate`` and ``fewshotAsMultiturn``: the
  job Succeeds and the server received the system instruction as the first
  chat message, then the few-shot example as a separate turn.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from lmeval_sandbox.model_server import ModelServer
from lmeval_sandbox.pki import serving_ca
from lmeval_sandbox.runner import LocalRunner

from poller.cycle.reconciler import Reconciler
from poller.jobpod import modeltls
from tests.e2e.conftest import results_file, sample, submit
from tests.poller_fixtures import Jobs, cycle_until

pytestmark = [pytest.mark.cluster, pytest.mark.lmeval]

LMEVAL_TIMEOUT = 240.0
INSTRUCTION = "You are a careful calculator. Answer with the number only."


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, ModelServer]]:
    """(the throwaway CA's certificate, the sample model server on HTTPS signed by it)."""
    ca, pair = serving_ca(tmp_path_factory.mktemp("model-pki"))
    with ModelServer(tls=(str(pair.cert), str(pair.key))) as server:
        yield ca, server


def _served_job(name: str, server: ModelServer, **spec: Any) -> dict[str, Any]:
    _, job = sample("served-model", server.port)
    job = copy.deepcopy(job)
    job["metadata"]["name"] = name
    for pair in job["spec"]["modelArgs"]:
        if pair["name"] == "base_url":
            pair["value"] = server.completions_url
    job["spec"].update(limit="4", **spec)
    return job


def _finished(poller: Reconciler, jobs: Jobs, name: str) -> dict[str, Any]:
    def complete() -> dict[str, Any] | None:
        status = jobs.status(name)
        return status if status.get("state") == "Complete" else None

    found: dict[str, Any] = cycle_until(
        poller, complete, timeout=LMEVAL_TIMEOUT, what=f"{name} Complete"
    )
    return found


def _ca_configmap(jobs: Jobs, ca: Path) -> None:
    jobs.core.create_namespaced_config_map(
        jobs.namespace,
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name="model-ca"), data={"ca.crt": ca.read_text()}
        ),
    )


def test_https_model_trusted_through_a_ca_configmap(
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    runner: LocalRunner,
    tls_server: tuple[Path, ModelServer],
) -> None:
    ca, server = tls_server
    assert server.completions_url.startswith("https://127.0.0.1:")
    _ca_configmap(jobs, ca)
    before = server.count("POST /v1/completions")
    bundle = {"configMapKeyRef": {"name": "model-ca", "key": "ca.crt"}}
    submit(admin_api, jobs.namespace, _served_job("tls-ok", server, modelTLS={"caBundle": bundle}))
    final = _finished(poller, jobs, "tls-ok")
    assert final["reason"] == "Succeeded", final.get("message")
    assert server.count("POST /v1/completions") > before

    pod = jobs.pod(final["podName"])
    volume = next(v for v in pod.spec.volumes if v.name == "model-ca")
    assert volume.config_map.name == "model-ca"
    mount = next(m for m in pod.spec.containers[0].volume_mounts if m.name == "model-ca")
    assert (mount.mount_path, mount.read_only) == (modeltls.MODEL_CA_DIR, True)
    root = runner.pod_root(jobs.namespace, final["podName"])
    assert root is not None
    written = results_file(root)
    assert json.loads(final["results"]) == written
    assert set(written["results"]) == {"sample_arith_mc", "sample_arith_gen"}


def test_https_model_without_the_ca_fails_saying_tls_verification_failed(
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    runner: LocalRunner,
    tls_server: tuple[Path, ModelServer],
) -> None:
    _, server = tls_server
    submit(admin_api, jobs.namespace, _served_job("tls-untrusted", server))
    final = _finished(poller, jobs, "tls-untrusted")
    assert final["reason"] == "Failed"
    message = final["message"]
    assert "TLS verification of the model endpoint failed" in message, message
    assert "spec.modelTLS.caBundle" in message and "CERTIFICATE_VERIFY_FAILED" in message


def test_turning_verification_off_is_refused_by_default(
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    tls_server: tuple[Path, ModelServer],
) -> None:
    _, server = tls_server
    job = _served_job("tls-off", server)
    job["spec"]["modelArgs"].append({"name": "verify_certificate", "value": "false"})
    submit(admin_api, jobs.namespace, job)
    final = _finished(poller, jobs, "tls-off")
    assert final["reason"] == "Failed"
    assert "verify_certificate=false turns TLS verification" in final["message"]
    assert "allow-insecure-model-endpoints" in final["message"]
    assert not jobs.pods()


@pytest.mark.parametrize("model", ["local-chat-completions", "openai-chat-completions"])
def test_chat_model_with_system_instruction_over_https(
    model: str,
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    runner: LocalRunner,
    tls_server: tuple[Path, ModelServer],
) -> None:
    ca, server = tls_server
    jobs.core.create_namespaced_secret(
        jobs.namespace,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name="model-ca"), string_data={"ca.pem": ca.read_text()}
        ),
    )
    # openai-chat-completions sends $OPENAI_API_KEY as a bearer token.
    jobs.core.create_namespaced_secret(
        jobs.namespace,
        client.V1Secret(metadata=client.V1ObjectMeta(name="api"), string_data={"key": "sk-toy"}),
    )
    # The chat sample in deploy/samples, over HTTPS.
    _, job = sample("chat-model", server.port)
    job = copy.deepcopy(job)
    job["metadata"]["name"] = "chat"
    assert job["spec"]["systemInstruction"] == INSTRUCTION
    for pair in job["spec"]["modelArgs"]:
        if pair["name"] == "base_url":
            pair["value"] = server.chat_url
    job["spec"].update(
        model=model,
        envSecrets=[{"env": "OPENAI_API_KEY", "secretRef": {"name": "api", "key": "key"}}],
        limit="3",
        modelTLS={"caBundle": {"secretKeyRef": {"name": "model-ca", "key": "ca.pem"}}},
    )
    seen = len(server.chat_messages())
    submit(admin_api, jobs.namespace, job)
    final = _finished(poller, jobs, "chat")
    assert final["reason"] == "Succeeded", final.get("message")

    command = jobs.pod(final["podName"]).spec.containers[0].command
    assert f"--system_instruction={INSTRUCTION}" in command
    assert "--apply_chat_template" in command and "--fewshot_as_multiturn=true" in command
    received = server.chat_messages()[seen:]
    assert len(received) == 3, received
    for messages in received:
        assert messages[0] == {"role": "system", "content": INSTRUCTION}
        # The few-shot example is a turn of its own: user, assistant, then the question.
        assert [m["role"] for m in messages[1:]] == ["user", "assistant", "user"]
    if model == "openai-chat-completions":
        assert server.last_authorization == "Bearer sk-toy"
    results = json.loads(final["results"])["results"]
    assert "exact_match,none" in results["sample_arith_gen"]


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"fewshotAsMultiturn": True}, "fewshotAsMultiturn: true needs chatTemplate.enabled"),
        (
            {"fewshotAsMultiturn": True, "chatTemplate": {"enabled": False}},
            "fewshotAsMultiturn: true needs chatTemplate.enabled",
        ),
        ({"modelTLS": {"caBundle": {}}}, "set exactly one of configMapKeyRef and secretKeyRef"),
        ({"chatTemplate": {"enabled": True, "name": "--x"}}, "spec.chatTemplate.name"),
    ],
)
def test_the_apiserver_refuses_inconsistent_options(
    jobs: Jobs, spec: dict[str, Any], words: str
) -> None:
    with pytest.raises(client.exceptions.ApiException) as caught:
        jobs.create("refused", **spec)
    assert caught.value.status == 422
    assert words in json.loads(caught.value.body)["message"]
