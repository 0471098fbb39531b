"""Pure parts of ``lmeval``, without a cluster.

Checks: the log cursor prints every line of a polled log exactly once when
the server repeats lines (``sinceTime`` has whole-second precision, and kwok
stamps a whole file with one timestamp); score rows and the headline score
skip stderr and metadata keys and keep the job's task order; kubectl-style
ages; ``ns/name`` and ``lmevaljob/name`` references; RBAC messages parsed
from the apiserver's wording, namespaced and cluster-wide; flag parsing for
tolerations and secrets; the regression gate's flags (``--baseline``,
``--gate-task`` and what refines it) into spec.gate, refused without a task
or a baseline, naming the flags; timeouts; the regression gate in ``lmeval
get``'s summary of the spec.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json

import pytest
from lmeval_cli import facts, follow, submit
from lmeval_cli.client import split_ref
from lmeval_cli.errors import ApiError, CliError, ExitCode, explain, suggest

from poller import api


def _stamped(stamp: str, *lines: str) -> str:
    return "".join(f"{stamp} {line}\n" for line in lines)


def test_log_cursor_prints_each_line_once() -> None:
    cursor = follow.LogCursor()
    first = _stamped("2026-01-01T10:00:00.500000000Z", "a", "b")
    assert cursor.new_lines(first) == ["a", "b"]
    assert cursor.since_time() == "2026-01-01T10:00:00Z"
    # The server answers from the whole second on: a and b again, then new lines
    # (one with the very same timestamp as b).
    again = first + _stamped("2026-01-01T10:00:00.500000000Z", "c")
    again += _stamped("2026-01-01T10:00:01.25Z", "d")
    assert cursor.new_lines(again) == ["c", "d"]
    assert cursor.new_lines(again) == []
    earlier = _stamped("2026-01-01T09:59:59Z", "old")
    assert cursor.new_lines(earlier + _stamped("2026-01-01T10:00:02Z", "e")) == ["e"]
    # Offsets are normalised to UTC.
    assert cursor.new_lines(_stamped("2026-01-01T12:00:03+02:00", "f")) == ["f"]


def test_visible_hides_only_markers() -> None:
    assert not follow.visible('::lmeval::{"v":1}', raw=False)
    assert follow.visible('::lmeval::{"v":1}', raw=True)
    assert follow.visible(":: lmeval :: forged by a model", raw=False)


def _job(**status: object) -> dict:
    return {
        "metadata": {"name": "j", "namespace": "ns", "uid": "u"},
        "spec": {
            "model": "hf",
            "tasks": ["b_task", "a_task"],
            "modelArgs": [{"name": "pretrained", "value": "gpt2"}],
        },
        "status": status,
    }


def test_scores_and_headline() -> None:
    results = {
        "results": {
            "a_task": {"alias": "a", "acc,none": 0.5, "acc_stderr,none": 0.1, "sample_len": 8},
            "b_task": {
                "alias": "b",
                "exact_match,strict-match": 1,
                "exact_match_stderr,strict-match": "N/A",
            },
        }
    }
    rows = facts.score_rows(results, ["b_task", "a_task"])
    assert [(r.task, r.metric, r.filter, r.value, r.stderr) for r in rows] == [
        ("b_task", "exact_match", "strict-match", 1, "N/A"),
        ("a_task", "acc", "none", 0.5, 0.1),
    ]
    job = _job(state="Complete", reason="Succeeded", results=json.dumps(results))
    assert facts.headline(job) == "exact_match[strict-match]=1"
    assert facts.progress_text(job) == "100%"
    assert facts.model_text(job) == "hf (gpt2)"
    assert facts.headline(_job()) == "-"
    assert facts.state(_job()) == "New" and facts.progress_text(_job()) == "-"
    sharding = _job(state="Running", shardsDone="3/8", progress={"percent": 37.5})
    assert facts.progress_text(sharding) == "3/8 shards"
    merging = _job(state="Running", shardsDone="8/8", podName="p", progress={"percent": 40})
    assert facts.progress_text(merging) == "40%"
    old_style = {"results": {"t": {"acc": 0.25, "acc_stderr": 0.01, "alias": "t"}}}
    assert [(r.metric, r.stderr) for r in facts.score_rows(old_style)] == [("acc", None)]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (5, "5s"),
        (119, "119s"),
        (130, "2m10s"),
        (600, "10m"),
        (4 * 3600 + 60, "4h1m"),
        (30 * 3600, "30h"),
        (3 * 86400 + 3600, "3d1h"),
        (20 * 86400, "20d"),
    ],
)
def test_age(seconds: int, text: str) -> None:
    now = dt.datetime(2026, 1, 30, tzinfo=dt.UTC)
    stamp = (now - dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert facts.age(stamp, now) == text
    assert facts.age(None, now) == "-"


def test_split_ref() -> None:
    assert split_ref("job", "ns") == ("ns", "job")
    assert split_ref("other/job", "ns") == ("other", "job")
    assert split_ref("lmevaljob/job", "ns") == ("ns", "job")
    assert split_ref(f"lmevaljob.{api.API_GROUP}/job", "ns") == ("ns", "job")


def test_forbidden_messages() -> None:
    namespaced = ApiError(
        403,
        {
            "reason": "Forbidden",
            "message": 'pods "p" is forbidden: User "eve" cannot get '
            'resource "pods/log" in API group "" in the namespace "team"',
        },
        verb="get",
        resource="pods/log",
        namespace="team",
    )
    mapped = explain(namespaced)
    assert mapped.code == ExitCode.FORBIDDEN
    assert mapped.message.startswith(
        'permission denied: user "eve" may not get pods/log in namespace "team"'
    )
    assert "kubectl auth can-i get pods --subresource=log -n team" in mapped.message
    cluster_wide = ApiError(
        403,
        {
            "message": 'lmevaljobs.g is forbidden: User "eve" cannot list resource "lmevaljobs" '
            f'in API group "{api.API_GROUP}" at the cluster scope'
        },
        verb="list",
        resource=api.PLURAL,
        group=api.API_GROUP,
    )
    text = explain(cluster_wide).message
    assert "may not list lmevaljobs." in text and "at the cluster scope" in text
    assert "--all-namespaces" in text and "lmeval-jobs-view" in text


def test_suggestions() -> None:
    assert suggest("llama-mmul", ["llama-mmlu", "llama-arc", "qwen"]) == ["llama-mmlu"]
    assert suggest("run", ["run-1", "run-2"]) == ["run-1", "run-2"]
    assert suggest("x", []) == []


def _flags(**values: object) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    submit.add_arguments(parser)
    parser.add_argument("--namespace")
    args = parser.parse_args(["--model", "dummy", "--task", "t"])
    for key, value in values.items():
        setattr(args, key, value)
    return args


def test_flag_parsing() -> None:
    job = submit.build_from_flags(
        _flags(
            toleration=["gpu=a100:NoSchedule", "spot"], gpus=1, ttl="1h", file_secret=["s:/etc/s"]
        )
    )
    spec = job["spec"]
    assert spec["pod"]["tolerations"] == [
        {"key": "gpu", "operator": "Equal", "value": "a100", "effect": "NoSchedule"},
        {"key": "spot", "operator": "Exists"},
    ]
    assert spec["pod"]["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    assert spec["ttlSecondsAfterFinished"] == 3600
    assert spec["fileSecrets"] == [{"secretRef": {"secretName": "s"}, "mountPath": "/etc/s"}]
    submit.validate(job, from_flags=True)
    with pytest.raises(CliError, match="expected ENV=SECRET:KEY"):
        submit.build_from_flags(_flags(env_secret=["TOKEN=secret"]))
    with pytest.raises(CliError, match=r"spec.modelArgs\[0\].value \(--model-arg\)"):
        submit.validate(submit.build_from_flags(_flags(model_arg=["a=b\nc"])), from_flags=True)
    chat = submit.build_from_flags(
        _flags(
            model_ca="configmap/service-ca:service-ca.crt",
            system_instruction="Be brief.",
            chat_template="",
            fewshot_as_multiturn=True,
        )
    )["spec"]
    assert chat["modelTLS"] == {
        "caBundle": {"configMapKeyRef": {"name": "service-ca", "key": "service-ca.crt"}}
    }
    assert chat["systemInstruction"] == "Be brief."
    assert chat["chatTemplate"] == {"enabled": True}
    assert chat["fewshotAsMultiturn"] is True
    named = submit.build_from_flags(_flags(chat_template="tool_use", model_ca="secret/ca:ca.crt"))
    assert named["spec"]["chatTemplate"] == {"enabled": True, "name": "tool_use"}
    assert named["spec"]["modelTLS"]["caBundle"] == {
        "secretKeyRef": {"name": "ca", "key": "ca.crt"}
    }
    with pytest.raises(CliError, match="expected configmap/NAME:KEY"):
        submit.build_from_flags(_flags(model_ca="ca.crt"))
    with pytest.raises(CliError, match="fewshotAsMultiturn"):
        submit.validate(submit.build_from_flags(_flags(fewshot_as_multiturn=True)), from_flags=True)


def test_gate_flags() -> None:
    parser = argparse.ArgumentParser()
    submit.add_arguments(parser)
    argv = ["--model", "dummy", "--task", "arc_easy", "--baseline", "prod", "--gate-task"]
    argv += ["arc_easy", "--gate-metric", "acc_norm,none", "--max-drop", "0.01", "--alpha", "0.01"]
    job = submit.build_from_flags(parser.parse_args([*argv, "--lower-is-better"]))
    assert job["spec"]["baseline"] == "prod"
    assert job["spec"]["gate"] == {
        "task": "arc_easy",
        "metric": "acc_norm,none",
        "maxDrop": 0.01,
        "alpha": 0.01,
        "higherIsBetter": False,
    }
    submit.validate(job, from_flags=True)
    gate = api.LMEvalJobSpec.model_validate(job["spec"]).gate
    assert gate is not None and gate.max_drop == 0.01 and gate.higher_is_better is False
    # Only the task: the defaults are the API's.
    plain = submit.build_from_flags(_flags(baseline="prod", gate_task="arc_easy"))
    assert plain["spec"]["gate"] == {"task": "arc_easy"}
    with pytest.raises(CliError, match="give --gate-task TASK") as refused:
        submit.build_from_flags(_flags(baseline="prod", max_drop=0.02))
    assert refused.value.code == ExitCode.USAGE
    with pytest.raises(CliError, match=r"spec.gate needs spec.baseline"):
        submit.validate(submit.build_from_flags(_flags(gate_task="t")), from_flags=True)
    with pytest.raises(CliError, match=r"spec.gate.alpha \(--gate-task/--gate-metric"):
        bad = submit.build_from_flags(_flags(baseline="prod", gate_task="t", alpha=1.5))
        submit.validate(bad, from_flags=True)


def test_get_shows_the_commits_of_git_task_sources() -> None:
    from lmeval_cli import render

    sha = "3039f5ab07bd1865078460dbf92219adbcd1c2b3"
    job = {
        "metadata": {"name": "j", "namespace": "ns", "creationTimestamp": "2026-12-01T10:00:00Z"},
        "spec": {"customTasks": [{"git": {"url": "https://g/r.git", "branch": "main"}}]},
        "status": {
            "state": "Complete",
            "reason": "Succeeded",
            "taskSources": [
                {
                    "name": "customTasks[0]",
                    "url": "https://g/r.git",
                    "branch": "main",
                    "commit": sha,
                }
            ],
        },
    }
    pairs = dict(render._status_pairs(job, dt.datetime(2026, 12, 1, 11, tzinfo=dt.UTC)))
    assert pairs["Tasks customTasks[0]"] == f"https://g/r.git (main) at {sha}"
    assert dict(facts.spec_summary(job))["Custom tasks"] == "https://g/r.git"


def test_git_tasks_flag() -> None:
    sha = "3039f5ab07bd1865078460dbf92219adbcd1c2b3"
    job = submit.build_from_flags(
        _flags(
            custom_tasks=["cm"],
            git_tasks=[f"https://g/r.git,commit={sha},path=tasks,credentialsSecret=auth"],
            allow_code_execution=True,
        )
    )
    assert job["spec"]["customTasks"] == [
        {"configMap": "cm"},
        {
            "git": {
                "url": "https://g/r.git",
                "commit": sha,
                "path": "tasks",
                "credentialsSecret": "auth",
            }
        },
    ]
    submit.validate(job, from_flags=True)
    with pytest.raises(CliError, match="after the URL, comma-separated"):
        submit.build_from_flags(_flags(git_tasks=["https://g/r.git,ref=main"]))
    bad = submit.build_from_flags(_flags(git_tasks=["file:///etc"]))
    with pytest.raises(
        CliError, match=r"spec.customTasks\[0\].git.url \(--custom-tasks/--git-tasks\)"
    ):
        submit.validate(bad, from_flags=True)


def test_spec_summary_names_the_baseline_and_the_gate() -> None:
    job = {
        "spec": {
            "model": "hf",
            "baseline": "prod",
            "gate": {"task": "arc_easy", "maxDrop": 0.01},
        }
    }
    summary = dict(facts.spec_summary(job))
    assert summary["Baseline"] == "prod"
    assert (
        summary["Gate"]
        == "arc_easy acc,none: regressed if it drops by more than 0.01 with p < 0.05"
    )
    job["spec"]["gate"] = {"task": "t", "metric": "ppl,none", "higherIsBetter": False}
    assert dict(facts.spec_summary(job))["Gate"].endswith("p < 0.05, lower is better")
    assert "Gate" not in dict(facts.spec_summary({"spec": {"model": "hf"}}))
