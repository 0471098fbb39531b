"""``lmeval submit``: an LMEvalJob from flags or a file, checked before it is sent.

Why this module exists: writing YAML to run one evaluation is the friction
the command line removes. Flags map one to one onto lm_eval's own options
(``--model-arg`` is ``--model_args``, ``--task`` is ``--tasks``, ...), and
the spec is validated locally with the very pydantic model the poller uses
(``poller.api.LMEvalJobSpec``), so a mistake is reported before any request,
naming both the spec field and the flag it came from. ``--dry-run`` prints
the LMEvalJob instead of creating it (``-o yaml`` round-trips through
``submit -f``); ``--dry-run=server`` asks the apiserver to validate it too.
"""

from __future__ import annotations

import argparse
import re
import sys
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from lmeval_cli import output, specflags, waitfor
from lmeval_cli.errors import CliError, ExitCode
from poller.cliapi import api

__all__ = ["FLAG_FOR_FIELD", "add_arguments", "build_from_flags", "load_files", "validate"]

# Which flag sets which spec field, to name it in errors.
FLAG_FOR_FIELD = {
    "model": "--model",
    "modelArgs": "--model-arg",
    "tasks": "--task",
    "limit": "--limit",
    "numFewShot": "--num-fewshot",
    "batchSize": "--batch-size",
    "genArgs": "--gen-arg",
    "logSamples": "--log-samples",
    "envSecrets": "--env-secret",
    "fileSecrets": "--file-secret",
    "customTasks": "--custom-tasks/--git-tasks",
    "pod": "--cpu/--memory/--gpus/--env/--node-selector/--toleration",
    "outputs": "--output-pvc",
    "activeDeadlineSeconds": "--deadline",
    "ttlSecondsAfterFinished": "--ttl",
    "allowOnline": "--allow-online",
    "allowCodeExecution": "--allow-code-execution",
    "suspend": "--suspend",
    "modelTLS": "--model-ca",
    "systemInstruction": "--system-instruction",
    "chatTemplate": "--chat-template",
    "fewshotAsMultiturn": "--fewshot-as-multiturn",
    "baseline": "--baseline",
    "gate": "--gate-task/--gate-metric/--max-drop/--alpha/--lower-is-better",
}
_DNS_SUBDOMAIN = re.compile(api.DNS_SUBDOMAIN)
GPU_RESOURCE = "nvidia.com/gpu"
# Descriptions end with the lm_eval flag, e.g. "(--limit).": not what a CLI user typed.
_LM_EVAL_FLAG_RE = re.compile(r"\s*\(--[a-z_]+\)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The submit flags (global flags such as -n come from the caller), by group."""
    _what_arguments(parser.add_argument_group("what to evaluate (lm_eval options)"))
    _how_arguments(parser.add_argument_group("how to run it"))
    _gate_arguments(parser.add_argument_group("compared with a baseline (a regression gate)"))
    _object_arguments(parser.add_argument_group("the LMEvalJob object"))
    _after_arguments(parser.add_argument_group("what to do"))


def _what_arguments(what: argparse._ArgumentGroup) -> None:
    what.add_argument("--model", help="lm_eval model type, e.g. hf, local-completions, dummy")
    what.add_argument(
        "--model-arg",
        action="append",
        default=[],
        metavar="K=V",
        help="a --model_args pair; repeat it or give a comma list",
    )
    what.add_argument(
        "--task", action="append", default=[], metavar="TASK", help="task or group; repeatable"
    )
    what.add_argument("--limit", help="examples per task: a number, or a fraction in (0, 1]")
    what.add_argument("--num-fewshot", type=int, metavar="N", help="few-shot examples per task")
    what.add_argument("--batch-size", metavar="N|auto", help='a number, "auto" or "auto:N"')
    what.add_argument(
        "--gen-arg", action="append", default=[], metavar="K=V", help="a --gen_kwargs pair"
    )
    what.add_argument("--log-samples", action="store_true", help="keep per-sample outputs")
    what.add_argument(
        "--custom-tasks",
        action="append",
        default=[],
        metavar="CONFIGMAP",
        help="ConfigMap with task YAML and data (offline clusters); repeatable",
    )
    what.add_argument("--system-instruction", metavar="TEXT", help="system instruction")
    what.add_argument(
        "--chat-template",
        nargs="?",
        const="",
        metavar="NAME",
        help="apply the model's chat template (optionally a named one); chat models need it",
    )
    what.add_argument(
        "--fewshot-as-multiturn",
        action="store_true",
        help="few-shot examples as conversation turns (with --chat-template)",
    )
    what.add_argument(
        "--git-tasks",
        action="append",
        default=[],
        metavar="URL[,branch=B][,commit=SHA][,path=P][,credentialsSecret=S]",
        help="task files from a Git repository at a pinned commit (needs "
        "--allow-code-execution); repeatable",
    )


def _how_arguments(how: argparse._ArgumentGroup) -> None:
    how.add_argument(
        "--env-secret",
        action="append",
        default=[],
        metavar="ENV=SECRET:KEY",
        help="an environment variable from a Secret key, e.g. OPENAI_API_KEY=openai:key",
    )
    how.add_argument(
        "--file-secret",
        action="append",
        default=[],
        metavar="SECRET:/PATH",
        help="mount a Secret read-only at an absolute path",
    )
    how.add_argument("--cpu", help='CPU request and limit, e.g. "2"')
    how.add_argument("--memory", help="memory request and limit, e.g. 8Gi")
    how.add_argument("--gpus", type=int, metavar="N", help=f"{GPU_RESOURCE} limit")
    how.add_argument("--env", action="append", default=[], metavar="K=V", help="pod env var")
    how.add_argument(
        "--node-selector", action="append", default=[], metavar="K=V", help="node label to match"
    )
    how.add_argument(
        "--toleration",
        action="append",
        default=[],
        metavar="KEY[=VALUE][:EFFECT]",
        help="tolerate a node taint (kubectl taint syntax)",
    )
    how.add_argument("--output-pvc", metavar="PVC", help="PVC that receives the full outputs")
    how.add_argument(
        "--model-ca",
        metavar="configmap|secret/NAME:KEY",
        help="CAs to trust for an https:// model endpoint, e.g. configmap/service-ca:ca.crt",
    )
    how.add_argument("--deadline", metavar="DURATION", help="activeDeadlineSeconds, e.g. 2h")
    how.add_argument("--ttl", metavar="DURATION", help="delete the job this long after it ends")
    how.add_argument("--allow-online", action="store_true", help="let it reach model hubs")
    how.add_argument(
        "--allow-code-execution", action="store_true", help="allow tasks that run model code"
    )
    how.add_argument("--suspend", action="store_true", help="create it suspended")


def _gate_arguments(gate: argparse._ArgumentGroup) -> None:
    gate.add_argument("--baseline", metavar="JOB", help="the LMEvalJob to compare with")
    gate.add_argument("--gate-task", metavar="TASK", help="the task whose score may not drop")
    gate.add_argument("--gate-metric", metavar="METRIC,FILTER", help="default acc,none")
    gate.add_argument("--max-drop", type=float, metavar="X", help="largest drop accepted (0)")
    gate.add_argument("--alpha", type=float, metavar="P", help="significance level (0.05)")
    gate.add_argument(
        "--lower-is-better", action="store_true", help="the metric improves downwards"
    )


def _object_arguments(meta: argparse._ArgumentGroup) -> None:
    names = meta.add_mutually_exclusive_group()
    names.add_argument("--name", help="the job's name")
    names.add_argument(
        "--generate-name", metavar="PREFIX", help="a name prefix (default: the model type)"
    )
    meta.add_argument(
        "--label", action="append", default=[], metavar="K=V", help="a label on the LMEvalJob"
    )
    meta.add_argument(
        "-f",
        "--filename",
        metavar="FILE",
        help="an LMEvalJob YAML (or JSON) file, - for stdin, instead of the flags above",
    )


def _after_arguments(after: argparse._ArgumentGroup) -> None:
    after.add_argument(
        "--dry-run",
        nargs="?",
        const="client",
        choices=["client", "server"],
        help="print the LMEvalJob instead of creating it (server: validated by the apiserver)",
    )
    output.add_output(
        after,
        output.OBJECT_FORMATS,
        "print the job in this format (with --dry-run: yaml unless -o json)",
    )
    after.add_argument("--wait", action="store_true", help="follow the job to its end (as wait)")
    waitfor.add_wait_flags(after, timeout_default=None, prefix="with --wait: ")


def _pod(args: argparse.Namespace) -> dict[str, Any]:
    pod: dict[str, Any] = {}
    resources: dict[str, dict[str, str]] = {}
    for key, value in (("cpu", args.cpu), ("memory", args.memory)):
        if value:
            resources.setdefault("requests", {})[key] = value
            resources.setdefault("limits", {})[key] = value
    if args.gpus:
        resources.setdefault("limits", {})[GPU_RESOURCE] = str(args.gpus)
    if resources:
        pod["resources"] = resources
    if args.env:
        pod["env"] = specflags.pairs(args.env, "--env")
    if args.node_selector:
        pod["nodeSelector"] = specflags.mapping(args.node_selector, "--node-selector")
    if args.toleration:
        pod["tolerations"] = [specflags.toleration(t) for t in args.toleration]
    return pod


def _slug(text: str) -> str:
    slug = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:40].rstrip("-")
    return slug or "lmeval"


