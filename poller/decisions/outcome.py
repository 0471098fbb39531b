"""How a finished evaluation's outcome is read: the log window, the results, exec.

When the main container has terminated (or, in exec mode, the driver holds
it after reporting), `decide` hands over to this part: what the driver's
final marker and the container's termination state say, which results count
and where they go. Before that, the cycle reads what this part says must be
read (`poller.cycle.observe`): which window of the pod log first, when a wider or
narrower one (`next_results_window`, the rule below), and in exec mode the
results file the driver holds (`results_to_exec`). Everything it reads was
written by whoever controls the job, so the log comes decoded and bounded
(`driver.decoder`), and what could not be read is said in the message,
never guessed. The commits the driver reports for Git task sources are
checked against the spec's pins before anything is recorded
(`task_source_problem`): results that are not the pinned code's are not the
job's. Pure, like `decide`.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from typing import Any

from driver import protocol
from driver.decoder import DecodedLog, Outcome
from driver.protocol import ItemScores
from poller import api
from poller.api.settings import Settings
from poller.decisions.actions import (
    Action,
    Decision,
    ExecRequest,
    LogRequest,
    ReleaseHold,
    StoreResults,
)
from poller.decisions.draft import StatusDraft
from poller.decisions.views import ExecView, JobView, LogView, PodView
from poller.jobpod import gittasks, podspec
from poller.results import itemstore, lmeval, provenance

__all__ = [
    "FIRST_TAIL_LINES",
    "MAX_RESULTS_READS",
    "MAX_TAIL_LINES",
    "RESULTS_TAIL_LINES",
    "RUNTIME_LINE_BYTES",
    "TASKS_IN_MESSAGE",
    "TASK_SOURCE_MISMATCH",
    "WIDENING",
    "WIDENINGS",
    "complete",
    "first_results_window",
    "holding",
    "next_results_window",
    "record_exports",
    "record_mlflow_run",
    "record_provenance",
    "record_results_artifact",
    "record_task_sources",
    "results_read_while_held",
    "results_to_exec",
    "task_source_problem",
    "termination_message",
]

# How much of a finished container's log is read, in one cycle, before
# `decide` runs (the rule is `next_results_window`):
#   1. the last FIRST_TAIL_LINES lines;
#   2. if the container exited 0 and they hold no results:
#      - a window that bytes cut (more bytes than a read may take) is read
#        again once, narrower: the last RESULTS_TAIL_LINES lines;
#      - a full window that bytes did not cut may have begun inside the
#        results: the next is WIDENING times wider, at most WIDENINGS times,
#        so the widest is MAX_TAIL_LINES = FIRST_TAIL_LINES * WIDENING**WIDENINGS;
#   3. else stop: `decide` concludes from the last window read.
# So no log is read more than MAX_RESULTS_READS times in a cycle.
# Results markers are ~32 KiB lines; a toy run's whole log is a few hundred
# lines. Start small and enlarge only when the decoder says the log was cut.
FIRST_TAIL_LINES = 400
WIDENING = 4
WIDENINGS = 3
MAX_TAIL_LINES = FIRST_TAIL_LINES * WIDENING**WIDENINGS  # 25,600
MAX_RESULTS_READS = 1 + WIDENINGS
# Windows count the lines of the runtime's log file, where a line longer than
# 16 KiB is split into pieces of 16 KiB (containerd, CRI-O): the kubelet's
# (and kwok's) tailLines counts the pieces, so a results marker is 3 lines.
RUNTIME_LINE_BYTES = 16 * 1024
# The driver writes the results markers (protocol.MAX_RESULTS_CHUNKS at most),
# then the per-item scores' items markers (protocol.MAX_ITEMS_CHUNKS, chunks
# of the same size) and the completed marker last, with a few notes at most
# after them: this window (127 lines) holds them all, and fits a results
# read's byte limit (127 pieces of 16 KiB are 1.98 MiB; the items' chunk
# count is chosen so). It is read instead when the first window held more
# bytes than a read may take (long lines before the results, such as the
# tqdm redraws of a long run, which end in one newline).
RESULTS_TAIL_LINES = (
    -(-protocol.MAX_RESULTS_MARKER_CHARS // RUNTIME_LINE_BYTES)
    * (protocol.MAX_RESULTS_CHUNKS + protocol.MAX_ITEMS_CHUNKS)
    + 16
)
# Task names the status message of a finished job lists (a results JSON may
# name thousands: the message is in every LIST of jobs).
TASKS_IN_MESSAGE = 20
# status.resultsArtifact(Error): text from the pod's log, bounded.
MAX_ARTIFACT_CHARS = 1024
_ARTIFACT = re.compile(r"^sha256:[a-f0-9]{64}$")
# status.mlflowRun: what the pod's log may name. MLflow's run IDs are uuid4
# hex; experiment IDs are numbers on MLflow's own server (bounded, in case).
_MLFLOW_RUN_ID = re.compile(r"^[0-9a-f]{32}$")
_MLFLOW_EXPERIMENT_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_MLFLOW_URL_CHARS = 4096
# The cause (condition reason, event) of a job whose run reported commits that
# are not its spec's (`task_source_problem`).
TASK_SOURCE_MISMATCH = "TaskSourceMismatch"
# How the driver names a Git source: its index in spec.customTasks, as the
# poller writes it (`podgit.source_name`), no sign, no leading zero.
_SOURCE_INDEX = re.compile(r"^(0|[1-9][0-9]{0,5})$")
_COMMIT = re.compile(api.GIT_COMMIT)
# Of a reported name or commit that is not what it should be, the message quotes this much.
MAX_SHOWN_COMMIT = 80

C = api.ConditionType
S = api.JobState
R = api.JobReason


def termination_message(pod: PodView) -> str:
    main = pod.main
    code = main.exit_code
    if main.reason == "OOMKilled":
        return f"OOMKilled: the evaluation container exceeded its memory limit (exit code {code})"
    signal_number = main.signal or (code - 128 if code is not None and code > 128 else None)
    parts = [f"exit code {code}"]
    if signal_number:
        parts.append(f"killed by {protocol.signal_text(signal_number)}")
    if main.reason and main.reason not in ("Error", "Completed"):
        parts.append(main.reason)
    text = ", ".join(parts)
    detail = main.message.strip().splitlines()[-1] if main.message.strip() else ""
    return f"{text}: {detail}" if detail else text


def results_read_while_held(job: JobView, pod: PodView) -> bool:
    """The container exited 0 and its results were read (through exec or the
    log) while the driver held it: the log need not be read again."""
    return pod.main.exit_code == 0 and job.status.results is not None


def first_results_window(job: JobView, pod: PodView) -> LogRequest | None:
    """The log window to read for a terminated container's outcome, if any."""
    if results_read_while_held(job, pod):
        return None
    return LogRequest(pod.name, podspec.MAIN_CONTAINER, FIRST_TAIL_LINES)


