"""What a run is asked to do, and everything the driver makes ready before lm_eval starts.

Why this module exists: before the child can start, the driver checks the
command line it was given, creates the run's own directory, opens the log
copy, and builds what the child's environment and working directory need:
Python's safe-path switch, always (lm_eval imports nothing from its working
directory), and, when asked for, the TLS trust bundle for the model endpoint
(:mod:`driver.trust`), the Git task sources' commits (:mod:`driver.provenance`)
and the view of the Hugging Face hub cache's datasets for offline runs
(:mod:`driver.hubview`). Each of these steps may refuse the run with a driver
error before any child exists.
They are kept apart from :mod:`driver.run`, which supervises the running
child and reports its fate, so that module stays about the run.

A :class:`Preparation` is filled in step by step, and the run reads it even
when a step fails: what the earlier steps made still counts (the task
sources go into the ``failed`` marker, which also reaches the log copy; the
datasets view is removed with the run).

Import discipline, as in :mod:`driver.run`: the child should start fast, so
``tempfile`` and the trust and hub view modules are imported only when a run
asks for what they do.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, BinaryIO

from driver.argv import find_output_path_flag, valid_run_id
from driver.child import Sink
from driver.contract import (
    DRIVER_PROGRAM,
    END_OF_OPTIONS,
    ENV_CA_BUNDLE,
    ENV_CLUSTER_CA_BUNDLES,
    ENV_SAFE_PATH,
    OPT_OUTPUT_ROOT,
)
from driver.provenance import read_task_sources

if TYPE_CHECKING:  # the protocol module is imported once the child runs
    from driver.protocol import TaskSourceFields

__all__ = ["DEFAULT_OUTPUT_ROOT", "Preparation", "RunOptions"]

DEFAULT_OUTPUT_ROOT = "/tmp/lmeval-output"  # noqa: S108 - an emptyDir in the pod
# The datasets view lists this many names in its note; a cache may hold hundreds.
SHOWN_DATASETS = 20


def _shown(names: list[str]) -> str:
    """At most SHOWN_DATASETS of `names`, for a note."""
    return ", ".join(names[:SHOWN_DATASETS]) + (", ..." if len(names) > SHOWN_DATASETS else "")


class RunOptions:
    """The driver's options for one run (parsed by ``driver.__main__``)."""

    def __init__(
        self,
        child_argv: Sequence[str],
        output_root: str = DEFAULT_OUTPUT_ROOT,
        progress_interval: float = 5.0,
        grace_period: float = 20.0,
        log_copy: str | None = None,
        hold_seconds: float = 0.0,
        run_id: str | None = None,
        task_sources: str | None = None,
        hub_datasets: str | None = None,
        oci_push: str | None = None,
        oci_subject: str | None = None,
        oci_auth: str | None = None,
        oci_plain_http: bool = False,
        oci_ca_bundle: str | None = None,
        oci_verify_tls: bool = True,
        mlflow_tracking_uri: str | None = None,
        mlflow_experiment: str = "Default",
        mlflow_run_name: str | None = None,
        mlflow_tags: str | None = None,
        mlflow_credentials: str | None = None,
        mlflow_ca_bundle: str | None = None,
    ) -> None:
        self.child_argv = list(child_argv)
        self.output_root = output_root
        self.progress_interval = progress_interval
        self.grace_period = grace_period
        self.log_copy = log_copy
        self.hold_seconds = hold_seconds
        self.run_id = run_id
        self.task_sources = task_sources
        self.hub_datasets = hub_datasets
        self.oci_push = oci_push
        self.oci_subject = oci_subject
        self.oci_auth = oci_auth
        self.oci_plain_http = oci_plain_http
        self.oci_ca_bundle = oci_ca_bundle
        self.oci_verify_tls = oci_verify_tls
        self.mlflow_tracking_uri = mlflow_tracking_uri
        self.mlflow_experiment = mlflow_experiment
        self.mlflow_run_name = mlflow_run_name
        self.mlflow_tags = mlflow_tags
        self.mlflow_credentials = mlflow_credentials
        self.mlflow_ca_bundle = mlflow_ca_bundle


