"""One evaluation run: from the lm_eval command line to the final marker.

Why this module exists: it is the driver's policy, kept apart from the
mechanics in :mod:`driver.child`. It decides the per-run output directory,
reports ``started``/``progress``, turns the child's fate into exactly one
final marker and a meaningful exit code (see :mod:`driver.protocol`), turns
SIGTERM/SIGINT into a bounded, orderly cancellation, and implements the exec
hold that keeps the container alive until the poller has copied the results.
What must be ready before the child starts (the checks of the command line,
the run directory, the log copy, the child's trust bundle, task sources and
datasets view) is :mod:`driver.prepare`'s.

Import discipline: everything that is not needed to start the child
(``dataclasses`` via the protocol and progress modules, ``json``, hashing)
is imported only after the child is running.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from types import FrameType
from typing import TYPE_CHECKING, Unpack

from driver import __version__
from driver.argv import new_run_id
from driver.child import Child, Pump, Sink
from driver.contract import (
    CMD_RELEASE,
    DRIVER_PROGRAM,
    EVENT_CANCELLED,
    EVENT_COMPLETED,
    EVENT_FAILED,
    EXIT_CANCELLED,
    EXIT_DRIVER_ERROR,
    EXIT_NO_RESULTS,
    EXIT_OK,
)
from driver.prepare import Preparation, RunOptions

if TYPE_CHECKING:  # the protocol module is imported once the child runs
    from driver.protocol import (
        FinalDetails,
        FinalEvent,
        FinalFields,
        StartedFields,
    )

__all__ = ["RELEASE_FILE", "RESULTS_COPY", "Run", "find_results", "release", "release_path"]

RELEASE_FILE = ".release"
RESULTS_COPY = "results.json"
# How long to wait for the pipes to close once the child's group is dead. A
# grandchild that escaped the group (setsid) could hold them open forever.
PUMP_JOIN_TIMEOUT = 5.0
# How a child's failed certificate verification is reported (driver.trust).
TLS_FAILURE = (
    "TLS verification of the model endpoint failed (its certificate is not signed by a CA the "
    "evaluation trusts: name the CA in spec.modelTLS.caBundle, or ask for it in the poller "
    "setting trusted-ca-bundles)"
)
# Tick of the main loop while waiting for the child or the hold; signals do
# their work in the handler, so this only bounds deadline checks.
TICK = 0.1


class _Cancel:
    """What the SIGTERM/SIGINT handler knows and does.

    The handler does the urgent part itself (SIGTERM to the group, or SIGKILL
    on a second signal) so that cancellation never waits for the main loop.
    """

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.signum: int | None = None
        self.count = 0
        self.deadline: float | None = None
        self.child: Child | None = None
        self.child_exited = False
        self.killed = False

    def handle(self, signum: int, _frame: FrameType | None) -> None:
        self.count += 1
        if self.child_exited:
            return  # only ends the exec hold
        if self.signum is None:
            self.signum = signum
            self.deadline = time.monotonic() + self.grace
            if self.child is not None:
                self.child.kill_group(signal.SIGTERM)
        else:
            # A second signal means "now": no more grace.
            self.deadline = time.monotonic()
            self.kill()

    def kill(self) -> None:
        if self.child is not None and not self.killed:
            self.killed = True
            self.child.kill_group(signal.SIGKILL)


def _ts() -> float:
    return round(time.time(), 3)


def release_path(output_root: str) -> str:
    """Where ``lmeval-driver release`` leaves its mark for a holding driver."""
    return os.path.join(output_root, RELEASE_FILE)


def find_results(run_dir: str) -> str | None:
    """This run's newest ``results_*.json`` under ``run_dir`` (any depth)."""
    found: list[tuple[int, str]] = []
    for dirpath, _dirs, files in os.walk(run_dir):
        for name in files:
            if name.startswith("results_") and name.endswith(".json"):
                path = os.path.join(dirpath, name)
                try:
                    found.append((os.stat(path).st_mtime_ns, path))
                except OSError:
                    continue
    return max(found)[1] if found else None