def next_results_window(pod: PodView, log: LogView) -> int | None:
    """The window of lines to read after `log` (see the rule above), or None: enough."""
    if pod.main.exit_code != 0 or log.decoded.results is not None:
        return None
    return _results_window(log)


def complete(
    job: JobView, pod: PodView, settings: Settings, now: dt.datetime, log: LogView | None
) -> Decision:
    """The outcome of a terminated container, from the last log window read.

    `log` may be None only when `first_results_window` asked for none
    (results read while held); a log that could not be read is a `LogView`
    saying so. Deciding without the log it needs is a bug in the caller.
    """
    if results_read_while_held(job, pod):
        draft = StatusDraft(job, now)
        draft.finish(R.SUCCEEDED, job.status.message or "evaluation finished")
        return Decision(draft.actions())
    if log is None:
        raise ValueError("a terminated container's outcome needs its log: see what_to_observe")
    decoded = log.decoded

    draft = StatusDraft(job, now)
    actions: list[Action] = []
    outcome = decoded.outcome
    exit_code = pod.main.exit_code
    with_results = exit_code == 0 and decoded.results is not None
    mismatch = record_task_sources(job, log, draft, finished=with_results)
    if mismatch is not None:
        # What ran is not the task code the spec pins: its results are not kept
        # as the job's, whatever the container said.
        draft.finish(R.FAILED, mismatch, cause=TASK_SOURCE_MISMATCH)
    elif with_results and decoded.results is not None:
        actions.append(_store_results(job, pod, draft, decoded.results, "log", decoded))
        draft.finish(R.SUCCEEDED, draft.fields["message"])
    elif exit_code == 0:
        why = f"log unavailable: {log.unavailable}" if log.unavailable else decoded.results_error
        if log.cut_at is not None:
            why = (
                f"the log window (its last {log.tail_lines} lines) exceeded {log.cut_at} bytes, "
                f"so its end could not be read ({why})"
            )
        draft.finish(R.FAILED, f"lm_eval exited 0 but the pod log holds no results: {why}")
    elif pod.deleting and exit_code != 0:
        # Deleted by someone else (the poller's own deletions end the job first):
        # the driver's "cancelled" is only the SIGTERM it got.
        said = f" (the driver reported: {outcome.message})" if outcome and outcome.message else ""
        draft.finish(
            R.FAILED,
            f"pod {pod.name} was deleted before the evaluation finished{said}",
            cause="PodDeleted",
        )
    elif outcome is not None and outcome.event == protocol.EVENT_CANCELLED:
        draft.finish(R.CANCELLED, outcome.message or "cancelled")
    elif pod.main.reason == "OOMKilled" or outcome is None or not outcome.message:
        draft.finish(R.FAILED, termination_message(pod), cause=pod.main.reason or None)
    else:
        draft.finish(R.FAILED, f"{outcome.message} (exit code {exit_code})")
    if decoded.last_progress:
        draft.progress(decoded.last_progress)
    if not actions:  # no results: the provenance of what ran (_store_results records it else)
        record_provenance(pod, decoded, draft)
    record_exports(job, outcome, draft)
    return Decision(draft.actions(before=actions))


