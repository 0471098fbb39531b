"""The custom-task scanner (poller/decisions/taskcode.py) and the snapshot's pure pieces.

Checks: a ``!function`` tag is found in every YAML position (top-level
value, nested mapping, list item, mapping key, flow style, ``class:``), as
are Python tags and keys that are Python files (data and binaryData);
quoted lookalikes and data files that mention ``!function`` are not flagged;
a YAML file that does not parse is a finding; files pulled in by
``include:`` are parsed whatever their name, includes that leave the
ConfigMap are findings; templates that reach Python through lm_eval's
unsandboxed Jinja are flagged and ordinary ones (taken from lm_eval's own
tasks) are not; trust_remote_code and evaluate metrics loaded from paths are
flagged; alias bombs and deep nesting end quickly; sizes are bounded.
Snapshot names are deterministic, distinct per job and source, valid and
within 253 characters; the snapshot manifest is immutable, owned by the job,
and carries the content digest.
"""

from __future__ import annotations

import base64
import re
import time

import pytest

from poller import api
from poller.cycle import tasksnapshot
from poller.decisions.taskcode import (
    MAX_CONFIGMAP_BYTES,
    MAX_FINDINGS,
    MAX_TEMPLATE_CHARS,
    MAX_TEMPLATES,
    MAX_YAML_EVENTS,
    scan_configmap,
)
from poller.decisions.views import JobView
from poller.jobpod import podspec

