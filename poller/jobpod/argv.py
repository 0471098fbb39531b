"""lm_eval's command line for a job, and the resources it runs with: pure.

Why this module exists: the argv is where a spec becomes a process, so it is
built here, token by token, from validated fields only: every option a single
``--flag=value`` token, so that no value, whatever it contains, can be read
by lm_eval's parser as another option. The checks that refuse a job before
any pod exists live beside it (code execution and online access that the
settings forbid, TLS problems, Git tasks and ``trust_remote_code`` without
allowCodeExecution), as does the size preset that picks the device.
`poller.jobpod.podspec` builds the pod around this argv.
"""

from __future__ import annotations

from poller import api
from poller.api import rules
from poller.api.settings import Settings
from poller.jobpod import gittasks, modeltls, trust

__all__ = ["CUSTOM_TASKS_ROOT", "JobPodError", "lm_eval_argv", "resources_for"]

# Where custom tasks are mounted in the pod; lm_eval's --include_path.
CUSTOM_TASKS_ROOT = "/opt/lmeval/tasks"


class JobPodError(ValueError):
    """The job cannot become a pod; the message says what to fix."""


def _pairs(items: list[api.NameValue] | None) -> str:
    return ",".join(f"{item.name}={item.value}" for item in items or [])


def lm_eval_argv(spec: api.LMEvalJobSpec, settings: Settings) -> list[str]:
    """lm_eval's arguments for `spec` (after ``python -m lm_eval``)."""
    if spec.allow_code_execution and not settings.allow_code_execution:
        raise JobPodError(
            "spec.allowCodeExecution is true but the poller settings do not allow code "
            "execution (allow-code-execution: false in ConfigMap lmeval-poller-config)"
        )
    if spec.allow_online and not settings.allow_online:
        raise JobPodError(
            "spec.allowOnline is true but the poller settings do not allow online jobs "
            "(allow-online: false in ConfigMap lmeval-poller-config)"
        )
    if problem := modeltls.tls_problem(spec, settings):
        raise JobPodError(problem)
    if problem := trust.insecure_storage_problem(spec, settings):
        raise JobPodError(problem)
    # The schema refuses it too; checked here because the argv is where it would
    # take effect (a job stored under an older schema ends Failed, same words).
    pairs = [(pair.name, pair.value) for pair in spec.model_args or []]
    if problem := rules.remote_code_problem(pairs, spec.allow_code_execution):
        raise JobPodError(problem)
    argv = [f"--model={spec.model}", f"--tasks={','.join(spec.tasks)}"]
    if spec.model_args:
        argv.append(f"--model_args={_pairs(spec.model_args)}")
    if spec.num_few_shot is not None:
        argv.append(f"--num_fewshot={spec.num_few_shot}")
    if spec.limit is not None:
        argv.append(f"--limit={spec.limit}")
    if spec.gen_args:
        argv.append(f"--gen_kwargs={_pairs(spec.gen_args)}")
    if spec.batch_size is not None:
        argv.append(f"--batch_size={spec.batch_size}")
    # The regression gate pairs per-item scores, which lm_eval writes only with samples.
    if spec.log_samples or spec.gate is not None:
        argv.append("--log_samples")
    if spec.allow_code_execution:
        argv.append("--confirm_run_unsafe_code")
    if gittasks.git_sources(spec) and not spec.allow_code_execution:
        index = gittasks.git_sources(spec)[0][0]
        raise JobPodError(
            f"spec.customTasks[{index}].git: task files from Git are not inspected by the "
            "poller, and lm_eval runs the Python they name: set spec.allowCodeExecution (and "
            "allow-code-execution: true in ConfigMap lmeval-poller-config)"
        )
    if spec.custom_tasks:
        # lm_eval scans the directory recursively: one path covers every source.
        argv.append(f"--include_path={CUSTOM_TASKS_ROOT}")
    argv += _chat_argv(spec)
    argv.append(f"--device={spec.device or _default_device(spec, settings)}")
    return argv


def _chat_argv(spec: api.LMEvalJobSpec) -> list[str]:
    """lm_eval's prompt-formatting options (spec.systemInstruction, chatTemplate,
    fewshotAsMultiturn), each one token as ever."""
    argv: list[str] = []
    if spec.system_instruction:
        argv.append(f"--system_instruction={spec.system_instruction}")
    if spec.chat_template is not None and spec.chat_template.enabled:
        name = spec.chat_template.name
        argv.append(f"--apply_chat_template={name}" if name else "--apply_chat_template")
    if spec.fewshot_as_multiturn is not None:
        argv.append(f"--fewshot_as_multiturn={str(spec.fewshot_as_multiturn).lower()}")
    return argv


def resources_for(spec: api.LMEvalJobSpec, settings: Settings) -> dict[str, dict[str, str]]:
    """The main container's resources: the size preset, overridden key by key by
    spec.pod.resources. Raises JobPodError for an unknown size."""
    size = spec.size or settings.default_size
    merged: dict[str, dict[str, str]] = {}
    if size:
        preset = settings.size_presets.get(size)
        if preset is None:
            known = ", ".join(sorted(settings.size_presets)) or "none are defined"
            raise JobPodError(
                f"spec.size: unknown size {size!r}; known sizes: {known} "
                "(size-presets in ConfigMap lmeval-poller-config)"
            )
        for kind, values in preset.model_dump(exclude_none=True).items():
            merged[kind] = dict(values)
    explicit = spec.pod.resources if spec.pod else None
    if explicit is not None:
        for kind, values in explicit.model_dump(exclude_none=True).items():
            merged.setdefault(kind, {}).update(values)
    return merged


def _default_device(spec: api.LMEvalJobSpec, settings: Settings) -> str:
    try:
        resources = resources_for(spec, settings)
    except JobPodError:
        return "cpu"  # build_pod reports the unknown size itself
    wanted = {**resources.get("limits", {}), **resources.get("requests", {})}
    gpus = [name for name in settings.gpu_resource_names if wanted.get(name, "0") not in ("0", "")]
    return "cuda" if gpus else "cpu"