def _reported_sources(log: LogView) -> list[tuple[str, str]]:
    """Every (name, commit) the driver's markers report: the final marker's, then
    the started marker's (the same pairs, from a driver that was not tampered with)."""
    reported = list(log.decoded.outcome.task_sources) if log.decoded.outcome is not None else []
    if log.decoded.started is not None:
        started = protocol.read_fields(log.decoded.started, protocol.StartedFields)
        reported += [(s["name"], s["commit"]) for s in started.get("task_sources", [])]
    return reported


def _pins(raw_spec: Mapping[str, Any]) -> dict[int, tuple[str | None, str]]:
    """spec.customTasks' Git sources by index: the commit each pins (None: a branch,
    a tag or the default branch, resolved when the pod started), and the field
    that says what it follows."""
    entries = raw_spec.get("customTasks")
    pins: dict[int, tuple[str | None, str]] = {}
    for index, entry in enumerate(entries if isinstance(entries, list) else []):
        git = entry.get("git") if isinstance(entry, dict) else None
        if not isinstance(git, dict):
            continue
        where = f"spec.customTasks[{index}].git"
        commit, branch = git.get("commit"), git.get("branch")
        if isinstance(commit, str) and commit:
            pins[index] = (commit, f"{where}.commit")
        else:
            pins[index] = (None, f"{where}.branch" if branch else where)
    return pins


def _shown(text: str) -> str:
    """Untrusted text from the log, quoted and bounded for a message."""
    return repr(text[:MAX_SHOWN_COMMIT] + ("..." if len(text) > MAX_SHOWN_COMMIT else ""))