class Preparation:
    """What the steps before the child leave for the run, filled in as they succeed.

    ``sink`` starts as the driver's stdout and stderr and, once the log copy
    is open, copies to it as well; the run writes every marker through it.
    """

    def __init__(
        self,
        opts: RunOptions,
        run_id: str,
        run_dir: str,
        stdout_fd: int = 1,
        stderr_fd: int = 2,
    ) -> None:
        self.opts = opts
        self.run_id = run_id
        self.run_dir = run_dir
        self._stdout_fd, self._stderr_fd = stdout_fd, stderr_fd
        self.sink = Sink(stdout_fd, stderr_fd)
        self.log_copy: BinaryIO | None = None  # closed by the run, at its very end
        # The driver's own, with Python's safe-path switch whatever the child's
        # argv says: lm_eval's working directory may be the view of a shared
        # cache (--hub-datasets), and nothing there may be imported.
        self.child_env: dict[str, str] = {**os.environ, ENV_SAFE_PATH: "1"}
        self.task_sources: list[TaskSourceFields] | None = None  # with --task-sources
        self.child_cwd: str | None = None  # --hub-datasets: the view of the cache

    def prepare(self) -> str | None:
        """Check the command line and make ready what the child needs: the first problem, if any."""
        argv = self.opts.child_argv
        if not argv:
            return (
                f"no lm_eval command given (expected: {DRIVER_PROGRAM} [options] "
                f"{END_OF_OPTIONS} <command>)"
            )
        token = find_output_path_flag(argv[1:])
        if token is not None:
            return (
                f"the command sets the output path ({token!r}); the driver owns it "
                f"({OPT_OUTPUT_ROOT}, per-run directory run-<id>): remove it"
            )
        if not valid_run_id(self.run_id):
            return f"invalid run id {self.run_id!r}"
        if self.opts.task_sources is not None:
            sources = read_task_sources(self.opts.task_sources)
            if isinstance(sources, str):
                return sources
            self.task_sources = sources
        try:
            os.makedirs(self.opts.output_root, exist_ok=True)
            os.mkdir(self.run_dir)
        except FileExistsError:
            return f"run directory {self.run_dir} already exists (run ids must be unique)"
        except OSError as exc:
            return f"cannot create run directory {self.run_dir}: {exc}"
        if self.opts.log_copy:
            try:
                parent = os.path.dirname(os.path.abspath(self.opts.log_copy))
                os.makedirs(parent, exist_ok=True)
                self.log_copy = open(self.opts.log_copy, "ab")  # noqa: SIM115 - closed by the run
            except OSError as exc:
                return f"cannot open log copy {self.opts.log_copy}: {exc}"
            self.sink = Sink(self._stdout_fd, self._stderr_fd, self.log_copy)
        if problem := self._trust():
            return problem
        if self.opts.hub_datasets:
            return self._hub_view(self.opts.hub_datasets)
        return None

    def _trust(self) -> str | None:
        """lm_eval's trust store (the model endpoint's CA and the cluster's bundles
        added to the image's), and the registry's CA checked before the run spends
        its evaluation: the first problem, naming its field."""
        model_ca = os.environ.get(ENV_CA_BUNDLE) or None
        cluster = bool(os.environ.get(ENV_CLUSTER_CA_BUNDLES))
        registry_ca = self.opts.oci_ca_bundle if self.opts.oci_push else None
        if model_ca is None and not cluster and registry_ca is None:
            return None
        from driver import trust

        if model_ca is not None or cluster:
            temp = os.environ.get("TMPDIR") or "/tmp"  # noqa: S108 - an emptyDir in the pod
            bundle, problem = trust.combined_bundle(
                model_ca, temp, self.run_id, note=self.sink.note
            )
            if bundle is None:
                return problem
            self.child_env = trust.child_env(bundle, self.child_env)
        if registry_ca is not None:
            from driver.ocipush import CA_FIELD

            return trust.check_bundle(registry_ca, CA_FIELD)
        return None

    def _hub_view(self, hub_cache: str) -> str | None:
        """lm_eval's working directory: the hub cache's datasets as ORG/NAME."""
        import tempfile

        from driver.hubview import build_view

        try:
            # Set before the view is built: a half-built one is removed with the run.
            self.child_cwd = tempfile.mkdtemp(prefix="lmeval-hub-datasets-")
            view = build_view(hub_cache, self.child_cwd)
        except OSError as exc:
            return f"cannot expose the datasets of {hub_cache}: {exc}"
        self.sink.note(
            f"{len(view.names)} dataset(s) of {hub_cache} exposed: {_shown(view.names) or 'none'}"
        )
        if view.refused:
            self.sink.note(
                f"{len(view.refused)} repository(ies) of {hub_cache} not exposed, because they "
                f"hold Python code, not data: {_shown(view.refused)}"
            )
        return None

    def remove_view(self) -> None:
        """Remove the datasets view, if one was made (it holds symlinks only)."""
        if self.child_cwd is not None:
            import shutil

            shutil.rmtree(self.child_cwd, ignore_errors=True)