def build_from_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The LMEvalJob that the flags describe (not yet validated)."""
    if not args.model:
        raise CliError("--model is required (or give a job file with -f)", ExitCode.USAGE)
    tasks = [t.strip() for value in args.task for t in value.split(",") if t.strip()]
    if not tasks:
        raise CliError("at least one --task is required", ExitCode.USAGE)
    spec: dict[str, Any] = {"model": args.model, "tasks": tasks}
    optional: dict[str, Any] = {
        "modelArgs": specflags.pairs(args.model_arg, "--model-arg"),
        "limit": args.limit,
        "numFewShot": args.num_fewshot,
        "batchSize": args.batch_size,
        "genArgs": specflags.pairs(args.gen_arg, "--gen-arg"),
        "logSamples": True if args.log_samples else None,
        "customTasks": [{"configMap": c} for c in args.custom_tasks]
        + specflags.git_tasks(args.git_tasks),
        "envSecrets": specflags.env_secrets(args.env_secret),
        "fileSecrets": specflags.file_secrets(args.file_secret),
        "pod": _pod(args),
        "outputs": {"pvcName": args.output_pvc} if args.output_pvc else None,
        "activeDeadlineSeconds": specflags.seconds(args.deadline, "--deadline")
        if args.deadline
        else None,
        "ttlSecondsAfterFinished": specflags.seconds(args.ttl, "--ttl") if args.ttl else None,
        "allowOnline": True if args.allow_online else None,
        "allowCodeExecution": True if args.allow_code_execution else None,
        "suspend": True if args.suspend else None,
        "modelTLS": specflags.model_ca(args.model_ca) if args.model_ca else None,
        "systemInstruction": args.system_instruction,
        "chatTemplate": specflags.chat_template(args.chat_template),
        "fewshotAsMultiturn": True if args.fewshot_as_multiturn else None,
        "baseline": args.baseline,
        "gate": specflags.gate(
            args.gate_task, args.gate_metric, args.max_drop, args.alpha, args.lower_is_better
        ),
    }
    spec.update({k: v for k, v in optional.items() if v not in (None, [], {})})
    metadata: dict[str, Any] = {}
    if args.name:
        metadata["name"] = args.name
    else:
        metadata["generateName"] = args.generate_name or f"{_slug(args.model)}-"
    if args.label:
        metadata["labels"] = specflags.mapping(args.label, "--label")
    return {
        "apiVersion": f"{api.API_GROUP}/{api.API_VERSION}",
        "kind": api.KIND,
        "metadata": metadata,
        "spec": spec,
    }


def load_files(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The LMEvalJobs in -f FILE (several YAML documents allowed)."""
    spec_flags = [f for f in ("model", "limit", "batch_size", "num_fewshot") if getattr(args, f)]
    if spec_flags or args.task or args.model_arg:
        raise CliError("give the job either as flags or as a file (-f), not both", ExitCode.USAGE)
    source = args.filename
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text()
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except OSError as error:
        raise CliError(f"cannot read {source}: {error.strerror}", ExitCode.USAGE) from error
    except yaml.YAMLError as error:
        raise CliError(f"{source} is not valid YAML: {error}", ExitCode.USAGE) from error
    if not documents:
        raise CliError(f"{source} holds no LMEvalJob", ExitCode.USAGE)
    jobs = []
    for number, doc in enumerate(documents, start=1):
        where = source if len(documents) == 1 else f"{source} (document {number})"
        if not isinstance(doc, dict) or doc.get("kind") != api.KIND:
            raise CliError(f"{where}: not an LMEvalJob (kind: {api.KIND})", ExitCode.USAGE)
        doc = {"apiVersion": f"{api.API_GROUP}/{api.API_VERSION}", **doc}  # first, as kubectl
        metadata = doc.setdefault("metadata", {})
        if args.namespace and metadata.get("namespace") not in (None, args.namespace):
            raise CliError(
                f"{where}: its namespace {metadata['namespace']} does not match "
                f"--namespace {args.namespace}",
                ExitCode.USAGE,
            )
        if args.name:
            metadata.pop("generateName", None)
            metadata["name"] = args.name
        elif args.generate_name:
            metadata.pop("name", None)
            metadata["generateName"] = args.generate_name
        elif not metadata.get("name") and not metadata.get("generateName"):
            model = str((doc.get("spec") or {}).get("model") or "lmeval")
            metadata["generateName"] = f"{_slug(model)}-"
        jobs.append(doc)
    return jobs