def task_source_problem(
    raw_spec: Mapping[str, Any], reported: Sequence[tuple[str, str]], *, finished: bool
) -> str | None:
    """Why the commits the run reported are not the spec's; None when they are. Pure.

    The pairs come from the pod log. Each must name a Git source of the spec
    (by its index, `podgit.source_name`) and be one full commit hash; a source
    that pins ``commit`` must report exactly that commit (the schema takes
    only full hashes, and git's ``%H`` prints the full hash, so equal means
    equal, no prefix). When the run `finished` with results, every Git source
    must have been reported: the driver reports them all before lm_eval runs,
    so a missing one means results that nothing ties to the code they ran.
    """
    pins = _pins(raw_spec)
    seen: dict[int, str] = {}
    for name, commit in reported:
        index = int(name) if _SOURCE_INDEX.match(name) else None
        if index is None or index not in pins:
            return (
                f"spec.customTasks: the run reported a commit for task source {_shown(name)}, "
                "which is not a Git source of the spec: its results are not tied to the "
                "spec's task code"
            )
        pinned, where = pins[index]
        expected = f"expected {pinned}" if pinned else "expected a full commit hash"
        if not _COMMIT.match(commit):
            return (
                f"{where}: {expected}, the run reported {_shown(commit)}, which is not a "
                "commit hash: its results are not tied to the spec's task code"
            )
        if pinned is not None and commit != pinned:
            return (
                f"{where}: expected {pinned}, the run reported {commit}: its results are not "
                "the pinned code's"
            )
        if seen.setdefault(index, commit) != commit:
            return (
                f"{where}: the run reported two commits, {seen[index]} and {commit}: its "
                "results are not tied to one commit"
            )
    missing = sorted(set(pins) - set(seen)) if finished else []
    if missing:
        pinned, where = pins[missing[0]]
        expected = f"expected {pinned}" if pinned else "expected the commit it cloned"
        return (
            f"{where}: {expected}, the run reported no commit for this source: its results "
            "are not tied to the spec's task code"
        )
    return None


def record_task_sources(
    job: JobView, log: LogView, draft: StatusDraft, *, finished: bool | None = None
) -> str | None:
    """status.taskSources from the commits the driver reported, once checked against
    the spec (`task_source_problem`); else the problem, and no status.taskSources
    at all (an earlier record is removed). `finished`: whether the run ended with
    results (default: whether the driver's final marker says it completed)."""
    if finished is None:
        final = log.decoded.outcome
        finished = final is not None and final.event == protocol.EVENT_COMPLETED
    reported = _reported_sources(log)
    problem = task_source_problem(job.spec, reported, finished=finished)
    if problem is not None:
        draft.fields.pop("task_sources", None)
        return problem
    entries = gittasks.status_entries(job.spec, reported)
    if entries:
        draft.fields["task_sources"] = entries
    return None


def record_results_artifact(job: JobView, outcome: Outcome | None, draft: StatusDraft) -> None:
    """status.resultsArtifact (or resultsArtifactError) and condition ResultsPushed.

    Only for a job that asked (spec.outputs.oci) and a run that completed; a
    failed push does not fail the job, whose results are in status anyway.
    """
    outputs = job.spec.get("outputs")
    oci = outputs.get("oci") if isinstance(outputs, dict) else None
    if not isinstance(oci, dict) or outcome is None or outcome.event != protocol.EVENT_COMPLETED:
        return
    artifact, error = outcome.results_artifact, outcome.results_artifact_error
    # The log is the pod's word: keep only a digest of the job's own repository.
    if artifact is not None and not _ARTIFACT.match(
        artifact.removeprefix(f"{oci.get('repository')}@")
    ):
        artifact, error = (
            None,
            "the driver reported an artifact outside spec.outputs.oci.repository",
        )
    if artifact is not None:
        draft.fields["results_artifact"] = artifact
        draft.fields.pop("results_artifact_error", None)
        draft.condition(C.RESULTS_PUSHED, True, "Pushed", artifact)
        return
    error = (error or "the driver did not report the push")[:MAX_ARTIFACT_CHARS]
    draft.fields["results_artifact_error"] = error
    draft.fields.pop("results_artifact", None)
    draft.condition(C.RESULTS_PUSHED, False, "PushFailed", error)


