"""The spec's smaller holes, closed in the pydantic models (issue 15, class 6).

The poller validates every spec again with these models, so each rule here
is also what ends a job stored under an older schema Failed with a message
naming the field. Checks: ``limit`` refuses a zero fraction and admits (0, 1]
and whole numbers; NUL and other control characters are refused in every
free-form string that reaches a process or the container runtime, while tab
and newlines stay allowed where text may span lines; the joined
``--model_args``, ``--gen_kwargs`` and ``--tasks`` tokens, the evaluation
container's environment and a sidecar's command and args are bounded in
bytes (UTF-8 counted as the kernel counts it); a fileSecret may not be
mounted over code or the poller's own mounts; loader and interpreter
variables (``LD_*``, glibc's unsecure list, ``PYTHON*`` but a few,
``LMEVAL_*``) and the poller's own are refused in ``spec.pod.env`` and
``spec.envSecrets``, and every variable the poller sets is on that list;
label and annotation keys the poller stamps, and annotations that set a
seccomp or AppArmor profile in any form, are refused. The same rules appear
in the generated CRD as CEL (the real apiserver runs them in
tests/cluster/test_schema_limits.py).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from lmeval_sandbox import crd
from pydantic import ValidationError

from poller import api
from poller.api import rules as specrules
from poller.api.settings import Settings
from poller.decisions import decide
from poller.decisions.actions import CreatePod, PatchStatus
from poller.decisions.observed import Observed
from poller.decisions.views import JobView
from poller.jobpod import podspec
from poller.timefmt import format_time

KIB = 1024


def _validate(**fields: Any) -> api.LMEvalJobSpec:
    return api.LMEvalJobSpec.model_validate({"model": "hf", "tasks": ["arc_easy"], **fields})


def _refused(where: str, *words: str, **fields: Any) -> None:
    """`fields` are refused, and the first error names `where` and says `words`."""
    with pytest.raises(ValidationError) as refused:
        _validate(**fields)
    first = refused.value.errors()[0]
    location = ".".join(str(part) for part in first["loc"])
    assert location.startswith(where), (location, first["msg"])
    for word in words:
        assert word in first["msg"], (word, first["msg"])


def _pairs(count: int, size: int) -> list[dict[str, str]]:
    return [{"name": f"a{i}", "value": "v" * size} for i in range(count)]


# -- limit ---------------------------------------------------------------------


@pytest.mark.parametrize("limit", ["0", "0.0", ".0", "0.000", "0.000000000", "00.5", "1.01", "-1"])
def test_limit_refuses_zero_and_fractions_outside_the_unit_interval(limit: str) -> None:
    _refused("limit", limit=limit)


@pytest.mark.parametrize("limit", ["0.5", "1", "1.0", ".25", "0.000000001", "0.10", "100"])
def test_limit_admits_fractions_in_the_unit_interval_and_counts(limit: str) -> None:
    assert _validate(limit=limit).limit == limit


# -- control characters ----------------------------------------------------------


def _sidecar(**fields: Any) -> dict[str, Any]:
    return {"pod": {"sidecars": [{"name": "proxy", "image": "registry.example/p:1", **fields}]}}


CONTROL_CHARACTERS = [
    ("modelArgs.0.value", {"modelArgs": [{"name": "pretrained", "value": "gpt2\x00x"}]}),
    ("modelArgs.0.value", {"modelArgs": [{"name": "pretrained", "value": "a\tb"}]}),
    ("genArgs.0.value", {"genArgs": [{"name": "until", "value": "\x1b[2J"}]}),
    ("pod.env.0.value", {"pod": {"env": [{"name": "A", "value": "x\x00y"}]}}),
    ("pod.env.0.value", {"pod": {"env": [{"name": "A", "value": "\x9b31m"}]}}),
    ("pod.sidecars.0.image", _sidecar(image="busybox\x00")),
    ("pod.sidecars.0.command.0", _sidecar(command=["sh\x00"])),
    ("pod.sidecars.0.args.0", _sidecar(args=["\x07"])),
    ("pod.sidecars.0.env.0.value", _sidecar(env=[{"name": "A", "value": "\x00"}])),
    ("annotations.note", {"annotations": {"note": "a\x00b"}}),
    ("labels.team", {"labels": {"team": "a\x00"}}),
    ("pod.nodeSelector.pool", {"pod": {"nodeSelector": {"pool": "\x00"}}}),
    ("pod.tolerations.0.value", {"pod": {"tolerations": [{"key": "k", "value": "\x00"}]}}),
]


@pytest.mark.parametrize(
    ("where", "fields"), CONTROL_CHARACTERS, ids=[w for w, _ in CONTROL_CHARACTERS]
)
def test_control_characters_are_refused_where_they_reach_a_process(
    where: str, fields: dict[str, Any]
) -> None:
    _refused(where, **fields)


def test_text_that_spans_lines_keeps_tab_and_newlines() -> None:
    spec = _validate(
        pod={
            "env": [{"name": "CA_PEM", "value": "-----BEGIN-----\r\nAAAA\n-----END-----\n"}],
            "sidecars": [
                {
                    "name": "proxy",
                    "image": "registry.example/p:1",
                    "command": ["sh", "-c"],
                    "args": ["set -e\n\techo ready\n"],
                }
            ],
        },
        annotations={"notes": "line one\nline two", "example.com/owner": "évals ✓"},
        modelArgs=[{"name": "pretrained", "value": "org/model é"}],
    )
    assert spec.pod is not None and spec.pod.env is not None
    assert spec.pod.env[0].value.endswith("\n")


# -- sizes of what reaches execve ------------------------------------------------------


def test_the_joined_model_args_token_is_bounded() -> None:
    # The hostile run's 40 pairs of 4 KiB: one --model_args= token of 160 KiB.
    _refused("modelArgs", "--model_args=", "at most 32768", modelArgs=_pairs(40, 4096))
    # 30 KiB is admitted; the bound is on the joined "a0=v...,a1=v..." bytes:
    # 9 pairs "aN=" + 3637 bytes, with 8 commas, are exactly 32768.
    assert _validate(modelArgs=_pairs(8, 3836)).model_args
    argv = podspec.lm_eval_argv(_validate(modelArgs=_pairs(9, 3637)), Settings())
    (token,) = (a for a in argv if a.startswith("--model_args="))
    assert len(token) == len("--model_args=") + specrules.ARGV_TOKEN_BYTES_MAX
    over = [*_pairs(8, 3637), {"name": "a8", "value": "v" * 3638}]
    _refused("modelArgs", "these take 32769", modelArgs=over)


def test_sizes_count_utf8_bytes_not_characters() -> None:
    # 9 values of 4000 two-byte characters: 36,000 characters, 72,000 bytes.
    wide = [{"name": f"a{i}", "value": "é" * 4000} for i in range(9)]
    _refused("genArgs", "--gen_kwargs=", genArgs=wide)
    assert _validate(genArgs=wide[:4]).gen_args


def test_tasks_and_pair_counts_are_bounded() -> None:
    _refused("tasks", "--tasks=", tasks=[f"t{i}_" + "x" * 200 for i in range(200)])
    assert _validate(tasks=[f"task_{i}" for i in range(200)]).tasks
    _refused("modelArgs", modelArgs=_pairs(api.ARG_PAIRS_MAX + 1, 1))


def test_the_evaluation_environment_is_bounded() -> None:
    big = [{"name": f"V{i}", "value": "x" * 30000} for i in range(3)]
    _refused("pod.env", "at most 65536 bytes", "these take 90012", pod={"env": big})
    assert _validate(pod={"env": big[:2]}).pod
    many = [{"name": f"V{i}", "value": ""} for i in range(specrules.CONTAINER_ENV_ITEMS_MAX + 1)]
    _refused("pod.env", pod={"env": many})
    secrets = [
        {"env": f"S{i}", "secretRef": {"name": "s", "key": "k"}}
        for i in range(specrules.ENV_SECRETS_MAX + 1)
    ]
    _refused("envSecrets", envSecrets=secrets)
    files = [
        {"secretRef": {"secretName": "s"}, "mountPath": f"/s/{i}"}
        for i in range(specrules.FILE_SECRETS_MAX + 1)
    ]
    _refused("fileSecrets", fileSecrets=files)


def test_sidecar_command_and_args_are_bounded() -> None:
    _refused("pod.sidecars.0.args", "at most 32768", **_sidecar(args=["a" * 4096] * 9))
    assert _validate(**_sidecar(args=["a" * 4096] * 7)).pod


# -- variables that load code into the driver ---------------------------------------------

REFUSED_ENV = [
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "GCONV_PATH",
    "GLIBC_TUNABLES",
    "TMPDIR",
    "PYTHONPATH",
    "PYTHONSTARTUP",
    "PYTHONWARNINGS",
    "PYTHONIOENCODING",
    "LMEVAL_RUN_ID",
    "HOME",
    "HF_HUB_OFFLINE",
]


@pytest.mark.parametrize("name", REFUSED_ENV)
def test_loader_and_poller_variables_are_refused(name: str) -> None:
    _refused("pod.env.0.name", f"{name} cannot be set by a job", pod={"env": [{"name": name}]})
    secret = {"env": name, "secretRef": {"name": "s", "key": "k"}}
    _refused("envSecrets.0.env", f"{name} cannot be set", envSecrets=[secret])


@pytest.mark.parametrize("name", ["PYTHONHASHSEED", "PYTHONUTF8", "HF_TOKEN", "OMP_NUM_THREADS"])
def test_harmless_variables_are_admitted(name: str) -> None:
    secret = {"env": name, "secretRef": {"name": "s", "key": "k"}}
    assert _validate(pod={"env": [{"name": name, "value": "1"}]}, envSecrets=[secret])


def test_a_sidecar_may_set_loader_variables_for_itself() -> None:
    assert _validate(**_sidecar(env=[{"name": "LD_PRELOAD", "value": "/lib/x.so"}])).pod


def test_every_variable_the_poller_sets_is_reserved() -> None:
    for copied_driver in (False, True):
        settings = Settings(driver_image="registry.example/driver:1" if copied_driver else "")
        pod = podspec.build_pod(
            name="e", namespace="n", uid="u", spec=_validate(), settings=settings
        )
        (main,) = (c for c in pod["spec"]["containers"] if c["name"] == podspec.MAIN_CONTAINER)
        for variable in main["env"]:
            assert specrules.env_name_problem(variable["name"]), variable["name"]


# -- where a Secret may be mounted ------------------------------------------------------------


def _file_secret(path: str) -> dict[str, Any]:
    return {"fileSecrets": [{"secretRef": {"secretName": "s"}, "mountPath": path}]}


@pytest.mark.parametrize(
    "path",
    [
        "/usr/local/lib/python3.11/site-packages",
        "/usr/lib",
        "/lib/x86_64-linux-gnu",
        "/opt/lmeval-driver",
        "/opt/lmeval/tasks/t",
        "/tmp",
        "/outputs/x",
        "/cache/huggingface",
        "/etc",
        "/etc/python3.11",
        "/etc/ld.so.conf.d",
    ],
)
def test_secrets_may_not_shadow_code_or_the_pollers_mounts(path: str) -> None:
    _refused("fileSecrets.0.mountPath", f"{path}: a Secret mounted there", **_file_secret(path))


@pytest.mark.parametrize("path", ["/", "//usr", "/usr/", "/x/../usr", "/./usr", "/a/."])
def test_mount_paths_are_absolute_and_normal(path: str) -> None:
    _refused("fileSecrets.0.mountPath", **_file_secret(path))


@pytest.mark.parametrize("path", ["/etc/s", "/secrets/hf", "/etc/ssl/certs", "/var/run/x", "/usr2"])
def test_ordinary_mount_paths_are_admitted(path: str) -> None:
    assert _validate(**_file_secret(path)).file_secrets


def test_every_path_the_poller_mounts_is_reserved() -> None:
    settings = Settings(driver_image="registry.example/driver:1")
    spec = _validate(customTasks=[{"configMap": "tasks"}], outputs={"pvcName": "out"})
    pod = podspec.build_pod(name="e", namespace="n", uid="u", spec=spec, settings=settings)
    containers = pod["spec"]["containers"] + pod["spec"]["initContainers"]
    paths = {m["mountPath"] for c in containers for m in c.get("volumeMounts", [])}
    assert podspec.DRIVER_MOUNT in paths
    for path in paths:
        assert specrules.mount_path_problem(path), path


# -- label and annotation keys ------------------------------------------------------------

POLLER_KEYS = [
    "app.kubernetes.io/managed-by",
    "foundation-model-stack.github.com/job-uid",
    "foundation-model-stack.github.com/anything",
    "poller.foundation-model-stack.github.com/x",
]
SECURITY_KEYS = [
    "seccomp.security.alpha.kubernetes.io/pod",
    "container.seccomp.security.alpha.kubernetes.io/lmeval",
    "container.apparmor.security.beta.kubernetes.io/lmeval",
    "apparmor.security.beta.kubernetes.io/lmeval",
    "seccomp-profile.kubernetes.cri-o.io/lmeval",
]


@pytest.mark.parametrize("key", POLLER_KEYS)
def test_keys_the_poller_stamps_are_refused(key: str) -> None:
    owned = "are set by the poller on the job pod; a job may not set them: " + key
    _refused("labels", owned, labels={key: "x"})
    _refused("annotations", owned, annotations={key: "x"})


@pytest.mark.parametrize("key", SECURITY_KEYS)
def test_seccomp_and_apparmor_annotations_are_refused_in_any_form(key: str) -> None:
    words = f"annotations that set a seccomp or AppArmor profile are not allowed: {key}"
    _refused("annotations", words, annotations={key: "x"})


def test_ordinary_labels_and_annotations_are_admitted() -> None:
    keys = {"team": "evals", "app.kubernetes.io/name": "eval", "example.com/owner": "a.b"}
    spec = _validate(labels=keys, annotations=keys)
    assert spec.labels == keys and spec.annotations == keys
    _refused("labels", labels={"bad key": "x"})


# -- a job stored under an older schema ----------------------------------------------------

STALE = [
    ({"limit": "0.0"}, "spec.limit:"),
    ({"modelArgs": [{"name": "a", "value": "x\x00"}]}, "spec.modelArgs.0.value:"),
    ({"modelArgs": _pairs(40, 4096)}, "spec.modelArgs: Value error, joined into lm_eval's"),
    (
        {"pod": {"env": [{"name": "LD_PRELOAD", "value": "/opt/lmeval/tasks/t/x.so"}]}},
        "spec.pod.env.0.name: Value error, LD_PRELOAD cannot be set by a job",
    ),
    (
        {"annotations": {"container.seccomp.security.alpha.kubernetes.io/lmeval": "unconfined"}},
        "spec.annotations: Value error, annotations that set a seccomp or AppArmor profile",
    ),
]


@pytest.mark.parametrize(("spec", "words"), STALE, ids=[w.split(":")[0] for _, w in STALE])
def test_a_job_stored_under_an_older_schema_ends_failed_naming_the_field(
    spec: dict[str, Any], words: str
) -> None:
    now = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
    stored = JobView.from_object(
        {
            "metadata": {
                "namespace": "ns",
                "name": "stale",
                "uid": "uid-1",
                "generation": 1,
                "resourceVersion": "1",
                "creationTimestamp": format_time(now),
            },
            "spec": {"model": "dummy", "tasks": ["toy"], **spec},
            "status": {},
        }
    )
    decision = decide.decide(Observed(stored, None), Settings(), now)
    assert not any(isinstance(a, CreatePod) for a in decision.actions)
    (patch,) = (a for a in decision.actions if isinstance(a, PatchStatus))
    assert patch.status.reason == api.JobReason.FAILED
    assert words in (patch.status.message or ""), patch.status.message


# -- the same rules reach the CRD ------------------------------------------------------------


def _validations(schema: Any) -> list[dict[str, str]]:
    found: list[dict[str, str]] = []
    if isinstance(schema, dict):
        found += schema.get("x-kubernetes-validations", [])
        for value in schema.values():
            found += _validations(value)
    elif isinstance(schema, list):
        for value in schema:
            found += _validations(value)
    return found


def test_every_rule_is_in_the_crd_as_cel() -> None:
    (version,) = crd.crd_manifest()["spec"]["versions"]
    rules = _validations(version["schema"]["openAPIV3Schema"]["properties"]["spec"])
    texts = [r["message"] for r in rules]
    for words in (
        "--model_args=",
        "--gen_kwargs=",
        "--tasks=",
        "cannot be set by a job",
        "are set by the poller",
        "seccomp or AppArmor profile",
        "NAME=value and a NUL",
        "a NUL each",
        "this path is reserved",
    ):
        assert any(words in text for text in texts), words
    limit = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["limit"]
    assert limit["pattern"] == api.LIMIT and limit["maxLength"] == api.LIMIT_LENGTH_MAX


def test_cel_literals_refuse_what_would_need_escaping() -> None:
    with pytest.raises(ValueError, match="CEL literal"):
        specrules._literal('say "no"')
