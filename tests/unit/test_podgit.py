"""Tasks from Git, the pure parts: schema patterns, the init containers, failures, status.

Checks: the schema refuses URLs git could read as something else (ext::,
file://, user information, a leading "-"), refs and paths that climb or hide;
each entry sets exactly one of configMap and git; the clone is one git
command per init container (argv lists, "--" before spec strings, no shell),
under the restricted profile, as a non-root UID unless the pod gives one;
credentials reach git only as a mounted file named in the environment; a
plaintext URL to another host is refused unless a setting allows it; a Git
source needs allowCodeExecution; a failed init container's message names the
field to fix with git's words; status.taskSources keeps only what the spec
names, from an untrusted log.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from driver import protocol
from driver.provenance import read_task_sources
from poller import api
from poller.api.settings import Settings
from poller.jobpod import gittasks, podspec

SHA = "3039f5ab07bd1865078460dbf92219adbcd1c2b3"
URL = "https://git.example.com/org/tasks.git"


def _spec(git: dict[str, Any], **extra: Any) -> api.LMEvalJobSpec:
    return api.LMEvalJobSpec.model_validate(
        {
            "model": "dummy",
            "tasks": ["t"],
            "allowCodeExecution": True,
            "customTasks": [{"configMap": "cm"}, {"git": git}],
            **extra,
        }
    )


SETTINGS = Settings(**{"allow-code-execution": True})


def _pod(spec: api.LMEvalJobSpec, settings: Settings = SETTINGS, **kw: Any) -> dict[str, Any]:
    return podspec.build_pod(name="j", namespace="ns", uid="u", spec=spec, settings=settings, **kw)


@pytest.mark.parametrize(
    "url",
    [
        "ext::sh -c touch% /tmp/pwned",
        "file:///etc",
        "-uhttps://x/y",
        "https://user:token@git.example.com/x.git",
        "https://git.example.com/x.git?ref=main",
        "ssh://git@git.example.com/x.git",
        "https://git.example.com/x y",
        "https://-oProxyCommand=x/y",
    ],
)
def test_schema_refuses_urls(url: str) -> None:
    with pytest.raises(ValidationError):
        _spec({"url": url})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("branch", "-b"),
        ("branch", "a:b"),
        ("branch", "a/../b"),
        ("branch", "main/"),
        ("commit", SHA[:12]),
        ("commit", SHA.upper()),
        ("path", "../x"),
        ("path", "tasks/.git"),
        ("path", "/abs"),
        ("path", "a//b"),
        ("path", "*"),
    ],
)
def test_schema_refuses_refs_and_paths(field: str, value: str) -> None:
    with pytest.raises(ValidationError):
        _spec({"url": URL, field: value})


def test_schema_accepts_usual_sources() -> None:
    for git in (
        {"url": URL},
        {"url": "git://127.0.0.1:9418/tasks.git", "commit": SHA},
        {"url": "http://[::1]:8080/r", "branch": "release/v1.2", "path": "lm_eval/tasks"},
        {"url": URL, "branch": "v0.4.13", "commit": "a" * 64, "credentialsSecret": "git-auth"},
    ):
        assert _spec(git).custom_tasks is not None


def test_each_entry_is_one_source() -> None:
    for entry in ({}, {"configMap": "cm", "git": {"url": URL}}):
        with pytest.raises(ValidationError, match="exactly one of configMap and git"):
            api.LMEvalJobSpec.model_validate({"model": "m", "tasks": ["t"], "customTasks": [entry]})


def _inits(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in pod["spec"]["initContainers"] if gittasks.is_container_name(c["name"])]


def test_pinned_commit_is_one_git_command_per_container() -> None:
    pod = _pod(_spec({"url": URL, "commit": SHA, "path": "tasks"}))
    inits = _inits(pod)
    repo = "/opt/lmeval/tasks/git-1"
    assert [c["command"] for c in inits] == [
        ["git", "init", "--quiet", "--", repo],
        ["git", "-C", repo, "sparse-checkout", "set", "--no-cone", "--", "/tasks/"],
        ["git", "-C", repo, "fetch", "--depth=1", "--no-tags", "--", URL, SHA],
        ["git", "-C", repo, "checkout", "--quiet", "--detach", SHA],
        ["git", "-C", f"{repo}/tasks", "log", "-1", "--format=%H",
         "--output=/opt/lmeval/git/1.commit"],
    ]  # fmt: skip
    for container in inits:
        assert "args" not in container
        context = container["securityContext"]
        assert context["runAsNonRoot"] and not context["allowPrivilegeEscalation"]
        assert context["readOnlyRootFilesystem"] and context["capabilities"] == {"drop": ["ALL"]}
        assert context["runAsUser"] == gittasks.GIT_UID
        assert container["image"] == SETTINGS.git_image
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    main = spec["containers"][0]
    mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
    assert mounts[repo]["readOnly"] and mounts["/opt/lmeval/git"]["readOnly"]
    assert "--include_path=/opt/lmeval/tasks" in main["command"]
    assert f"{protocol.option_flag('task_sources')}=/opt/lmeval/git" in main["command"]
    # The pod's own UID (OpenShift's range) wins: the containers set none.
    for container in _inits(_pod(_spec({"url": URL}), run_as_user=1000680000)):
        assert "runAsUser" not in container["securityContext"]


def test_branch_tag_and_default_head() -> None:
    fetch = {
        "branch": ["fetch", "--depth=1", "--no-tags", "--", URL, "v1"],
        "both": ["fetch", "--no-tags", "--", URL, "main"],
        "none": ["fetch", "--depth=1", "--no-tags", "--", URL, "HEAD"],
    }
    cases = {
        "branch": {"url": URL, "branch": "v1"},
        "both": {"url": URL, "branch": "main", "commit": SHA},
        "none": {"url": URL},
    }
    for case, git in cases.items():
        commands = [c["command"] for c in _inits(_pod(_spec(git)))]
        assert [c[-1] for c in commands][:1] == ["/opt/lmeval/tasks/git-1"]
        assert commands[1][3:] == fetch[case]
        assert commands[2][-1] == (SHA if case == "both" else "FETCH_HEAD")


def test_credentials_are_a_file_for_the_fetch_only() -> None:
    pod = _pod(_spec({"url": URL, "credentialsSecret": "git-auth"}))
    volume = next(v for v in pod["spec"]["volumes"] if "secret" in v)
    assert volume["secret"]["secretName"] == "git-auth"
    assert volume["secret"]["items"] == [{"key": ".git-credentials", "path": ".git-credentials"}]
    for container in _inits(pod):
        names = {m["name"] for m in container["volumeMounts"]}
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["GIT_TERMINAL_PROMPT"] == "0" and env["GIT_CONFIG_NOSYSTEM"] == "1"
        config = _git_config(env)
        if container["name"].endswith("-fetch"):
            assert volume["name"] in names
            assert config["credential.helper"].startswith("store --file=/")
        else:
            assert volume["name"] not in names and "credential.helper" not in config
    assert volume["name"] not in {m["name"] for m in pod["spec"]["containers"][0]["volumeMounts"]}


def _git_config(env: dict[str, str]) -> dict[str, str]:
    """The command-scope configuration an init container's environment gives git."""
    count = int(env["GIT_CONFIG_COUNT"])
    assert not {f"GIT_CONFIG_KEY_{count}", f"GIT_CONFIG_VALUE_{count}"} & set(env)
    return {env[f"GIT_CONFIG_KEY_{n}"]: env[f"GIT_CONFIG_VALUE_{n}"] for n in range(count)}