def _field_path(loc: tuple[int | str, ...]) -> str:
    path = "spec"
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _field_info(loc: tuple[int | str, ...]) -> FieldInfo | None:
    """The pydantic field at `loc` (camelCase names, list indexes skipped), if any."""
    model: type[BaseModel] | None = api.LMEvalJobSpec
    info: FieldInfo | None = None
    for part in loc:
        if isinstance(part, int):
            continue
        if model is None:
            return None
        info = model.model_fields.get(_snake(part))
        if info is None:
            return None
        model = _nested_model(info.annotation)
    return info


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _nested_model(arg)
        if found is not None:
            return found
    return None


def _problem(item: Any, from_flags: bool) -> str:
    loc = tuple(item["loc"])
    field = str(loc[0]) if loc else ""
    text = _field_path(loc)
    if from_flags and field in FLAG_FOR_FIELD:
        text += f" ({FLAG_FOR_FIELD[field]})"
    info = _field_info(loc)
    description = _LM_EVAL_FLAG_RE.sub("", info.description or "") if info else ""
    kind = item.get("type")
    if kind == "string_pattern_mismatch" and description:
        return f"{text}: {item.get('input')!r} is not valid: {description.rstrip('.')}"
    text += f": {item['msg']}"
    if kind not in {"missing", "extra_forbidden"}:
        text += f", got {item.get('input')!r}"
    if description and kind != "extra_forbidden":
        text += f" ({description.rstrip('.')})"
    return text


def validate(job: dict[str, Any], *, from_flags: bool, where: str = "") -> None:
    """Check the job like the poller will; CliError naming the field (and flag) if not."""
    prefix = f"{where}: " if where else ""
    metadata = job.get("metadata") or {}
    name = metadata.get("name") or ""
    if name and (len(name) > 253 or not _DNS_SUBDOMAIN.match(name)):
        raise CliError(
            f"{prefix}invalid name {name!r}: use lower-case letters, digits, '-' and '.', "
            "starting and ending with a letter or digit",
            ExitCode.USAGE,
        )
    try:
        api.LMEvalJobSpec.model_validate(job.get("spec") or {})
    except ValidationError as error:
        problems = [_problem(item, from_flags) for item in error.errors()]
        raise CliError(
            f"{prefix}invalid LMEvalJob: " + "; ".join(problems), ExitCode.USAGE
        ) from error


def _snake(camel: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", camel).lower()