def _mlflow_run(tracking_uri: str, outcome: Outcome) -> tuple[dict[str, str] | None, str | None]:
    """status.mlflowRun from the final marker, or why there is none."""
    run_id, url = outcome.mlflow_run_id, outcome.mlflow_run_url
    if run_id is None or url is None:
        return None, outcome.mlflow_error or "the driver did not report the export"
    experiment = outcome.mlflow_experiment_id
    # The log is the pod's word: a run ID of MLflow's form, a page on the job's server.
    if not _MLFLOW_RUN_ID.match(run_id):
        return None, "the driver reported a run ID that is not MLflow's (32 hex digits)"
    page = tracking_uri.rstrip("/") + "/"
    if not url.startswith(page) or len(url) > MAX_MLFLOW_URL_CHARS or not url.isprintable():
        return None, "the driver reported a run outside spec.outputs.mlflow.trackingUri"
    run = {"id": run_id, "url": url}
    if experiment is not None and _MLFLOW_EXPERIMENT_ID.match(experiment):
        run["experiment_id"] = experiment
    return run, None


def record_mlflow_run(job: JobView, outcome: Outcome | None, draft: StatusDraft) -> None:
    """status.mlflowRun (or mlflowRunError) and condition ResultsExported.

    Only for a job that asked (spec.outputs.mlflow) and a run that completed; a
    failed export does not fail the job, whose results are in status anyway.
    """
    outputs = job.spec.get("outputs")
    mlflow = outputs.get("mlflow") if isinstance(outputs, dict) else None
    if not isinstance(mlflow, dict) or outcome is None or outcome.event != protocol.EVENT_COMPLETED:
        return
    run, error = _mlflow_run(str(mlflow.get("trackingUri") or ""), outcome)
    if run is not None:
        draft.fields["mlflow_run"] = run
        draft.fields.pop("mlflow_run_error", None)
        draft.condition(C.RESULTS_EXPORTED, True, "Exported", run["url"])
        return
    error = (error or "the driver did not report the export")[:MAX_ARTIFACT_CHARS]
    draft.fields["mlflow_run_error"] = error
    draft.fields.pop("mlflow_run", None)
    draft.condition(C.RESULTS_EXPORTED, False, "ExportFailed", error)


def record_exports(job: JobView, outcome: Outcome | None, draft: StatusDraft) -> None:
    """Every output the driver sends after a completed run: OCI, then MLflow.
    (Each writes its own condition with literal reasons, which the docs read.)"""
    record_results_artifact(job, outcome, draft)
    record_mlflow_run(job, outcome, draft)


def _results_window(log: LogView) -> int | None:
    """The window of lines to read next for results missing from `log`, or None.

    Never wider after a read that bytes cut (the kubelet keeps a window's
    head, so a wider one would be cut sooner): the narrow results window
    instead, once, from the first window. A full window that bytes did not
    cut may have started inside the results: WIDENING times wider, up to
    MAX_TAIL_LINES, but never after the narrow window. Every path ends
    within MAX_RESULTS_READS reads (400, 1600, 6400, 25600).
    """
    if log.cut_at is not None:
        narrower = log.tail_lines == FIRST_TAIL_LINES
        return RESULTS_TAIL_LINES if narrower else None
    window_full = log.lines_read >= log.tail_lines and log.tail_lines < MAX_TAIL_LINES
    if window_full and log.tail_lines != RESULTS_TAIL_LINES:
        return log.tail_lines * WIDENING
    return None


def record_provenance(
    pod: PodView,
    decoded: DecodedLog,
    draft: StatusDraft,
    found: dict[str, object] | None = None,
    items: ItemScores | None = None,
) -> provenance.Provenance:
    """status.provenance of the run that `pod` ran; the full record, for the ConfigMap."""
    record = provenance.build(
        outcome=decoded.outcome,
        started=decoded.started,
        results=found,
        image=pod.main.image,
        image_id=pod.main.image_id,
        items=items,
    )
    fields = record.status_fields()
    if fields is not None:
        draft.fields["provenance"] = fields
    return record