def test_the_clone_directory_alone_is_a_safe_directory() -> None:
    # The kubelet makes an emptyDir's mount point owned by root; git refuses a
    # repository its user does not own unless it is declared safe.
    for git in ({"url": URL}, {"url": URL, "credentialsSecret": "git-auth"}):
        for container in _inits(_pod(_spec(git))):
            env = {e["name"]: e["value"] for e in container["env"]}
            assert _git_config(env)["safe.directory"] == "/opt/lmeval/tasks/git-1"


def test_plaintext_and_code_rules() -> None:
    with pytest.raises(podspec.JobPodError, match=r"spec.customTasks\[1\].git.url: http://"):
        _pod(_spec({"url": "http://git.internal/x.git"}))
    allowed = Settings(**{"allow-code-execution": True, "git-allow-plaintext": True})
    assert _inits(_pod(_spec({"url": "http://git.internal/x.git"}), allowed))
    with pytest.raises(podspec.JobPodError, match="credentialsSecret: credentials are never"):
        _pod(_spec({"url": "http://git.internal/x", "credentialsSecret": "s"}), allowed)
    with pytest.raises(podspec.JobPodError, match="git:// protocol has no authentication"):
        _pod(_spec({"url": "git://127.0.0.1/x", "credentialsSecret": "s"}))
    with pytest.raises(podspec.JobPodError, match=r"customTasks\[1\].git: task files from Git"):
        _pod(_spec({"url": URL}, allowCodeExecution=False))
    sidecar = {"name": "git-1-fetch", "image": "i"}
    with pytest.raises(podspec.JobPodError, match="reserved"):
        _pod(_spec({"url": URL}, pod={"sidecars": [sidecar]}))


RAW = {"customTasks": [{"configMap": "cm"}, {"git": {"url": URL, "branch": "main"}}]}


@pytest.mark.parametrize(
    ("container", "log", "expected"),
    [
        (
            "git-1-fetch",
            "fatal: couldn't find remote ref main\n",
            f"spec.customTasks[1].git.branch: fetching {URL} at main failed: "
            "fatal: couldn't find remote ref main",
        ),
        (
            "git-1-fetch",
            f"remote: nope\nfatal: Authentication failed for '{URL}/'\n",
            f"spec.customTasks[1].git.url: fetching {URL} at main failed: "
            f"fatal: Authentication failed for '{URL}/'",
        ),
        (
            "git-1-fetch",
            "fatal: unable to access: Could not resolve host: git.example.com\n",
            f"spec.customTasks[1].git.url: fetching {URL} at main failed: "
            "fatal: unable to access: Could not resolve host: git.example.com",
        ),
        (
            "git-7-init",
            "",
            "spec.customTasks[7].git: init container git-7-init failed (exit code 1)",
        ),
    ],
)
def test_clone_failure_names_the_field(container: str, log: str, expected: str) -> None:
    assert gittasks.clone_failure(RAW, container, 1, log) == expected


