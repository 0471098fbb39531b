"""``lmeval submit``, ``list`` and ``get`` on the real control plane.

Checks: a job submitted from flags has exactly the spec the flags describe
(lm_eval options, secrets, resources, deadline, labels); ``--dry-run -o
yaml`` creates nothing and its output, fed back with ``-f``, creates the
same spec; ``--dry-run=server`` is validated by the apiserver and creates
nothing; bad values are refused locally, naming the spec field and the flag
(exit 3), and a duplicate name is refused by the server (exit 3); ``list``
(and ``ls``) shows state, reason, progress, age, model, tasks and the
headline score, across namespaces with ``-A``, filtered by ``-l``, and as
wide, JSON and YAML; ``get`` shows the spec summary, the conditions, the
job's events and its results table. Every check reads stdout, stderr and the
exit code of a real ``python -m lmeval_cli`` process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from poller import api
from poller.cycle.reconciler import Reconciler
from tests.cli.conftest import Cli, finish
from tests.poller_fixtures import CapturedRun, Jobs

pytestmark = pytest.mark.cluster


def _names(jobs: Jobs) -> list[str]:
    listed = jobs.custom.list_namespaced_custom_object(
        api.API_GROUP, api.API_VERSION, jobs.namespace, api.PLURAL
    )["items"]
    return sorted(j["metadata"]["name"] for j in listed)


def _rows(table: str, key: int = 0) -> dict[str, list[str]]:
    """A borderless table as {cell `key`: cells}, the header under 'header'."""
    lines = [line.split() for line in table.splitlines() if line.strip()]
    return {"header": lines[0], **{cells[key]: cells for cells in lines[1:]}}


def _acc(run: CapturedRun) -> float:
    assert run.results is not None
    return float(run.results["results"]["toy_mc"]["acc,none"])


def test_submit_from_flags(cli: Cli, jobs: Jobs) -> None:
    result = cli(
        "submit",
        "--name=flags",
        "--model=hf",
        "--model-arg=pretrained=gpt2,dtype=float32",
        "--model-arg=revision=main",
        "--task=toy_mc",
        "--task=arc_easy,hellaswag",
        "--limit=0.5",
        "--num-fewshot=2",
        "--batch-size=auto:4",
        "--gen-arg=temperature=0",
        "--log-samples",
        "--custom-tasks=my-tasks",
        "--env-secret=HF_TOKEN=hf-credentials:token",
        "--cpu=2",
        "--memory=4Gi",
        "--deadline=1h30m",
        "--label=team=nlp",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"lmevaljob/flags created in namespace {jobs.namespace}\n"
    created = jobs.get("flags")
    assert created["metadata"]["labels"] == {"team": "nlp"}
    assert created["spec"] == {
        "model": "hf",
        "tasks": ["toy_mc", "arc_easy", "hellaswag"],
        "modelArgs": [
            {"name": "pretrained", "value": "gpt2"},
            {"name": "dtype", "value": "float32"},
            {"name": "revision", "value": "main"},
        ],
        "limit": "0.5",
        "numFewShot": 2,
        "batchSize": "auto:4",
        "genArgs": [{"name": "temperature", "value": "0"}],
        "logSamples": True,
        "customTasks": [{"configMap": "my-tasks"}],
        "envSecrets": [
            {"env": "HF_TOKEN", "secretRef": {"name": "hf-credentials", "key": "token"}}
        ],
        "pod": {
            "resources": {
                "requests": {"cpu": "2", "memory": "4Gi"},
                "limits": {"cpu": "2", "memory": "4Gi"},
            }
        },
        "activeDeadlineSeconds": 5400,
    }


def test_dry_run_yaml_round_trips_through_file(cli: Cli, jobs: Jobs, tmp_path: Path) -> None:
    dry = cli(
        "submit",
        "--model=dummy",
        "--model-arg=pretrained=dummy",
        "--task=toy_mc",
        "--limit=3",
        "--dry-run",
        "-o",
        "yaml",
    )
    assert dry.returncode == 0, dry.stderr
    document = yaml.safe_load(dry.stdout)
    assert document["kind"] == "LMEvalJob"
    assert document["apiVersion"] == f"{api.API_GROUP}/{api.API_VERSION}"
    assert document["metadata"] == {"generateName": "dummy-", "namespace": jobs.namespace}
    assert _names(jobs) == []  # nothing was created

    path = tmp_path / "job.yaml"
    path.write_text(dry.stdout)
    created = cli("submit", "-f", str(path), "-o", "name")
    assert created.returncode == 0, created.stderr
    kind, _, name = created.stdout.strip().partition("/")
    assert kind == f"lmevaljob.{api.API_GROUP}" and name.startswith("dummy-")
    assert jobs.get(name)["spec"] == document["spec"]

    # The same file under another name, read from stdin.
    again = cli("submit", "-f", "-", "--name", "from-stdin", input_text=dry.stdout)
    assert again.returncode == 0, again.stderr
    assert jobs.get("from-stdin")["spec"] == document["spec"]


def test_server_dry_run_creates_nothing(cli: Cli, jobs: Jobs) -> None:
    result = cli("submit", "--name=probe", "--model=dummy", "--task=toy_mc", "--dry-run=server")
    assert result.returncode == 0, result.stderr
    assert "lmevaljob/probe created" in result.stdout and "(server dry run)" in result.stdout
    assert _names(jobs) == []


def test_invalid_values_are_refused_naming_field_and_flag(
    cli: Cli, jobs: Jobs, tmp_path: Path
) -> None:
    bad = cli("submit", "--model=dummy", "--task=toy_mc", "--limit=0", "--batch-size=lots")
    assert bad.returncode == 3
    assert "spec.limit (--limit): '0' is not valid" in bad.stderr
    assert "a whole number, or a fraction in (0, 1]" in bad.stderr
    assert "spec.batchSize (--batch-size): 'lots' is not valid" in bad.stderr

    comma = cli("submit", "--model=dummy", "--task=toy_mc", "--model-arg=path", "--dry-run")
    assert comma.returncode == 3
    assert "--model-arg 'path': expected NAME=VALUE" in comma.stderr

    missing = cli("submit", "--task=toy_mc")
    assert missing.returncode == 3 and "--model is required" in missing.stderr

    path = tmp_path / "bad.yaml"
    path.write_text(
        "apiVersion: foundation-model-stack.github.com/v1beta1\nkind: LMEvalJob\n"
        "metadata: {name: bad}\nspec:\n  model: dummy\n  tasks: [toy_mc]\n  numFewShots: 2\n"
    )
    from_file = cli("submit", "-f", str(path))
    assert from_file.returncode == 3
    assert "spec.numFewShots: Extra inputs are not permitted" in from_file.stderr
    assert _names(jobs) == []

    assert cli("submit", "--name=twice", "--model=dummy", "--task=toy_mc").returncode == 0
    duplicate = cli("submit", "--name=twice", "--model=dummy", "--task=toy_mc")
    assert duplicate.returncode == 3
    assert "already exists" in duplicate.stderr and "--generate-name" in duplicate.stderr


def test_list_shows_state_progress_and_score(
    cli: Cli,
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    succeeded_run: CapturedRun,
    tmp_path: Path,
) -> None:
    finish(poller, jobs, admin_api, "done", succeeded_run, tmp_path)
    jobs.create("fresh", modelArgs=[{"name": "pretrained", "value": "tiny-llama"}])
    jobs.custom.patch_namespaced_custom_object(
        api.API_GROUP,
        api.API_VERSION,
        jobs.namespace,
        api.PLURAL,
        "fresh",
        {"metadata": {"labels": {"team": "nlp"}}},
    )

    listed = cli("list")
    assert listed.returncode == 0, listed.stderr
    rows = _rows(listed.stdout)
    assert rows["header"] == [
        "NAME",
        "STATE",
        "REASON",
        "PROGRESS",
        "AGE",
        "MODEL",
        "TASKS",
        "SCORE",
    ]
    done = rows["done"]
    assert done[1:4] == ["Complete", "Succeeded", "100%"]
    assert done[4].endswith("s")
    assert done[5:] == ["dummy", "toy_mc", f"acc={_acc(succeeded_run):.4f}"]
    assert rows["fresh"][1:4] == ["New", "-", "-"]
    assert rows["fresh"][5:] == ["dummy", "(tiny-llama)", "toy_mc", "-"]
    aliased = _rows(cli("ls").stdout)
    assert [r[:4] for r in aliased.values()] == [r[:4] for r in rows.values()]

    everywhere = _rows(cli("list", "-A").stdout, key=1)
    assert everywhere["header"][:2] == ["NAMESPACE", "NAME"]
    assert [jobs.namespace, "done", "Complete"] in [r[:3] for r in everywhere.values()]

    wide = _rows(cli("list", "-o", "wide").stdout)
    assert wide["header"][-2:] == ["POD", "MESSAGE"]
    assert wide["done"][8] == jobs.status("done")["podName"]

    as_json = json.loads(cli("list", "-o", "json").stdout)
    assert as_json["kind"] == "List"
    assert [i["metadata"]["name"] for i in as_json["items"]] == ["done", "fresh"]
    as_yaml = yaml.safe_load(cli("ls", "-o", "yaml").stdout)
    assert as_yaml["items"][0]["status"]["reason"] == "Succeeded"

    selected = _rows(cli("list", "-l", "team=nlp").stdout)
    assert set(selected) == {"header", "fresh"}

    empty = cli("list", "-l", "team=none")
    assert empty.returncode == 0 and empty.stdout == ""
    assert f"No LMEvalJobs found in namespace {jobs.namespace}." in empty.stderr


def test_get_shows_spec_conditions_events_and_results(
    cli: Cli,
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    succeeded_run: CapturedRun,
    tmp_path: Path,
) -> None:
    final = finish(poller, jobs, admin_api, "shown", succeeded_run, tmp_path, limit="4")
    result = cli("get", "shown")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    lines = [" ".join(line.split()) for line in text.splitlines()]
    assert f"Namespace: {jobs.namespace}" in lines
    assert "State: Complete (Succeeded)" in lines
    assert f"Pod: {final['podName']}" in lines
    assert f"Results ConfigMap: {final['resultsConfigMap']}" in lines
    assert "Model: dummy" in lines and "Tasks: toy_mc" in lines and "Limit: 4" in lines
    conditions = text.split("Conditions:")[1].split("Events:")[0]
    condition_rows = {
        line.split()[0]: line.split()[1:3] for line in conditions.splitlines()[2:] if line.strip()
    }
    assert condition_rows["Finished"] == ["True", "Succeeded"]
    assert condition_rows["Succeeded"] == ["True", "Succeeded"]
    assert condition_rows["Running"] == ["False", "Finished"]
    events = text.split("Events:")[1].split("Results:")[0]
    assert {"Scheduled", "Running", "Succeeded"} <= {
        line.split()[2] for line in events.splitlines()[2:] if line.strip()
    }
    results = text.split("Results:")[1]
    assert results.splitlines()[1].split() == ["TASK", "METRIC", "FILTER", "VALUE", "STDERR"]
    assert any(
        line.split()[:4] == ["toy_mc", "acc", "none", f"{_acc(succeeded_run):.4f}"]
        for line in results.splitlines()
        if line.strip()
    )

    as_yaml = yaml.safe_load(cli("get", "lmevaljob/shown", "-o", "yaml").stdout)
    assert as_yaml["metadata"]["name"] == "shown" and as_yaml["status"]["state"] == "Complete"
    by_namespace = cli("get", f"{jobs.namespace}/shown", "-n", "default", "-o", "json")
    assert (
        json.loads(by_namespace.stdout)["metadata"]["uid"] == jobs.get("shown")["metadata"]["uid"]
    )