def _store_results(
    job: JobView,
    pod: PodView,
    draft: StatusDraft,
    found: dict[str, object],
    source: str,
    decoded: DecodedLog,
) -> StoreResults:
    """Status fields for `found` results; the action that stores them in full.

    Beside the results, in the same ConfigMap: the provenance JSON and the
    per-item scores (gzip'd), within the ConfigMap's limit (the rule is
    `itemstore.results_manifest`).
    """
    items = itemstore.check(decoded)
    record = record_provenance(pod, decoded, draft, found, items.scores)
    # What is stored is lm_eval's file with secrets hidden in its echo of the
    # configuration (model_args, dataset URLs); the provenance redacts its own.
    shown = lmeval.without_secrets(found)
    text, reduced = lmeval.reduce_results(shown)
    draft.fields.update(
        results=text,
        results_reduced=reduced,
        results_config_map=lmeval.results_configmap_name(job.name),
        results_source=source,
    )
    scores = found.get("results")
    names = sorted(scores.keys()) if isinstance(scores, dict) else []
    tasks = ", ".join(names[:TASKS_IN_MESSAGE])
    if len(names) > TASKS_IN_MESSAGE:
        tasks += f", ... ({len(names)} tasks)"
    draft.fields["message"] = f"evaluation finished: {tasks}"
    outcome = decoded.outcome
    outputs = draft.fields.get("outputs")
    manifest, summary, note = itemstore.results_manifest(
        namespace=job.namespace,
        job_name=job.name,
        job_uid=job.uid,
        labels={podspec.LABEL_MANAGED_BY: podspec.MANAGED_BY},
        found=shown,
        reduced_text=text,
        provenance=record.document(),
        items=items,
        items_path=outcome.items_path if outcome is not None else None,
        outputs=outputs if isinstance(outputs, str) else None,
    )
    if note is not None:
        draft.fields["message"] += f" ({note})"
    if summary is not None:
        draft.fields["item_scores"] = summary
    return StoreResults(manifest)


def results_to_exec(
    job: JobView, pod: PodView, settings: Settings, log: LogView
) -> ExecRequest | None:
    """Exec mode: the results file to cat, when `log` shows the driver holding it
    after completing and the job has no results yet."""
    outcome = log.decoded.outcome
    if settings.results_source != "exec" or outcome is None or not outcome.results_path:
        return None
    if outcome.event != protocol.EVENT_COMPLETED or job.status.results is not None:
        return None
    return ExecRequest(pod.name, podspec.MAIN_CONTAINER, outcome.results_path)


def holding(
    job: JobView,
    pod: PodView,
    settings: Settings,
    log: LogView,
    exec_view: ExecView | None,
    draft: StatusDraft,
) -> list[Action] | None:
    """Exec mode: the driver reported and holds its container. Store the results
    read by exec (`results_to_exec`; else from the log), then release the hold.
    None: not holding."""
    outcome = log.decoded.outcome
    if settings.results_source != "exec" or outcome is None:
        return None
    actions: list[Action] = []
    if outcome.event == protocol.EVENT_COMPLETED and job.status.results is None:
        found: dict[str, object] | None = None
        if exec_view is not None and exec_view.text:
            try:
                found = protocol.parse_results_json(exec_view.text)
            except ValueError:  # junk, or over the limits: the log is the fallback
                found = None
        source = "exec"
        if found is None:
            found, source = log.decoded.results, "log"
        if found is not None:
            actions.append(_store_results(job, pod, draft, found, source, log.decoded))
    # Recorded now: once its results are read, the terminated container's
    # outcome (`complete`) is not read from the log again.
    record_exports(job, outcome, draft)
    release = protocol.release_argv(podspec.driver_command(settings))
    actions.append(ReleaseHold(pod.name, podspec.MAIN_CONTAINER, tuple(release)))
    return actions