def test_clone_failure_blames_credentials_path_and_commit() -> None:
    raw = {
        "customTasks": [{"git": {"url": URL, "commit": SHA, "path": "t", "credentialsSecret": "s"}}]
    }
    auth = gittasks.clone_failure(raw, "git-0-fetch", 128, "fatal: Authentication failed for 'x'")
    assert auth is not None and auth.startswith("spec.customTasks[0].git.credentialsSecret: ")
    ref = gittasks.clone_failure(raw, "git-0-fetch", 128, "fatal: remote error: not our ref x")
    assert ref is not None and ref.startswith(
        f"spec.customTasks[0].git.commit: fetching {URL} at {SHA}"
    )
    path = gittasks.clone_failure(raw, "git-0-record", 128, "fatal: cannot change to '/x/t'")
    assert path is not None and path.startswith("spec.customTasks[0].git.path: reading the commit")
    assert gittasks.clone_failure(raw, "install-driver", 1, "x") is None


def test_status_keeps_only_what_the_spec_names() -> None:
    reported = [
        ("1", SHA),
        ("1", "b" * 40),  # a second report of one source: the first wins
        ("0", SHA),  # a ConfigMap source
        ("9", SHA),  # no such entry
        ("x", SHA),
        ("1 ", SHA),
    ]
    assert gittasks.status_entries(RAW, reported) == [
        {"name": "customTasks[1]", "url": URL, "branch": "main", "commit": SHA}
    ]
    assert gittasks.status_entries(RAW, [("1", "not-a-commit")]) == []
    status = api.LMEvalJobStatus.model_validate(
        {"taskSources": gittasks.status_entries(RAW, reported)}
    )
    assert status.task_sources is not None and status.task_sources[0].commit == SHA


def test_driver_reads_commit_files(tmp_path: Any) -> None:
    (tmp_path / "1.commit").write_text(SHA + "\n")
    (tmp_path / "other").write_text("ignored")
    assert read_task_sources(str(tmp_path)) == [{"name": "1", "commit": SHA}]
    (tmp_path / "2.commit").write_text("garbage")
    problem = read_task_sources(str(tmp_path))
    assert isinstance(problem, str) and "no full commit hash" in problem
    assert isinstance(read_task_sources(str(tmp_path / "missing")), str)


def test_payload_reader_keeps_well_typed_sources() -> None:
    body = json.loads(
        json.dumps(
            {
                "exit_code": 0,
                "message": "m",
                "signal": None,
                "task_sources": [{"name": "1", "commit": SHA}],
            }
        )
    )
    fields = protocol.read_fields(body, protocol.FinalFields)
    assert fields.get("task_sources") == [{"name": "1", "commit": SHA}]
    body["task_sources"] = [{"name": 1, "commit": SHA}]
    assert "task_sources" not in protocol.read_fields(body, protocol.FinalFields)
    body["task_sources"] = [{"name": "1"}]
    assert "task_sources" not in protocol.read_fields(body, protocol.FinalFields)


def test_decide_names_the_git_field_and_the_waiting_init_container() -> None:
    import dataclasses

    from poller.decisions import decide
    from poller.decisions.observed import Observed
    from poller.decisions.views import ContainerView
    from tests.unit.test_decide import NOW, job, pod, status_of
    from tests.unit.test_decide import SETTINGS as DECIDE_SETTINGS

    git = {"url": URL, "branch": "nope"}
    spec = {"customTasks": [{"git": git}], "allowCodeExecution": True}
    scheduled = {"state": "Scheduled", "podName": "eval-abc123"}
    failed_clone = ContainerView(
        "terminated", reason="Error", exit_code=128, message="fatal: couldn't find remote ref nope"
    )
    ended = dataclasses.replace(
        pod("waiting", phase="Failed", reason="PodInitializing"), init=("git-0-fetch", failed_clone)
    )
    status = status_of(decide.decide(Observed(job(scheduled, **spec), ended), DECIDE_SETTINGS, NOW))
    assert status.reason == api.JobReason.FAILED
    assert status.message == (
        f"spec.customTasks[0].git.branch: fetching {URL} at nope failed: "
        "fatal: couldn't find remote ref nope"
    )
    pulling = ContainerView("waiting", reason="ImagePullBackOff", message="Back-off pulling git")
    stuck = dataclasses.replace(
        pod("waiting", phase="Pending", created_ago=700, reason="PodInitializing"),
        init=("git-0-init", pulling),
    )
    status = status_of(decide.decide(Observed(job(scheduled, **spec), stuck), DECIDE_SETTINGS, NOW))
    assert "init container git-0-init: ImagePullBackOff: Back-off pulling git" in (
        status.message or ""
    )