PLAIN_TASK = """\
task: sample_arith_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: /opt/lmeval/tasks/lmeval-sample-tasks/arith.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{question}}\\nAnswer:"
doc_to_choice: "{{choices}}"
doc_to_target: answer
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def _whats(data: dict[str, str], binary: dict[str, str] | None = None) -> list[str]:
    return [str(f) for f in scan_configmap(data, binary or {})]


def test_a_plain_task_configmap_names_no_code() -> None:
    data = {
        "task.yaml": PLAIN_TASK,
        "arith.jsonl": '{"question": "!function os.system", "choices": ["a"], "answer": 0}\n',
        "README.md": "Use `process_docs: !function utils.f` to ...",
    }
    assert scan_configmap(data, {}) == []


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("task: t\nprocess_docs: !function utils.process_docs\n", 2),
        ("task: t\nmetric_list:\n  - metric: !function utils.m\n    aggregation: mean\n", 3),
        ("task: t\nfilter_list:\n  - name: f\n    filter:\n      - function: !function u.f\n", 5),
        ("task: t\nfewshot_config:\n  doc_to_text: !function u.t\n", 3),
        ("task: t\n? !function u.k\n: 1\n", 2),
        ("task: t\nx: {a: [1, !function u.f]}\n", 2),
        ("task: t\ncustom_dataset: !function os.system\n", 2),
        ("---\ntask: a\n---\ntask: b\ndoc_to_text: !function u.t\n", 5),
        ("task: t\nx: !<!function> u.f\n", 2),
    ],
)
def test_function_tags_are_found_in_every_position(text: str, line: int) -> None:
    findings = scan_configmap({"task.yaml": text}, {})
    expected = [("task.yaml", "YAML tag !function", line)]
    assert [(f.key, f.what, f.line) for f in findings] == expected
    assert findings[0].quote.startswith("!function ")


def test_class_entries_and_python_tags_are_found() -> None:
    found = _whats(
        {
            "task.yaml": "class: !function mytask.MyTask\n",
            "other.yaml": "task: t\nx: !!python/name:os.system\n",
        }
    )
    assert "key other.yaml line 2: YAML tag tag:yaml.org,2002:python/name:os.system" in found[0]
    assert found[1].startswith("key task.yaml line 1: class: a Python task class")
    assert found[2].startswith("key task.yaml line 1: YAML tag !function")


@pytest.mark.parametrize(
    "text",
    [
        "doc_to_text: '!function utils.f'\n",
        'doc_to_text: "!function utils.f"\n',
        "doc_to_text: |\n  !function utils.f\n",
        "description: text with !function inside\n",
        "# process_docs: !function utils.f\ntask: t\n",
        "'!function': 1\n",
    ],
)
def test_quoted_lookalikes_are_not_tags(text: str) -> None:
    assert scan_configmap({"task.yaml": text}, {}) == []


def test_python_files_are_found_in_data_and_binary_data() -> None:
    binary = {
        "helpers.py": base64.b64encode(b"import os\n").decode(),
        "task.yaml": base64.b64encode(b"task: t\nprocess_docs: !function helpers.f\n").decode(),
        "blob.bin": base64.b64encode(b"\x00\x01!function").decode(),
    }
    found = _whats({"utils.py": "def f(d): return d\n"}, binary)
    assert found == [
        "key helpers.py: a Python file (task YAML can run it with !function)",
        "key task.yaml line 2: YAML tag !function: !function helpers.f",
        "key utils.py: a Python file (task YAML can run it with !function)",
    ]


def test_yaml_that_does_not_parse_is_a_finding() -> None:
    findings = scan_configmap({"task.yaml": "task: [unclosed\n", "data.jsonl": "{[\n"}, {})
    assert [(f.key, f.what) for f in findings] == [
        ("task.yaml", "YAML that does not parse (cannot be checked)")
    ]
    bad64 = scan_configmap({}, {"task.yaml": "not base64!"})
    assert [(f.key, f.what) for f in bad64] == [("task.yaml", "binaryData that is not base64")]


def test_includes_are_followed_inside_and_reported_outside() -> None:
    data = {
        "task.yaml": "include: ./base.txt\ntask: t\n",
        "base.txt": "process_docs: !function utils.f\n",
        "notincluded.txt": "process_docs: !function utils.f\n",
        "escape.yaml": "include: [../other-tasks/x.yaml, /outputs/y.yaml]\n",
    }
    found = _whats(data)
    assert found == [
        "key base.txt line 1: YAML tag !function: !function utils.f",
        "key escape.yaml line 1: include of a file outside this ConfigMap: ../other-tasks/x.yaml",
        "key escape.yaml line 1: include of a file outside this ConfigMap: /outputs/y.yaml",
    ]


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
        "{{ (question|map('upper')).gi_frame.f_globals }}",
        "{{ question.mro() }}",
        "{{ '{0.__class__}'.format(question) }}",
        "{{ question['__class__'] }}",
        "{{ question|attr('__class__') }}",
        "{{ question|attr(name) }}",
        "{{ choices|map(attribute='__class__')|list }}",
        "{{ choices|selectattr(field)|list }}",
        "{{ lipsum[key] }}",
        "{{ question[a][b] }}",
        "{{ question[a](1) }}",
        "{% set c = question[a] %}{{ c }}",
        "{% for c in question[a] %}{{ c }}{% endfor %}",
        "{% for c in [question[a]] %}{{ c[b] }}{% endfor %}",
        "{% set l = lipsum %}{{ l[k].os.popen(c).read() }}",
        "{% for x in xs %}{{ loop.cycle[k].os.popen(c).read() }}{% endfor %}",
        "{% for x in xs %}{{ [loop.cycle][0][k].os }}{% endfor %}",
        "{% for x in xs %}{% set l = loop %}{{ l.cycle[k] }}{% endfor %}",
        "{% for x in xs %}{{ loop[k] }}{% endfor %}",
        "{{ xs|map(f, g)|list }}",
        "{{ xs|map('attr', '__globals__')|list }}",
        "{{ namespace(a=1) }}",
        "{{ question }",  # does not parse here: cannot be vouched for
    ],
)
def test_templates_that_reach_python_are_found(template: str) -> None:
    findings = scan_configmap({"task.yaml": f"task: t\ndoc_to_text: {template!r}\n"}, {})
    assert [(f.key, f.line) for f in findings] == [("task.yaml", 2)]
    assert findings[0].what.startswith("a template that reaches Python (")


@pytest.mark.parametrize(
    "template",
    [
        # From lm_eval 0.4.13's own task YAML.
        "{{choices[answer]}}",
        "{{ choices['text'][i] }}",
        "{{choices.text[choices.label.index(answerKey)]}}",
        "{{sentence1[start1:end1]}}",
        "{{[sentence1+', right? No, '+sentence2, sentence1+', right? Yes, '+sentence2]}}",
        "{% for i in range(4) %}{{ 'ABCD'[i] }}. {{ choices['text'][i].strip() }}\n{% endfor %}",
        "{{question.replace('_', answer)}}",
        "{{ input_sentence_1|join(' ')|replace('_', ' ') }}",
        "{{ ['no', 'yes'][label] }}",
        "{% for c in choices %}{{ loop.index }}. {{ c }}{{ loop.cycle(',', '') }}{% endfor %}",
        "{% for c in choices %}{% if loop.changed(c) %}{{ loop.previtem }}{% endif %}{% endfor %}",
        "{{ choices|map('upper')|join(', ') }}",
        "{{ choices|map(attribute='text')|list }}",
        "{% set q = question.strip() %}{{ q }}",
        "{% set _context = context.split('[SEP]')[-1] %}{{ _context | trim }}",
    ],
)
def test_ordinary_templates_pass(template: str) -> None:
    assert scan_configmap({"task.yaml": f"task: t\ndoc_to_text: {template!r}\n"}, {}) == []


def test_remote_code_switches_and_metric_paths_are_found() -> None:
    text = (
        "task: t\n"
        "dataset_kwargs:\n  trust_remote_code: true\n"
        "metric_list:\n"
        "  - metric: /opt/lmeval/tasks/t/m.py\n"
        "  - metric: bleu\n    hf_evaluate: true\n"
        "  - metric: acc\n    hf_evaluate: false\n"
    )
    assert [(f.what, f.line) for f in scan_configmap({"t.yaml": text}, {})] == [
        ("trust_remote_code (a dataset loading script)", 3),
        ("metric loaded by evaluate from a path", 5),
        ("hf_evaluate: a metric script loaded by evaluate", 7),
    ]
    assert scan_configmap({"t.yaml": "dataset_kwargs: {trust_remote_code: false}\n"}, {}) == []


def test_hostile_shapes_end_quickly() -> None:
    # Nine levels of nine aliases each: 9**9 leaves if expanded.
    pairs = zip("abcdefgh", "bcdefghi", strict=True)
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in pairs
    )
    deep = "x: " + "[" * 100_000 + "]" * 100_000 + "\n"
    started = time.monotonic()
    assert scan_configmap({"bomb.yaml": bomb + "z: !function u.f\n"}, {})[0].line == 10
    assert scan_configmap({"deep.yaml": deep}, {})[0].what.startswith("YAML that does not parse")
    assert time.monotonic() - started < 5


def test_sizes_are_bounded() -> None:
    too_big = {"a.jsonl": "x" * MAX_CONFIGMAP_BYTES}
    (finding,) = scan_configmap(too_big, {})
    assert finding.what.startswith("too large to check")
    many_tags = "".join(f"k{i}: !function u.f{i}\n" for i in range(100))
    assert len(scan_configmap({"t.yaml": many_tags}, {})) == MAX_FINDINGS
    limits = f"{MAX_TEMPLATES} templates or {MAX_TEMPLATE_CHARS} characters"
    many = "".join(f"k{i}: '{{{{v{i}}}}}'\n" for i in range(MAX_TEMPLATES + 5))
    long = f"k: '{{{{ a{' ~ a' * (MAX_TEMPLATE_CHARS // 4)} }}}}'\n"
    for text in (many, long):
        found = scan_configmap({"t.yaml": text}, {})
        assert [f.what for f in found] == [f"templates beyond {limits} (not all checked)"]
    nodes = "a:\n" + "".join(f"  - [k{i}, {{a: b}}]\n" for i in range(MAX_YAML_EVENTS // 6))
    found = scan_configmap({"t.yaml": nodes}, {})
    assert [f.what for f in found] == [f"more than {MAX_YAML_EVENTS} YAML events (not all checked)"]


# -- snapshots -------------------------------------------------------------------


def _job(name: str = "eval", uid: str = "uid-1") -> JobView:
    return JobView(
        namespace="team",
        name=name,
        uid=uid,
        generation=1,
        resource_version="7",
        creation_timestamp="2026-01-01T00:00:00Z",
        deleting=False,
        spec={"model": "dummy", "tasks": ["t"], "customTasks": [{"configMap": "my-tasks"}]},
        status=api.LMEvalJobStatus(),
    )


def test_snapshot_names_are_deterministic_distinct_and_valid() -> None:
    name = podspec.task_snapshot_name("eval", "uid-1", "my-tasks")
    assert name == podspec.task_snapshot_name("eval", "uid-1", "my-tasks")
    assert name.startswith("eval-my-tasks-tasks-")
    others = {
        podspec.task_snapshot_name("eval", "uid-2", "my-tasks"),
        podspec.task_snapshot_name("eval", "uid-1", "other"),
        name,
    }
    assert len(others) == 3
    longest = podspec.task_snapshot_name("j" * 253, "u", "c." * 126 + "c")
    assert len(longest) <= 253
    subdomain = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
    for value in (*others, longest, podspec.task_snapshot_name("a" * 230, "u", "b.c-d")):
        assert re.fullmatch(subdomain, value), value


def test_the_pod_mounts_the_snapshot_at_the_source_path() -> None:
    from poller.api.settings import Settings

    job = _job()
    pod = podspec.build_pod(
        name=job.name,
        namespace=job.namespace,
        uid=job.uid,
        spec=api.LMEvalJobSpec.model_validate(job.spec),
        settings=Settings(),
    )
    volumes = [v for v in pod["spec"]["volumes"] if "configMap" in v]
    assert [v["configMap"]["name"] for v in volumes] == [
        podspec.task_snapshot_name("eval", "uid-1", "my-tasks")
    ]
    mounts = pod["spec"]["containers"][0]["volumeMounts"]
    mount = next(m for m in mounts if m["name"] == volumes[0]["name"])
    assert mount == {
        "name": volumes[0]["name"],
        "mountPath": "/opt/lmeval/tasks/my-tasks",
        "readOnly": True,
    }


def test_snapshot_manifest_is_an_immutable_owned_copy() -> None:
    source = {
        "metadata": {"name": "my-tasks", "resourceVersion": "42", "uid": "src"},
        "data": {"task.yaml": PLAIN_TASK},
        "binaryData": {"blob": "AAE="},
    }
    manifest = tasksnapshot.snapshot_manifest(_job(), source)
    meta = manifest["metadata"]
    assert manifest["immutable"] is True
    assert manifest["data"] == source["data"] and manifest["binaryData"] == source["binaryData"]
    assert meta["name"] == podspec.task_snapshot_name("eval", "uid-1", "my-tasks")
    assert meta["labels"][podspec.LABEL_MANAGED_BY] == podspec.MANAGED_BY
    assert meta["annotations"] == {
        tasksnapshot.ANNOTATION_SOURCE: "my-tasks",
        tasksnapshot.ANNOTATION_SOURCE_VERSION: "42",
        tasksnapshot.ANNOTATION_DIGEST: tasksnapshot.content_digest(source),
    }
    (owner,) = meta["ownerReferences"]
    assert (owner["uid"], owner["controller"], owner["kind"]) == ("uid-1", True, api.KIND)
    changed = {**source, "data": {"task.yaml": PLAIN_TASK + "#"}}
    assert tasksnapshot.content_digest(changed) != tasksnapshot.content_digest(source)
    assert tasksnapshot.content_digest(manifest) == tasksnapshot.content_digest(source)


def test_scans_are_remembered_by_uid_and_resource_version() -> None:
    source = {
        "metadata": {"name": "t", "uid": "cm-1", "resourceVersion": "5"},
        "data": {"t.yaml": "x: !function u.f\n"},
    }
    first = tasksnapshot._scan(source)
    assert [f.what for f in first] == ["YAML tag !function"]
    assert tasksnapshot._scan(source) is first
    edited = {**source, "metadata": {**source["metadata"], "resourceVersion": "6"}, "data": {}}
    assert tasksnapshot._scan(edited) == ()
