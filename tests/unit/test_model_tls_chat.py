"""TLS to the model endpoint and chat options: the pod and argv shaping, and the rules.

Pure checks of ``poller.jobpod.modeltls`` (the CA bundle's volume, mount and variable;
the refusal of verify_certificate=false unless the settings allow it), of the
chat options on lm_eval's argv (``podspec.lm_eval_argv``), of the schema's
"exactly one source" and "fewshotAsMultiturn needs chatTemplate" rules, and
of the driver's combined CA bundle (``driver.trust``).
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import Any

import pytest
from lmeval_sandbox import crd
from lmeval_sandbox.pki import serving_ca
from pydantic import ValidationError

from driver import protocol, trust
from poller import api
from poller.api.settings import Settings
from poller.jobpod import modeltls, podspec

CM_BUNDLE = {"configMapKeyRef": {"name": "service-ca", "key": "service-ca.crt"}}
SECRET_BUNDLE = {"secretKeyRef": {"name": "model-ca", "key": "ca.crt"}}


def _spec(**fields: Any) -> api.LMEvalJobSpec:
    return api.LMEvalJobSpec.model_validate(
        {"model": "local-completions", "tasks": ["t"], **fields}
    )


def _pod(spec: api.LMEvalJobSpec, settings: Settings | None = None) -> dict[str, Any]:
    return podspec.build_pod(
        name="e", namespace="n", uid="u", spec=spec, settings=settings or Settings()
    )


def _main(pod: dict[str, Any]) -> dict[str, Any]:
    main: dict[str, Any] = pod["spec"]["containers"][0]
    return main


@pytest.mark.parametrize(
    ("bundle", "source"),
    [
        (
            CM_BUNDLE,
            {
                "configMap": {
                    "name": "service-ca",
                    "items": [{"key": "service-ca.crt", "path": "ca.crt"}],
                }
            },
        ),
        (
            SECRET_BUNDLE,
            {"secret": {"secretName": "model-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        ),
    ],
)
def test_ca_bundle_is_mounted_read_only_and_named_for_the_driver(
    bundle: dict[str, Any], source: dict[str, Any]
) -> None:
    pod = _pod(_spec(modelTLS={"caBundle": bundle}))
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["model-ca"] == {"name": "model-ca", **source}
    main = _main(pod)
    mount = next(m for m in main["volumeMounts"] if m["name"] == "model-ca")
    assert mount == {"name": "model-ca", "mountPath": modeltls.MODEL_CA_DIR, "readOnly": True}
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert env[protocol.ENV_CA_BUNDLE] == modeltls.MODEL_CA_FILE
    # The driver sets the clients' variables for lm_eval, not the pod.
    assert not set(modeltls.TRUST_ENV) & set(env)
    assert main["securityContext"]["readOnlyRootFilesystem"] is True


def test_no_bundle_no_volume() -> None:
    pod = _pod(_spec())
    assert "model-ca" not in {v["name"] for v in pod["spec"]["volumes"]}
    assert protocol.ENV_CA_BUNDLE not in {e["name"] for e in _main(pod)["env"]}


@pytest.mark.parametrize("value", ["false", "False", "0", "", "no", " false"])
def test_verify_certificate_off_is_refused_unless_allowed(value: str) -> None:
    spec = _spec(
        modelArgs=[
            {"name": "model", "value": "m"},
            {"name": "verify_certificate", "value": value},
        ]
    )
    with pytest.raises(podspec.JobPodError) as caught:
        _pod(spec)
    message = str(caught.value)
    assert message.startswith("spec.modelArgs[1]: verify_certificate=")
    assert "allow-insecure-model-endpoints" in message and "spec.modelTLS.caBundle" in message
    allowed = _pod(spec, Settings.model_validate({"allow-insecure-model-endpoints": "true"}))
    assert f"verify_certificate={value}" in " ".join(_main(allowed)["command"])


@pytest.mark.parametrize("value", ["true", "True", "TRUE"])
def test_verify_certificate_on_is_fine(value: str) -> None:
    _pod(_spec(modelArgs=[{"name": "verify_certificate", "value": value}]))


@pytest.mark.parametrize("name", ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"])
def test_trust_variables_and_a_bundle_do_not_mix(name: str) -> None:
    spec = _spec(modelTLS={"caBundle": CM_BUNDLE}, pod={"env": [{"name": name, "value": "/x"}]})
    with pytest.raises(podspec.JobPodError, match=f"spec.pod.env: {name} cannot be set with"):
        _pod(spec)
    # Without a bundle, a job may still point the clients at a fileSecret itself.
    _pod(_spec(pod={"env": [{"name": name, "value": "/x"}]}))


@pytest.mark.parametrize("bundle", [{}, {**CM_BUNDLE, **SECRET_BUNDLE}])
def test_exactly_one_bundle_source(bundle: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="exactly one of configMapKeyRef and secretKeyRef"):
        _spec(modelTLS={"caBundle": bundle})


def test_crd_carries_the_new_rules() -> None:
    spec = crd.crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
        "spec"
    ]
    assert any(
        r["rule"].startswith("!has(self.fewshotAsMultiturn)")
        for r in spec["x-kubernetes-validations"]
    )
    bundle = spec["properties"]["modelTLS"]["properties"]["caBundle"]
    assert bundle["x-kubernetes-validations"][0]["rule"] == (
        "has(self.configMapKeyRef) != has(self.secretKeyRef)"
    )


def _argv(**fields: Any) -> list[str]:
    return podspec.lm_eval_argv(_spec(**fields), Settings())


def test_chat_options_reach_lm_eval_as_single_tokens() -> None:
    argv = _argv(
        systemInstruction="--tasks=evil\nBe brief, and exact.",
        chatTemplate={"enabled": True, "name": "tool_use"},
        fewshotAsMultiturn=True,
    )
    assert "--system_instruction=--tasks=evil\nBe brief, and exact." in argv
    assert "--apply_chat_template=tool_use" in argv
    assert "--fewshot_as_multiturn=true" in argv
    assert [a for a in argv if a.startswith("--tasks")] == ["--tasks=t"]
    assert "--apply_chat_template" in _argv(chatTemplate={"enabled": True})
    disabled = _argv(chatTemplate={"enabled": False}, fewshotAsMultiturn=False)
    assert not any(a.startswith("--apply_chat_template") for a in disabled)
    assert "--fewshot_as_multiturn=false" in disabled
    plain = _argv()
    assert not any(
        a.startswith(("--system_instruction", "--apply_chat_template", "--fewshot")) for a in plain
    )


@pytest.mark.parametrize("chat", [None, {"enabled": False}])
def test_fewshot_as_multiturn_needs_a_chat_template(chat: dict[str, Any] | None) -> None:
    fields: dict[str, Any] = {"fewshotAsMultiturn": True}
    if chat is not None:
        fields["chatTemplate"] = chat
    with pytest.raises(ValidationError, match="fewshotAsMultiturn: true needs"):
        _spec(**fields)


@pytest.mark.parametrize(
    "fields",
    [
        {"systemInstruction": "a\x00b"},
        {"systemInstruction": "x" * (api.SYSTEM_INSTRUCTION_CHARS_MAX + 1)},
        {"chatTemplate": {"enabled": True, "name": "-x"}},
        {"chatTemplate": {"enabled": True, "name": "a b"}},
    ],
)
def test_chat_strings_are_held_to_patterns(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        _spec(**fields)


def test_combined_bundle_adds_the_jobs_ca_to_the_system_ones(tmp_path: Path) -> None:
    ca, _pair = serving_ca(tmp_path / "pki")
    path, problem = trust.combined_bundle(str(ca), str(tmp_path / "tmp"), "run1")
    assert problem is None and path is not None
    data = Path(path).read_bytes()
    assert data.endswith(ca.read_bytes())
    # The image's own authorities come first, all of them.
    system = ssl.get_default_verify_paths().openssl_cafile
    if os.path.isfile(system):
        assert data.startswith(Path(system).read_bytes())
    assert data.count(b"-----BEGIN CERTIFICATE-----") > 1
    env = trust.child_env(path)
    assert env["SSL_CERT_FILE"] == env["REQUESTS_CA_BUNDLE"] == path


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (None, "cannot read"),
        (b"not a certificate\n", "holds no PEM certificate"),
        (b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", "not a usable"),
    ],
)
def test_bad_bundles_are_named(tmp_path: Path, content: bytes | None, words: str) -> None:
    bundle = tmp_path / "ca.crt"
    if content is not None:
        bundle.write_bytes(content)
    path, problem = trust.combined_bundle(str(bundle), str(tmp_path), "r")
    assert path is None and problem is not None
    assert problem.startswith("spec.modelTLS.caBundle: ") and words in problem
