"""How a finished evaluation's outcome is read: the log window, the results, exec.

When the main container has terminated (or, in exec mode, the driver holds
it after reporting), `decide` hands over to this part: which window of the
pod log to read and when to read a wider one, what the driver's final
marker and the container's termination state say, which results count and
where they go. Everything it reads was written by whoever controls the job,
so the log comes decoded and bounded (`driver.decoder`), and what could not
be read is said in the message, never guessed. Pure, like `decide`.
"""

from __future__ import annotations

import datetime as dt
import json

from driver import protocol
from poller import api, podspec, results
from poller.draft import StatusDraft
from poller.model import (
    Action,
    Decision,
    ExecResults,
    ExecView,
    JobView,
    LogView,
    PodView,
    ReadLog,
    ReleaseHold,
    StoreResults,
)
from poller.settings import Settings

__all__ = [
    "FIRST_TAIL_LINES",
    "MAX_TAIL_LINES",
    "RESULTS_TAIL_LINES",
    "RUNTIME_LINE_BYTES",
    "TASKS_IN_MESSAGE",
    "complete",
    "holding",
    "termination_message",
]

# Results markers are ~32 KiB lines; a toy run's whole log is a few hundred
# lines. Start small and enlarge only when the decoder says the log was cut.
FIRST_TAIL_LINES = 400
MAX_TAIL_LINES = 25_600
# Windows count the lines of the runtime's log file, where a line longer than
# 16 KiB is split into pieces of 16 KiB (containerd, CRI-O): the kubelet's
# (and kwok's) tailLines counts the pieces, so a results marker is 3 lines.
RUNTIME_LINE_BYTES = 16 * 1024
# The driver writes the results markers (protocol.MAX_RESULTS_CHUNKS at most)
# and the completed marker last, with a few notes at most after them: this
# window (115 lines) holds them all, and fits a results read's byte limit
# (115 pieces of 16 KiB are 1.8 MiB). It is read instead when the first
# window held more bytes than a read may take (long lines before the
# results, such as the tqdm redraws of a long run, which end in one newline).
RESULTS_TAIL_LINES = (
    -(-protocol.MAX_RESULTS_MARKER_CHARS // RUNTIME_LINE_BYTES) * protocol.MAX_RESULTS_CHUNKS + 16
)
# Task names the status message of a finished job lists (a results JSON may
# name thousands: the message is in every LIST of jobs).
TASKS_IN_MESSAGE = 20

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


def complete(
    job: JobView, pod: PodView, settings: Settings, now: dt.datetime, log: LogView | None
) -> Decision:
    if pod.main.exit_code == 0 and job.status.results is not None:
        # Read (through exec or the log) while the driver held the container.
        draft = StatusDraft(job, now)
        draft.finish(R.SUCCEEDED, job.status.message or "evaluation finished")
        return Decision(draft.actions())
    if log is None:
        return Decision([ReadLog(pod.name, podspec.MAIN_CONTAINER, FIRST_TAIL_LINES)])
    decoded = log.decoded
    if pod.main.exit_code == 0 and decoded.results is None:
        retry = _results_window(log)
        if retry is not None:
            return Decision([ReadLog(pod.name, podspec.MAIN_CONTAINER, retry)])

    draft = StatusDraft(job, now)
    actions: list[Action] = []
    outcome = decoded.outcome
    exit_code = pod.main.exit_code
    if exit_code == 0 and decoded.results is not None:
        actions.append(_store_results(job, draft, decoded.results, "log"))
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
    return Decision(draft.actions(before=actions))


def _results_window(log: LogView) -> int | None:
    """The window of lines to read next for results missing from `log`, or None.

    Never wider after a read that bytes cut (the kubelet keeps a window's
    head, so a wider one would be cut sooner): the narrow results window
    instead, once, from the first window. A full window that bytes did not
    cut may have started inside the results: four times wider, up to
    MAX_TAIL_LINES, but never after the narrow window. Every path ends
    within the cycle's MAX_LOG_ROUNDS reads (400, 1600, 6400, 25600).
    """
    if log.cut_at is not None:
        narrower = log.tail_lines == FIRST_TAIL_LINES
        return RESULTS_TAIL_LINES if narrower else None
    window_full = log.lines_read >= log.tail_lines and log.tail_lines < MAX_TAIL_LINES
    if window_full and log.tail_lines != RESULTS_TAIL_LINES:
        return log.tail_lines * 4
    return None


def _store_results(
    job: JobView, draft: StatusDraft, found: dict[str, object], source: str
) -> StoreResults:
    """Status fields for `found` results; the action that stores them in full."""
    text, reduced = results.reduce_results(found)
    draft.fields.update(
        results=text,
        results_reduced=reduced,
        results_config_map=results.results_configmap_name(job.name),
        results_source=source,
    )
    scores = found.get("results")
    names = sorted(scores.keys()) if isinstance(scores, dict) else []
    tasks = ", ".join(names[:TASKS_IN_MESSAGE])
    if len(names) > TASKS_IN_MESSAGE:
        tasks += f", ... ({len(names)} tasks)"
    draft.fields["message"] = f"evaluation finished: {tasks}"
    manifest = results.results_configmap(
        namespace=job.namespace,
        job_name=job.name,
        job_uid=job.uid,
        results=found,
        labels={podspec.LABEL_MANAGED_BY: podspec.MANAGED_BY},
    )
    size = results.configmap_data_bytes(manifest)
    if size > results.CONFIGMAP_DATA_MAX:
        # The apiserver would refuse it, every cycle: keep what status keeps.
        manifest = results.results_configmap(
            namespace=job.namespace,
            job_name=job.name,
            job_uid=job.uid,
            results=json.loads(text),
            labels={podspec.LABEL_MANAGED_BY: podspec.MANAGED_BY},
        )
        draft.fields["message"] += (
            f" (the full results, {size} bytes compressed, exceed what a ConfigMap holds: "
            f"{results.results_configmap_name(job.name)} holds the reduced results)"
        )
    return StoreResults(manifest)


def holding(
    job: JobView,
    pod: PodView,
    settings: Settings,
    log: LogView,
    exec_view: ExecView | None,
    draft: StatusDraft,
) -> list[Action] | None:
    """Exec mode: the driver reported and holds its container. Read the results
    by exec (falling back to the log), then release the hold. None: not holding."""
    outcome = log.decoded.outcome
    if settings.results_source != "exec" or outcome is None:
        return None
    actions: list[Action] = []
    if outcome.event == protocol.EVENT_COMPLETED and job.status.results is None:
        if exec_view is None and outcome.results_path:
            return [ExecResults(pod.name, podspec.MAIN_CONTAINER, outcome.results_path)]
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
            actions.append(_store_results(job, draft, found, source))
    release = protocol.release_argv(podspec.driver_command(settings))
    actions.append(ReleaseHold(pod.name, podspec.MAIN_CONTAINER, tuple(release)))
    return actions
