"""Tasks from Git, end to end: real git servers on 127.0.0.1, real git, real lm_eval.

The test starts ``git daemon`` (anonymous ``git://``) and ``git http-backend``
behind an HTTP server that demands basic authentication
(`tests.e2e.gitserver`), over one bare repository of task files with two
commits on ``main`` and a tag on the first. Job pods run on the sandbox's
local node, where the init containers' ``git`` is the host's git. Checks:

- a job pinned to the first commit (anonymous, ``path: tasks``) clones it
  through init containers that run git under the restricted profile, without
  a token, with argv lists; lm_eval evaluates the repository's task and the
  job succeeds with ``status.taskSources[0].commit`` equal to that commit,
  even though ``main`` has moved on;
- a job on branch ``main`` over authenticated HTTP, with a credentials
  Secret, evaluates the sample model server (``local-completions``) on the
  repository's task and records the commit ``main`` pointed at, the server saw authenticated
  requests, and the password appears nowhere in the pod's spec;
- a wrong branch and a wrong password end the job Failed before lm_eval runs,
  with git's words and the field to fix; a plaintext URL to another host
  fails before any pod exists, naming the setting that would allow it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from lmeval_sandbox.model_server import ModelServer
from lmeval_sandbox.runner import LocalRunner

from poller.cycle.reconciler import Reconciler
from poller.jobpod import gittasks
from tests.e2e.conftest import sample
from tests.e2e.gitserver import GitDaemon, GitHttp, commit_files, git
from tests.poller_fixtures import BASE_SETTINGS, Jobs, cycle_until, set_settings

pytestmark = [pytest.mark.cluster, pytest.mark.lmeval]

LMEVAL_TIMEOUT = 240.0
USER, PASSWORD = "alice", "s3cret-pa55"

# lm_eval resolves a relative data_files path against the working directory,
# /tmp in the job pod: "../opt/lmeval/tasks/git-<i>/tasks/..." is the file in
# the clone both in a real pod and under the local runner, which maps the
# pod's paths below a directory of its own.
TASK = """\
task: git_arith
dataset_path: json
dataset_kwargs: {{data_files: {{test: ../opt/lmeval/tasks/git-{index}/tasks/data.jsonl}}}}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metadata: {{version: {version}}}
"""
ROWS = "".join(
    json.dumps({"question": f"{a} + {a} =", "choices": [str(2 * a), str(2 * a + 1)], "answer": 0})
    + "\n"
    for a in range(1, 6)
)


class Repo:
    """The served repository: its URLs and commits."""

    def __init__(self, daemon: GitDaemon, http: GitHttp, first: str, head: str) -> None:
        self.daemon, self.http, self.first, self.head = daemon, http, first, head


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Repo]:
    root = tmp_path_factory.mktemp("git")
    work = root / "work"
    git("init", "-q", "-b", "main", str(work))
    files = {"README": "tasks\n", "tasks/data.jsonl": ROWS}
    first = commit_files(work, {**files, "tasks/task.yaml": TASK.format(index=0, version=1)}, "1")
    git("tag", "v1", cwd=work)
    head = commit_files(work, {"tasks/task.yaml": TASK.format(index=0, version=2)}, "2")
    served = root / "served"
    git("clone", "-q", "--bare", str(work), str(served / "tasks.git"))
    with GitDaemon(served) as daemon, GitHttp(served, USER, PASSWORD) as http:
        yield Repo(daemon, http, first, head)


@pytest.fixture
def code_allowed(admin_api: client.ApiClient, poller: Reconciler) -> Reconciler:
    # Task files from Git are not inspected: they need code execution allowed.
    set_settings(admin_api, {**BASE_SETTINGS, "allow-code-execution": "true"})
    return poller


def _create(jobs: Jobs, name: str, git_source: dict[str, Any], port: int | None = None) -> None:
    # lm_eval's dummy model, or with `port` the sample model server over HTTP.
    _, body = sample("dummy-model") if port is None else sample("served-model", port)
    spec = dict(body["spec"])
    spec.update(
        tasks=["git_arith"], customTasks=[{"git": git_source}], allowCodeExecution=True, limit="4"
    )
    jobs.create(name, **spec)


def _credentials(jobs: Jobs, name: str, password: str, port: int) -> None:
    line = f"http://{USER}:{password}@127.0.0.1:{port}\n"
    jobs.core.create_namespaced_secret(
        jobs.namespace,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name=name), string_data={".git-credentials": line}
        ),
    )


def _finished(poller: Reconciler, jobs: Jobs, name: str) -> dict[str, Any]:
    status: dict[str, Any] = cycle_until(
        poller,
        lambda: jobs.status(name).get("state") == "Complete" and jobs.status(name),
        timeout=LMEVAL_TIMEOUT,
        what=f"{name} Complete",
    )
    return status


def test_pinned_commit_from_git_daemon(
    code_allowed: Reconciler, jobs: Jobs, runner: LocalRunner, repo: Repo
) -> None:
    url = repo.daemon.url("tasks.git")
    _create(jobs, "pinned", {"url": url, "commit": repo.first, "path": "tasks"})
    final = _finished(code_allowed, jobs, "pinned")
    assert final["reason"] == "Succeeded", final.get("message")
    assert final["taskSources"] == [{"name": "customTasks[0]", "url": url, "commit": repo.first}], (
        final.get("taskSources")
    )
    results = json.loads(final["results"])
    assert set(results["results"]) == {"git_arith"}
    # The first commit's task file, not main's (version 2).
    assert str(results["versions"]["git_arith"]) in ("1", "1.0"), results["versions"]

    pod = jobs.pod(final["podName"])
    assert pod.spec.automount_service_account_token is False
    inits = [c for c in pod.spec.init_containers if gittasks.is_container_name(c.name)]
    steps = ("init", "sparse", "fetch", "checkout", "record")
    assert [c.name for c in inits] == [f"git-0-{step}" for step in steps]
    for container in inits:
        assert container.command[0] == "git" and container.args is None
        context = container.security_context
        assert context.run_as_non_root and not context.allow_privilege_escalation
        assert context.read_only_root_filesystem and context.capabilities.drop == ["ALL"]
        assert container.image == "docker.io/alpine/git:v2.45.1"
    states = [s.state.terminated for s in pod.status.init_container_statuses]
    assert all(t is not None and t.exit_code == 0 for t in states)
    root = runner.pod_root(jobs.namespace, final["podName"])
    assert root is not None
    assert (root / "opt/lmeval/git/0.commit").read_text().strip() == repo.first


def test_branch_over_authenticated_http(
    code_allowed: Reconciler,
    jobs: Jobs,
    runner: LocalRunner,
    repo: Repo,
    model_server: ModelServer,
) -> None:
    url = repo.http.url("tasks.git")
    _credentials(jobs, "git-auth", PASSWORD, repo.http.port)
    served_before = repo.http.served
    source = {"url": url, "branch": "main", "path": "tasks", "credentialsSecret": "git-auth"}
    asked = model_server.count("POST /v1/completions")
    _create(jobs, "on-main", source, port=model_server.port)
    final = _finished(code_allowed, jobs, "on-main")
    assert final["reason"] == "Succeeded", final.get("message")
    assert final["taskSources"] == [
        {"name": "customTasks[0]", "url": url, "branch": "main", "commit": repo.head}
    ]
    # main's task file (version 2), evaluated against the model server.
    results = json.loads(final["results"])
    assert str(results["versions"]["git_arith"]) in ("2", "2.0"), results["versions"]
    assert repo.http.served > served_before
    assert model_server.count("POST /v1/completions") > asked
    pod = jobs.pod(final["podName"])
    assert PASSWORD not in json.dumps(jobs.core.api_client.sanitize_for_serialization(pod))


def test_wrong_branch_fails_naming_the_field(
    code_allowed: Reconciler, jobs: Jobs, runner: LocalRunner, repo: Repo
) -> None:
    url = repo.daemon.url("tasks.git")
    _create(jobs, "no-branch", {"url": url, "branch": "no-such-branch"})
    final = _finished(code_allowed, jobs, "no-branch")
    assert final["reason"] == "Failed"
    message = final["message"]
    assert message.startswith("spec.customTasks[0].git.branch: fetching "), message
    assert "no-such-branch" in message and "couldn't find remote ref" in message, message
    assert "taskSources" not in final


def test_wrong_credentials_fail_naming_the_field(
    code_allowed: Reconciler, jobs: Jobs, runner: LocalRunner, repo: Repo
) -> None:
    _credentials(jobs, "git-wrong", "not-the-password", repo.http.port)
    refused_before = repo.http.refused
    source = {"url": repo.http.url("tasks.git"), "credentialsSecret": "git-wrong"}
    _create(jobs, "bad-auth", source)
    final = _finished(code_allowed, jobs, "bad-auth")
    assert final["reason"] == "Failed"
    message = final["message"]
    assert message.startswith("spec.customTasks[0].git.credentialsSecret: fetching "), message
    assert "Authentication failed" in message, message
    assert "not-the-password" not in message
    assert repo.http.refused > refused_before


def test_tag_is_resolved_and_recorded(
    code_allowed: Reconciler, jobs: Jobs, runner: LocalRunner, repo: Repo
) -> None:
    url = repo.daemon.url("tasks.git")
    _create(jobs, "on-tag", {"url": url, "branch": "v1", "path": "tasks"})
    final = _finished(code_allowed, jobs, "on-tag")
    assert final["reason"] == "Succeeded", final.get("message")
    assert final["taskSources"][0]["commit"] == repo.first


def test_plaintext_to_another_host_fails_before_any_pod(
    code_allowed: Reconciler, jobs: Jobs
) -> None:
    _create(jobs, "plain-http", {"url": "http://git.example.com/tasks.git"})
    final = _finished(code_allowed, jobs, "plain-http")
    assert final["reason"] == "Failed"
    assert final["message"].startswith(
        "spec.customTasks[0].git.url: http:// is unencrypted and unauthenticated"
    ), final["message"]
    assert "git-allow-plaintext" in final["message"]
    assert jobs.pods() == []
