"""The kubelet passes every string of the poller's containers on literally (issue 28, item 6).

The kubelet expands ``$(NAME)`` in a container's command, args and env
values: a defined NAME becomes its value, ``$$`` becomes ``$``, anything else
stays. A spec value holding ``$(X)`` would otherwise take the value of
another variable of the container (an env value once added pairs to
``--model_args``). Checks, with the sandbox's model of that expansion
(``lmeval_sandbox.podfs.expand_vars``, which the local runner applies as the
kubelet does; tests/node proves it on a real kubelet):

- ``kubelet_literal`` doubles every ``$``, and the expansion of its output is
  its input for tricky strings (``a$$(X)``, a trailing ``$``, ``$(X`` ...),
  where escaping only ``$(`` would fail (shown);
- in a built pod, the spec's values that reach the main container
  (``modelArgs``, ``genArgs``, ``systemInstruction``, ``spec.pod.env``)
  arrive literally after the expansion with the container's own variables,
  and no ``$`` of any container the poller builds (the main one, the Git and
  storage init containers) is left unescaped;
- the job's sidecars keep the kubelet's expansion: they are the user's own.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from lmeval_sandbox.podfs import expand_vars

from poller import api
from poller.api.settings import Settings
from poller.jobpod import podspec

ENV = {"SOME_VAR": "true,verify_certificate=False", "X": "expanded", "HOME": "/tmp"}
TRICKY = [
    "$(SOME_VAR)",
    "a$(X)",
    "a$$(X)",
    "a$$$(X)",
    "$$",
    "$",
    "ends with $",
    "$(X",
    "$(UNDEFINED)",
    "$X and ${X}",
    "no dollar at all",
    "",
]


@pytest.mark.parametrize("text", TRICKY)
def test_the_escape_survives_the_expansion(text: str) -> None:
    assert expand_vars(podspec.kubelet_literal(text), ENV) == text
    assert podspec.kubelet_literal(text).count("$") == 2 * text.count("$")


def test_escaping_only_the_opening_would_not_hold() -> None:
    """Why every ``$`` is doubled: ``a$$(X)`` with only ``$(`` escaped expands X."""
    text = "a$$(X)"
    assert expand_vars(text.replace("$(", "$$("), ENV) == "a$expanded"
    assert expand_vars(podspec.kubelet_literal(text), ENV) == text


def _spec(**fields: Any) -> api.LMEvalJobSpec:
    return api.LMEvalJobSpec.model_validate({"model": "hf", "tasks": ["arc_easy"], **fields})


def _env(container: dict[str, Any]) -> dict[str, str]:
    """The container's variables as the kubelet expands them, in order."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = expand_vars(item["value"], env)
    return env


def _unescaped(text: str) -> bool:
    return "$" in re.sub(r"\$\$", "", text)


SPEC = {
    "modelArgs": [
        {"name": "pretrained", "value": "gpt2"},
        {"name": "probe", "value": "$(SOME_VAR)"},
        {"name": "other", "value": "a$$(X)$"},
    ],
    "genArgs": [{"name": "until", "value": "$(HOME)"}],
    "systemInstruction": "Cost: $(X) or $5",
    "pod": {
        "env": [
            {"name": "SOME_VAR", "value": "true,verify_certificate=False"},
            {"name": "X", "value": "literal $(SOME_VAR)"},
        ],
        "sidecars": [
            {
                "name": "server",
                "image": "registry.example/s:1",
                "command": ["serve", "--home=$(HOME)"],
                "env": [{"name": "HOME", "value": "/srv"}],
            }
        ],
    },
    "customTasks": [{"git": {"url": "https://git.example/tasks.git", "path": "tasks"}}],
    "allowCodeExecution": True,
    "offline": {
        "storage": {
            "s3": {
                **{
                    key: {"name": "s3", "key": key}
                    for key in ("accessKeyId", "secretAccessKey", "bucket", "endpoint")
                },
                "path": "team/hf",
            }
        }
    },
}


def _pod() -> dict[str, Any]:
    settings = Settings(**{"allow-code-execution": "true", "driver-image": "reg/driver:1"})
    return podspec.build_pod(
        name="e", namespace="n", uid="u", spec=_spec(**SPEC), settings=settings
    )


def test_spec_values_reach_the_evaluation_literally() -> None:
    pod = _pod()
    main = pod["spec"]["containers"][0]
    env = _env(main)
    argv = [expand_vars(word, env) for word in main["command"]]
    assert "--model_args=pretrained=gpt2,probe=$(SOME_VAR),other=a$$(X)$" in argv
    assert "--gen_kwargs=until=$(HOME)" in argv
    assert "--system_instruction=Cost: $(X) or $5" in argv
    assert env["SOME_VAR"] == "true,verify_certificate=False"
    assert env["X"] == "literal $(SOME_VAR)"


def test_no_container_the_poller_builds_expands_anything() -> None:
    pod = _pod()
    main, *sidecars = pod["spec"]["containers"]
    ours = [main, *pod["spec"]["initContainers"]]
    names = {c["name"] for c in ours}
    assert {"lmeval", "install-driver", "fetch-storage", "git-0-fetch"} <= names
    for container in ours:
        words = [*container.get("command", []), *container.get("args", [])]
        values = [item["value"] for item in container.get("env", []) if "value" in item]
        for text in words + values:
            assert not _unescaped(text), (container["name"], text)
    assert any("$" in word for word in main["command"])
    # The user's own sidecar keeps the kubelet's expansion.
    (sidecar,) = sidecars
    assert sidecar["command"] == ["serve", "--home=$(HOME)"]
    assert [expand_vars(w, _env(sidecar)) for w in sidecar["command"]] == ["serve", "--home=/srv"]
