"""Reading a job pod's log and files: bounded, because the job's author writes them.

The pod log (and, in exec mode, the results file the driver holds open) is
the poller's only window into an evaluation, and everything in it comes from
whoever controls the job: the model server's answers, the dataset, a hostile
tenant's own output. So every read here has a byte limit, sent to the
kubelet (``limitBytes``) and enforced again while reading
(`poller.kube.client.Kube.read_log_tail`, `poller.kube.transport`), and its text goes
only to the decoder (`driver.decoder`), which never raises. What a read
could not get is said in the view handed to `decide`, never guessed.

`PodIO` makes the reads a decision needs (`LogRequest`, `ExecRequest`,
for `poller.cycle.observe`) and carries out the actions that read or exec in a
pod (`ArchiveLog`, `ReleaseHold`, for `poller.cycle.act`), through `Kube`.
"""

from __future__ import annotations

import logging

from driver.decoder import decode_bytes
from driver.protocol import MAX_RESULTS_BYTES
from poller.decisions.actions import ArchiveLog, ExecRequest, LogRequest, ReleaseHold
from poller.decisions.views import ExecView, JobView, LogView
from poller.jobpod import podspec
from poller.kube.client import ApiError, Kube, LogTail, NotFound, NotOwned
from poller.kube.transport import ExecOutputTooLarge
from poller.results import lmeval

__all__ = [
    "ARCHIVE_TAIL_LINES",
    "EXEC_RESULTS_MAX_BYTES",
    "LOG_READ_ARCHIVE_BYTES",
    "LOG_READ_PROGRESS_BYTES",
    "LOG_READ_RESULTS_BYTES",
    "PodIO",
]

log = logging.getLogger(__name__)

# Byte limits of the reads of a job pod's log, whose author controls it; sent
# as limitBytes and enforced while reading. Results: the encoded results
# (protocol.MAX_ENCODED_RESULTS_CHARS, 1 MiB) with their markers' fields,
# and as much again for the lines around them.
LOG_READ_RESULTS_BYTES = 2 * 1024 * 1024
# Progress: 60 lines of ordinary output (a few hundred bytes each) and markers.
LOG_READ_PROGRESS_BYTES = 128 * 1024
LOG_READ_BYTES = {"results": LOG_READ_RESULTS_BYTES, "progress": LOG_READ_PROGRESS_BYTES}
# The log archive: twice the largest log-archive-bytes (512 KiB), so that a
# window of ordinary lines is kept whole; its last log-archive-bytes are stored.
LOG_READ_ARCHIVE_BYTES = 1024 * 1024
# Windows of lines tried for the archive, narrower each time the previous one
# held more than LOG_READ_ARCHIVE_BYTES (the kubelet keeps a window's head, so
# only a narrower window reaches the log's real end).
ARCHIVE_TAIL_LINES = (5000, 500, 50)
# Exec'd results: the protocol's limit on results, whatever their source.
EXEC_RESULTS_MAX_BYTES = MAX_RESULTS_BYTES


class PodIO:
    """Reads of job pods, for one cycle's jobs (thread-safe: no state)."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    def exec_results(self, job: JobView, action: ExecRequest) -> ExecView:
        """cat the results file in the held container; on any failure an empty view
        (the log is the fallback) and a warning that says why."""
        try:
            code, out, err = self.kube.exec_in_pod(
                job.namespace,
                action.pod,
                action.container,
                ["cat", action.path],
                max_stdout=EXEC_RESULTS_MAX_BYTES,
            )
        except ExecOutputTooLarge:
            why = f"results file larger than {EXEC_RESULTS_MAX_BYTES} bytes"
        except Exception as error:  # exec is best effort
            why = f"exec failed: {error}"
        else:
            if code in (0, None) and out:
                return ExecView(out)
            why = f"cat exited {code}: {err.strip()[:200]}"
        log.warning("%s/%s: %s; reading the log instead", job.namespace, job.name, why)
        return ExecView(None)

    def release(self, job: JobView, action: ReleaseHold) -> None:
        try:
            self.kube.exec_in_pod(job.namespace, action.pod, action.container, list(action.argv))
        except Exception as error:  # the driver's hold ends by itself anyway
            log.warning("could not release %s/%s: %s", job.namespace, action.pod, error)

    def archive_log(self, job: JobView, action: ArchiveLog) -> None:
        """Keep the log's last bytes; a log that cannot be read is noted, not fatal."""
        try:
            tail = self._archive_tail(job, action)
        except Exception as error:  # the archive is best effort; deletion goes on
            tail = f"(the pod log could not be read before deletion: {error})"
        manifest = lmeval.results_configmap(
            namespace=job.namespace,
            job_name=job.name,
            job_uid=job.uid,
            results=None,
            labels={podspec.LABEL_MANAGED_BY: podspec.MANAGED_BY},
            extra_data={lmeval.LOG_ARCHIVE_KEY: tail},
        )
        try:
            self.kube.apply_configmap(manifest, merge=True)
        except NotOwned as error:  # someone else's ConfigMap under that name: never touched
            log.warning("log of %s/%s not archived: %s", job.namespace, job.name, error)
        except ApiError as error:
            if error.transient:
                raise  # transient: archive (and delete) next cycle
            # Refused for good (with large results, the ConfigMap would pass
            # its size limit): the pod's deletion must not wait on it forever.
            log.warning("log archive of %s/%s not kept: %s", job.namespace, job.name, error.message)

    def _archive_tail(self, job: JobView, action: ArchiveLog) -> str:
        """The log's last `max_bytes`, from the widest window that fits the read limit."""
        read: LogTail | None = None
        for lines in ARCHIVE_TAIL_LINES:
            read = self.kube.read_log_tail(
                job.namespace, action.pod, action.container, lines, LOG_READ_ARCHIVE_BYTES
            )
            if not read.cut:
                break
        assert read is not None
        kept = read.data[-action.max_bytes :].decode("utf-8", errors="ignore")
        if read.cut:
            kept += (
                f"\n(the log's last {ARCHIVE_TAIL_LINES[-1]} lines exceed "
                f"{LOG_READ_ARCHIVE_BYTES} bytes: the log's end is not shown)\n"
            )
        return kept

    def read_log(self, job: JobView, request: LogRequest) -> LogView:
        limit = LOG_READ_BYTES.get(request.purpose, LOG_READ_PROGRESS_BYTES)
        try:
            read = self.kube.read_log_tail(
                job.namespace, request.pod, request.container, request.tail_lines, limit
            )
        except NotFound as error:
            return LogView(decode_bytes(b""), request.tail_lines, unavailable=str(error))
        except ApiError as error:
            if error.transient:
                raise  # transient: read again next cycle
            # The log is gone for good (node lost, pod evicted, ...): decide without it.
            return LogView(decode_bytes(b""), request.tail_lines, unavailable=error.message)
        return LogView(
            decode_bytes(read.data),
            request.tail_lines,
            lines_read=read.data.count(b"\n"),
            cut_at=limit if read.cut else None,
        )
