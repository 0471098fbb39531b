"""What a job may not set because it loads code, or acts on the node (issue 28, items 5 and 7).

Checks, in the pydantic models the poller validates every spec with, in the
pod builder, and in the CEL the CRD carries:

- one variable of every family of ``specrules.ENV_FAMILIES`` (the loader and
  glibc, Python, OpenSSL, Hugging Face's code switches, GPU runtimes' plugin
  and injection paths, the NVIDIA container toolkit, OpenMP tools, Triton and
  torch, desktop and graphics modules, other interpreters and shells, PATH
  and Git) is refused in ``spec.pod.env`` and ``spec.envSecrets``, with a
  message that names its family; neighbours that load nothing
  (``NCCL_DEBUG``, ``CUDA_VISIBLE_DEVICES``, ``OMP_NUM_THREADS``,
  ``SSL_CERT_FILE``...) are admitted;
- a sidecar may still set loader variables for itself, but not ``NVIDIA_*``,
  which the node acts on in any container;
- the CRD's CEL rule, read as the boolean expression it is, refuses exactly
  the names Python refuses (the real apiserver runs it in
  tests/cluster/test_schema_code_loading.py);
- ``trust_remote_code`` in ``spec.modelArgs`` with any value lm_eval could
  read as true needs ``spec.allowCodeExecution``: refused by the schema, by
  ``podargv`` for a spec that skipped the schema, and a job stored under an
  older schema ends Failed with the same words;
- with code allowed, the pod sets ``HF_ALLOW_CODE_EVAL`` (now reserved) for
  the code_eval metric; the evaluation always runs with ``PYTHONSAFEPATH``
  and ``python -P -m lm_eval``.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from lmeval_sandbox import crd
from pydantic import ValidationError

from driver import protocol
from poller import api
from poller.api import rules as specrules
from poller.api.settings import Settings
from poller.decisions import decide
from poller.decisions.actions import CreatePod, PatchStatus
from poller.decisions.observed import Observed
from poller.decisions.views import JobView
from poller.jobpod import argv as podargv
from poller.jobpod import podspec
from poller.timefmt import format_time


def _validate(**fields: Any) -> api.LMEvalJobSpec:
    return api.LMEvalJobSpec.model_validate({"model": "hf", "tasks": ["arc_easy"], **fields})


def _refused(where: str, *words: str, **fields: Any) -> str:
    with pytest.raises(ValidationError) as refused:
        _validate(**fields)
    first = refused.value.errors()[0]
    location = ".".join(str(part) for part in first["loc"])
    assert location.startswith(where), (location, first["msg"])
    for word in words:
        assert word in first["msg"], (word, first["msg"])
    return str(first["msg"])


# (a variable, words of its family's reason)
FAMILIES = [
    ("LD_PRELOAD", "glibc's loader"),
    ("GCONV_PATH", "glibc's loader"),
    ("PYTHONPATH", "Python's own variables"),
    ("OPENSSL_CONF", "OpenSSL loads providers"),
    ("OPENSSL_MODULES", "OpenSSL loads providers"),
    ("OPENSSL_ENGINES", "OpenSSL loads providers"),
    ("HF_DATASETS_TRUST_REMOTE_CODE", "Hugging Face libraries run code"),
    ("HF_MODULES_CACHE", "Hugging Face libraries run code"),
    ("CUDA_INJECTION64_PATH", "GPU runtimes load"),
    ("CUDA_INJECTION32_PATH", "GPU runtimes load"),
    ("NVTX_INJECTION64_PATH", "GPU runtimes load"),
    ("NCCL_NET_PLUGIN", "GPU runtimes load"),
    ("NCCL_TUNER_PLUGIN", "GPU runtimes load"),
    ("NCCL_PROFILER_PLUGIN", "GPU runtimes load"),
    ("NCCL_CONF_FILE", "GPU runtimes load"),
    ("HSA_TOOLS_LIB", "GPU runtimes load"),
    ("VK_ICD_FILENAMES", "GPU runtimes load"),
    ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES=all exposes every GPU of the node"),
    ("NVIDIA_DRIVER_CAPABILITIES", "NVIDIA container toolkit"),
    ("OMP_TOOL_LIBRARIES", "OpenMP runtime loads"),
    ("OMP_TOOL", "OpenMP runtime loads"),
    ("TRITON_LIBCUDA_PATH", "Triton and torch"),
    ("TRITON_PTXAS_PATH", "Triton and torch"),
    ("TORCHINDUCTOR_CACHE_DIR", "Triton and torch"),
    ("GIO_MODULE_DIR", "desktop and graphics libraries"),
    ("GIO_EXTRA_MODULES", "desktop and graphics libraries"),
    ("__EGL_VENDOR_LIBRARY_FILENAMES", "desktop and graphics libraries"),
    ("BASH_ENV", "other interpreters and shells"),
    ("PERL5OPT", "other interpreters and shells"),
    ("NODE_OPTIONS", "other interpreters and shells"),
    ("PATH", "which programs run"),
    ("GIT_CONFIG_PARAMETERS", "which programs run"),
    ("HF_ALLOW_CODE_EVAL", "the poller sets it"),
    ("PYTHONSAFEPATH", "Python's own variables"),
]
ADMITTED = [
    "NCCL_DEBUG",
    "NCCL_SOCKET_IFNAME",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_LAUNCH_BLOCKING",
    "OMP_NUM_THREADS",
    "HF_TOKEN",
    "HF_ENDPOINT",
    "SSL_CERT_FILE",
    "HTTPS_PROXY",
    "TOKENIZERS_PARALLELISM",
    "PYTHONHASHSEED",
    "NVIDIA",
    "OPENSSL",
    "MY_PATH",
    "ENVIRONMENT",
]


@pytest.mark.parametrize(("name", "family"), FAMILIES, ids=[n for n, _ in FAMILIES])
def test_every_family_is_refused_naming_it(name: str, family: str) -> None:
    _refused(
        "pod.env.0.name", f"{name} cannot be set by a job: ", family, pod={"env": [{"name": name}]}
    )
    secret = {"env": name, "secretRef": {"name": "s", "key": "k"}}
    _refused("envSecrets.0.env", f"{name} cannot be set by a job: ", family, envSecrets=[secret])


@pytest.mark.parametrize("name", ADMITTED)
def test_neighbours_that_load_nothing_are_admitted(name: str) -> None:
    secret = {"env": name, "secretRef": {"name": "s", "key": "k"}}
    assert _validate(pod={"env": [{"name": name, "value": "1"}]}, envSecrets=[secret])


def _sidecar(*env: str) -> dict[str, Any]:
    variables = [{"name": name, "value": "x"} for name in env]
    return {"pod": {"sidecars": [{"name": "s", "image": "registry.example/s:1", "env": variables}]}}


def test_a_sidecar_may_not_set_what_the_node_acts_on() -> None:
    assert _validate(**_sidecar("LD_PRELOAD", "OPENSSL_CONF", "PATH")).pod
    _refused(
        "pod.sidecars.0.env.0.name",
        "NVIDIA_VISIBLE_DEVICES cannot be set by a job: the NVIDIA container toolkit",
        **_sidecar("NVIDIA_VISIBLE_DEVICES"),
    )


def test_the_pod_builder_checks_again_what_skipped_the_schema() -> None:
    """A spec that never met the schema (constructed) still makes no pod."""
    settings = Settings()
    stale_env = api.LMEvalJobSpec.model_construct(
        model="hf",
        tasks=["arc_easy"],
        pod=api.PodOverride.model_construct(
            env=[api.EvaluationEnvVar.model_construct(name="OPENSSL_CONF", value="/x/o.cnf")]
        ),
    )
    with pytest.raises(podspec.JobPodError, match=r"spec\.pod\.env: OPENSSL_CONF cannot be set"):
        podspec.build_pod(name="e", namespace="n", uid="u", spec=stale_env, settings=settings)
    sidecar = api.Sidecar.model_construct(
        name="s",
        image="registry.example/s:1",
        env=[api.EnvVar.model_construct(name="NVIDIA_VISIBLE_DEVICES", value="all")],
    )
    stale_sidecar = api.LMEvalJobSpec.model_construct(
        model="hf", tasks=["arc_easy"], pod=api.PodOverride.model_construct(sidecars=[sidecar])
    )
    with pytest.raises(podspec.JobPodError, match=r"spec\.pod\.sidecars: NVIDIA_VISIBLE_DEVICES"):
        podspec.build_pod(name="e", namespace="n", uid="u", spec=stale_sidecar, settings=settings)


# -- the CEL the CRD carries agrees with Python ----------------------------------------


def _python_of(cel: str) -> str:
    """The env-name rule's CEL as Python: it uses `in` over string lists,
    startsWith, ||, ! and parentheses only (asserted)."""
    text = cel.replace("self.startsWith(", "name.startswith(").replace("self in ", "name in ")
    text = text.replace("||", " or ").replace("!(", " not (")
    leftover = re.sub(r'"[^"]*"', "", text)
    assert not re.search(r"self|&&|\?|!", leftover), leftover
    return text


def _crd_rules(field: str) -> list[dict[str, str]]:
    (version,) = crd.crd_manifest()["spec"]["versions"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    if field == "env":
        schema = spec["properties"]["pod"]["properties"]["env"]["items"]["properties"]["name"]
    elif field == "envSecrets":
        schema = spec["properties"]["envSecrets"]["items"]["properties"]["env"]
    else:
        sidecar = spec["properties"]["pod"]["properties"]["sidecars"]["items"]
        schema = sidecar["properties"]["env"]["items"]["properties"]["name"]
    rules: list[dict[str, str]] = schema["x-kubernetes-validations"]
    return rules


def _every_name() -> list[str]:
    names = {n for family in specrules.ENV_FAMILIES for n in family.names}
    for family in specrules.ENV_FAMILIES:
        names |= {p + "X" for p in family.prefixes} | {p.rstrip("_") for p in family.prefixes}
    return sorted(names | set(specrules.ALLOWED_PYTHON_ENV) | set(ADMITTED) | {"PYTHON"})


@pytest.mark.parametrize("field", ["env", "envSecrets"])
def test_the_crds_rule_refuses_exactly_what_python_refuses(field: str) -> None:
    (rule,) = (r for r in _crd_rules(field) if "cannot be set by a job" in r["message"])
    check = _python_of(rule["rule"])
    for name in _every_name():
        admitted = eval(check, {}, {"name": name})  # the CRD's own rule text, checked above
        assert admitted == (specrules.env_name_problem(name) is None), name
    # The message names the family, as Python's does.
    for family in specrules.ENV_FAMILIES:
        assert family.reason in rule["messageExpression"]


def test_the_crds_sidecar_rule_refuses_exactly_the_node_family() -> None:
    (rule,) = (r for r in _crd_rules("sidecars") if "cannot be set by a job" in r["message"])
    check = _python_of(rule["rule"])
    for name in _every_name():
        admitted = eval(check, {}, {"name": name})  # the CRD's own rule text, checked above
        assert admitted == (specrules.node_env_name_problem(name) is None), name


# -- trust_remote_code ------------------------------------------------------------------

ON = ["True", "true", "TRUE", " true ", "1", "yes", "on", "false!", "'false'", "", "none", "0.0"]
OFF = ["false", "False", " FALSE ", "0", " 0"]


def _remote(value: str, **fields: Any) -> dict[str, Any]:
    pairs = [
        {"name": "pretrained", "value": "org/model"},
        {"name": "trust_remote_code", "value": value},
    ]
    return {"modelArgs": pairs, **fields}


@pytest.mark.parametrize("value", ON)
def test_remote_code_needs_allow_code_execution(value: str) -> None:
    message = _refused(
        "",
        "spec.modelArgs[1]: trust_remote_code other than false or 0",
        "spec.allowCodeExecution: true",
        **_remote(value),
    )
    assert f"it is trust_remote_code={value}" in message
    _refused("", "spec.modelArgs[1]", **_remote(value, allowCodeExecution=False))
    assert _validate(**_remote(value, allowCodeExecution=True)).model_args


@pytest.mark.parametrize("value", OFF)
def test_remote_code_off_is_admitted(value: str) -> None:
    assert _validate(**_remote(value)).model_args


def test_remote_code_is_checked_where_the_argv_is_built() -> None:
    spec = api.LMEvalJobSpec.model_construct(
        model="hf",
        tasks=["arc_easy"],
        model_args=[api.NameValue.model_construct(name="trust_remote_code", value="True")],
    )
    with pytest.raises(podargv.JobPodError, match=r"spec.modelArgs\[0\]: trust_remote_code"):
        podargv.lm_eval_argv(spec, Settings())
    allowed = _validate(**_remote("True", allowCodeExecution=True))
    with pytest.raises(podargv.JobPodError, match="allow-code-execution: false"):
        podargv.lm_eval_argv(allowed, Settings())
    settings = Settings(**{"allow-code-execution": "true"})
    argv = podargv.lm_eval_argv(allowed, settings)
    assert "--model_args=pretrained=org/model,trust_remote_code=True" in argv
    pod = podspec.build_pod(name="e", namespace="n", uid="u", spec=allowed, settings=settings)
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env[specrules.CODE_EVAL_ENV] == "1"


def test_the_evaluation_never_imports_from_its_working_directory() -> None:
    pod = podspec.build_pod(name="e", namespace="n", uid="u", spec=_validate(), settings=Settings())
    main = pod["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert env[protocol.ENV_SAFE_PATH] == "1"
    assert specrules.CODE_EVAL_ENV not in env
    child = main["command"][main["command"].index("--") + 1 :]
    assert child[:4] == ["python", "-P", "-m", "lm_eval"]


def test_a_job_stored_under_an_older_schema_ends_failed_with_the_same_words() -> None:
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
            "spec": {"model": "hf", "tasks": ["toy"], **_remote("True")},
            "status": {},
        }
    )
    decision = decide.decide(Observed(stored, None), Settings(), now)
    assert not any(isinstance(a, CreatePod) for a in decision.actions)
    (patch,) = (a for a in decision.actions if isinstance(a, PatchStatus))
    assert patch.status.reason == api.JobReason.FAILED
    words = "spec.modelArgs[1]: trust_remote_code other than false or 0"
    assert words in (patch.status.message or ""), patch.status.message


def test_the_remote_code_rule_is_in_the_crd() -> None:
    (version,) = crd.crd_manifest()["spec"]["versions"]
    rules = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["x-kubernetes-validations"]
    (rule,) = (r for r in rules if "trust_remote_code" in r["rule"])
    assert rule == specrules.remote_code_rule()
    assert rule["fieldPath"] == ".modelArgs"