class Run:
    """State of one driver invocation."""

    def __init__(self, opts: RunOptions, stdout_fd: int = 1, stderr_fd: int = 2) -> None:
        self.opts = opts
        self.started_wall = time.time()
        self.started_mono = time.monotonic()
        self.started_fields: StartedFields | None = None  # the provenance of an OCI push
        self.cancel = _Cancel(max(0.0, opts.grace_period))
        self.run_id = opts.run_id or new_run_id()
        # Absolute: the path travels in markers to readers with another cwd.
        self.run_dir = os.path.abspath(os.path.join(opts.output_root, f"run-{self.run_id}"))
        self.prep = Preparation(opts, self.run_id, self.run_dir, stdout_fd, stderr_fd)
        self.final_code: int | None = None  # set once the final marker is out
        self._models: str | None = None  # what the model server lists; "" when unknown

    @property
    def sink(self) -> Sink:
        """Where markers and notes go; the preparation adds the log copy to it."""
        return self.prep.sink

    # -- markers -------------------------------------------------------------

    def _final(
        self,
        event: FinalEvent,
        exit_code: int,
        message: str,
        signum: int | None,
        **details: Unpack[FinalDetails],
    ) -> int:
        """Write the final marker (`details` go after its signal, in the order given)."""
        from driver.protocol import encode_final

        fields: FinalFields = {
            "run_id": self.run_id,
            "ts": _ts(),
            "exit_code": exit_code,
            "message": message,
            "duration": round(time.monotonic() - self.started_mono, 3),
            "signal": signum,
            **details,
            **self._provenance(event),
        }
        if self.prep.task_sources is not None:
            fields["task_sources"] = self.prep.task_sources
        self.sink.marker(encode_final(event, fields))
        self.final_code = exit_code
        if event != EVENT_COMPLETED:
            self.sink.note(f"{event}: {message}")
        return exit_code

    def _provenance(self, event: FinalEvent) -> FinalDetails:
        """What identifies the run, for every final marker (the started one may be cut off)."""
        from driver.provenance import final_provenance

        # Not when cancelled: the grace period is lm_eval's, not a model server's.
        models = self._server_models() if event != EVENT_CANCELLED else None
        return final_provenance(self.started_fields, self.opts.child_argv, models)

    def _server_models(self) -> str | None:
        """The model server's model ids (API models, once lm_eval ran), fetched once."""
        if self._models is None and self.started_fields is not None:
            from driver.provenance import server_models

            self._models = server_models(self.opts.child_argv, self.prep.child_env, self.sink)
        return self._models or None

    def driver_error(self, message: str) -> int:
        return self._final(EVENT_FAILED, EXIT_DRIVER_ERROR, message, None)

    # -- the run ---------------------------------------------------------------

    def execute(self) -> int:
        """Run the child to its end, report, hold; return the exit code."""
        previous = {
            sig: signal.signal(sig, self.cancel.handle) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        child: Child | None = None
        try:
            error = self.prep.prepare()
            if error is not None:
                return self.driver_error(error)
            if self.cancel.signum is not None:
                return self._cancelled(None)
            child = Child(
                [*self.opts.child_argv, "--output_path", self.run_dir],
                env=self.prep.child_env,
                cwd=self.prep.child_cwd,
            )
            try:
                child.start()
            except OSError as exc:
                return self.driver_error(f"cannot start {self.opts.child_argv[0]!r}: {exc}")
            self.cancel.child = child
            if self.cancel.signum is not None:  # signalled while spawning
                child.kill_group(signal.SIGTERM)
            code = self._supervise(child)
            self._hold()
            return code
        except Exception as exc:  # a bug must still end in a final marker
            import traceback

            self.sink.note(traceback.format_exc().replace("\n", " | "))
            if self.final_code is not None:  # never a second final marker
                return self.final_code
            return self.driver_error(f"internal driver error: {exc!r}")
        finally:
            if child is not None:
                child.cleanup()
            self.prep.remove_view()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self.prep.log_copy is not None:
                self.prep.log_copy.close()

    def _supervise(self, child: Child) -> int:
        # Only now, with the child running, pay for the heavier imports.
        from driver.argv import lm_eval_version, redact_argv
        from driver.progress import TLS_VERIFY_FAILED, ErrorLineTracker, Progress, ProgressTracker
        from driver.protocol import bounded_argv, encode_progress, encode_started, neutralize

        started: StartedFields = {
            "run_id": self.run_id,
            "ts": _ts(),
            "driver_version": __version__,
            "lm_eval_version": lm_eval_version(),
            "output_dir": self.run_dir,
            "argv": bounded_argv(redact_argv(child.argv)),
            "pid": child.pid,
            "python": sys.version.split()[0],
            "progress_interval": self.opts.progress_interval,
            "grace_period": self.opts.grace_period,
            "hold_seconds": self.opts.hold_seconds,
        }
        if self.prep.task_sources is not None:
            started["task_sources"] = self.prep.task_sources
        self.sink.marker(encode_started(started))
        self.started_fields = started

        def on_progress(p: Progress) -> None:
            self.sink.marker(encode_progress(p.marker_fields(self.run_id, _ts())))

        progress = ProgressTracker(self.opts.progress_interval, on_progress)
        err_lines, out_lines = ErrorLineTracker(), ErrorLineTracker()
        err_observers = [err_lines.feed_block, progress.feed_block]
        pumps = [
            Pump(child.stdout_fd(), "stdout", self.sink, neutralize, [out_lines.feed_block]),
            Pump(child.stderr_fd(), "stderr", self.sink, neutralize, err_observers),
        ]
        for pump in pumps:
            pump.start()
        while not child.wait_exit(TICK):
            deadline = self.cancel.deadline
            if deadline is not None and time.monotonic() >= deadline:
                self.cancel.kill()
        self.cancel.child_exited = True
        returncode = child.reap()
        join_by = time.monotonic() + PUMP_JOIN_TIMEOUT
        for pump in pumps:
            pump.join(max(0.0, join_by - time.monotonic()))
        if any(pump.is_alive() for pump in pumps):
            self.sink.note("output pipes still open after the child exited; stopped reading")
        progress.flush()
        last_line = err_lines.best() or out_lines.best()
        tls_line = err_lines.tls_failure() or out_lines.tls_failure()
        if returncode > 0 and tls_line is not None:
            # Say it first, whichever line lm_eval ended on: the fix is the job's.
            detail = last_line if last_line and TLS_VERIFY_FAILED in last_line else tls_line
            last_line = f"{TLS_FAILURE}: {detail}"
        return self._outcome(returncode, last_line, err_lines.last_warning())

    def _outcome(self, returncode: int, last_line: str | None, warning: str | None) -> int:
        # A cancelled child that still finished properly (exit 0 with results)
        # is reported as completed: the results are real.
        if self.cancel.signum is not None and (
            returncode != 0 or find_results(self.run_dir) is None
        ):
            return self._cancelled(returncode)
        if returncode < 0:
            sig = -returncode
            from driver.protocol import signal_name

            return self._final(
                EVENT_FAILED,
                128 + sig,
                f"killed by signal {sig} ({signal_name(sig)})",
                sig,
                child_exit_code=returncode,
                last_line=last_line,
            )
        if returncode > 0:
            message = last_line or f"lm_eval exited with code {returncode}"
            return self._final(EVENT_FAILED, returncode, message, None, child_exit_code=returncode)
        return self._completed(warning)

    def _cancelled(self, returncode: int | None) -> int:
        from driver.protocol import signal_name

        signum = self.cancel.signum or signal.SIGTERM
        name = signal_name(signum)
        if returncode is None:
            how = "before lm_eval was started"
        elif self.cancel.killed:
            how = f"lm_eval did not stop within {self.cancel.grace:g} s and was killed (SIGKILL)"
        else:
            how = "lm_eval was stopped with SIGTERM"
        return self._final(
            EVENT_CANCELLED,
            EXIT_CANCELLED,
            f"cancelled by {name}: {how}",
            signum,
            child_exit_code=returncode,
            killed=self.cancel.killed,
        )

    def _completed(self, warning: str | None) -> int:
        import hashlib
        import json
        import shutil

        from driver.protocol import encode_results

        source = find_results(self.run_dir)
        if source is None:
            message = f"lm_eval exited 0 but wrote no results file in {self.run_dir}"
            if warning:
                message += f" ({warning})"
            return self._final(EVENT_FAILED, EXIT_NO_RESULTS, message, None, child_exit_code=0)
        try:
            with open(source, "rb") as fh:
                raw = fh.read()
            json.loads(raw)
        except (OSError, ValueError) as exc:
            message = f"lm_eval exited 0 but its results file {source} is unusable: {exc}"
            return self._final(EVENT_FAILED, EXIT_NO_RESULTS, message, None, child_exit_code=0)
        stable = os.path.join(self.run_dir, RESULTS_COPY)
        try:
            tmp = stable + ".tmp"
            shutil.copyfile(source, tmp)
            os.replace(tmp, stable)
        except OSError as exc:
            self.sink.note(f"cannot copy results to {stable}: {exc}")
            stable = source
        details: FinalDetails = {
            "results_path": stable,
            "results_file": source,
            "results_size": len(raw),
            "results_sha256": hashlib.sha256(raw).hexdigest(),
        }
        chunks: list[str] = []
        try:
            chunks = encode_results(raw, self.run_id)
        except ValueError as exc:  # over the protocol's limits: the poller would refuse them
            details["results_note"] = f"{exc}: too large for the log; read {stable}"
        details["results_chunks"] = len(chunks)
        from driver.samples import prepare_items

        # Everything slow first (the model server's identity, the per-item
        # scores, the OCI push, the MLflow export), then the results, items
        # and final markers back to back: a kubelet that rotates the log in
        # between would leave `kubectl logs` (the current file only) with a
        # final marker and no results.
        models = self._server_models()
        items, found = prepare_items(source, self.run_dir, self.run_id, models, self.sink)
        details.update(found)
        from driver.provenance import shard_records

        if shards := shard_records(source):  # a merge pod: one record per shard
            details["shards"] = shards
        if self.opts.oci_push is not None:
            details.update(self._push(raw, details))
        if self.opts.mlflow_tracking_uri is not None:
            details.update(self._export(raw, details))
        for line in (*chunks, *items):
            self.sink.marker(line)
        return self._final(EVENT_COMPLETED, EXIT_OK, "lm_eval completed", None, **details)

    def _provenance_document(self, raw: bytes, details: FinalDetails) -> bytes:
        """The run's provenance JSON that goes beside the results to a registry or MLflow."""
        import json

        kept = ("run_id", "driver_version", "lm_eval_version", "argv", "python", "task_sources")
        started = dict(self.started_fields or {})
        provenance: dict[str, object] = {key: started[key] for key in kept if key in started}
        provenance.update(
            run_id=self.run_id,
            started=round(self.started_wall, 3),
            finished=round(_ts(), 3),
            results_sha256=details.get("results_sha256"),
            results_size=len(raw),
        )
        return json.dumps(provenance, sort_keys=True).encode()

    def _push(self, raw: bytes, details: FinalDetails) -> FinalDetails:
        """Push the results to the OCI registry (spec.outputs.oci); never raises."""
        from driver import ocipush

        assert self.opts.oci_push is not None
        try:
            artifact = ocipush.push_results(
                self.opts.oci_push,
                raw,
                self._provenance_document(raw, details),
                subject=self.opts.oci_subject,
                docker_config=self.opts.oci_auth,
                plain_http=self.opts.oci_plain_http,
                ca_bundle=self.opts.oci_ca_bundle,
                verify_tls=self.opts.oci_verify_tls,
            )
        except Exception as exc:  # the evaluation is not lost to a failed push
            message = (
                str(exc) if isinstance(exc, ocipush.OciError) else f"{type(exc).__name__}: {exc}"
            )
            self.sink.note(f"pushing the results to {self.opts.oci_push} failed: {message}")
            return {"results_artifact_error": message[:1000]}
        self.sink.note(f"results pushed to {artifact}")
        return {"results_artifact": artifact}

    def _export(self, raw: bytes, details: FinalDetails) -> FinalDetails:
        """Log the run to MLflow (spec.outputs.mlflow); never raises."""
        from driver import mlflowexport

        assert self.opts.mlflow_tracking_uri is not None
        request = mlflowexport.ExportRequest(
            tracking_uri=self.opts.mlflow_tracking_uri,
            experiment=self.opts.mlflow_experiment,
            run_name=self.opts.mlflow_run_name,
            tags=self.opts.mlflow_tags,
            credentials=self.opts.mlflow_credentials,
            ca_bundle=self.opts.mlflow_ca_bundle,
        )
        started = self.started_fields
        return mlflowexport.export_run(
            request,
            raw,
            child_argv=self.opts.child_argv,
            versions={
                "lm_eval_version": started["lm_eval_version"] if started else None,
                "driver_version": __version__,
            },
            run_id=self.run_id,
            provenance=self._provenance_document(raw, details),
            items_path=details.get("items_path"),
            temp_dir=os.environ.get("TMPDIR") or "/tmp",  # noqa: S108 - an emptyDir in the pod
            note=self.sink.note,
        )

    def _hold(self) -> None:
        """Exec mode: stay alive until released, timed out, or signalled."""
        hold = self.opts.hold_seconds
        if hold <= 0 or self.cancel.count:
            # Any SIGTERM/SIGINT so far means the pod is being torn down (the
            # run was cancelled, or the signal came while reporting): no hold.
            return
        path = release_path(self.opts.output_root)
        self.sink.note(
            f"holding for up to {hold:g} s so that results can be copied; "
            f"'{DRIVER_PROGRAM} {CMD_RELEASE}' ends the hold"
        )
        # A release file older than this driver belongs to an earlier run.
        # Whole seconds, for filesystems with coarse timestamps.
        not_before = int(self.started_wall) * 1_000_000_000
        end = time.monotonic() + hold
        while time.monotonic() < end and not self.cancel.count:
            try:
                if os.stat(path).st_mtime_ns >= not_before:
                    self.sink.note("released")
                    return
            except OSError:
                pass
            time.sleep(min(0.25, max(0.0, end - time.monotonic())))


def release(output_root: str) -> str:
    """Touch the release file; returns its path."""
    os.makedirs(output_root, exist_ok=True)
    path = release_path(output_root)
    with open(path, "a", encoding="utf-8"):
        pass
    os.utime(path, None)
    return path
