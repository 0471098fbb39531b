"""Log a completed run to an MLflow tracking server (``spec.outputs.mlflow``).

Why this module exists: teams keep their evaluations beside their training
runs in MLflow, and the job pod is the only place that has the results, the
per-item scores and the credentials (the pod has no API rights; the poller
never holds the job's secrets). So the driver logs the run itself, after
lm_eval wrote its results and before the final marker, which reports the
run (or why the export failed: the evaluation is never lost to a failed
export, and the job still succeeds).

It uses MLflow's own client (``mlflow-skinny``, the driver's ``mlflow``
extra), imported only here and only when a job asks, so the driver stays
standard-library only everywhere else. What a run holds:

* **params**: ``model``, ``model_args`` (redacted as the started marker's
  argv is, `driver.argv.redact_argv`), ``tasks``, ``num_fewshot``, ``limit``
  (each only when the command line sets it), ``lm_eval_version`` and
  ``driver_version``; values cut to MLflow's 6000 characters;
* **metrics**: one per task, metric and filter of the results' ``results``
  section, stderr included as a metric of its own (`metric_key`), numbers
  only (lm_eval writes ``"N/A"`` for a stderr it could not compute);
* **tags**: the job's (the poller passes the spec's and ``lmeval.job.*``,
  the run's link back to its LMEvalJob) and ``lmeval.run_id``;
* **artifacts**: ``results.json`` (lm_eval's results with secrets hidden in
  its echo of the configuration, as the poller stores them), ``items.json``
  (the per-item scores, when lm_eval logged samples) and
  ``provenance.json`` (the run's provenance, as pushed to OCI).

Credentials are files (``username`` and ``password``, or ``token``) read
only now that lm_eval has exited, and handed to the client through its own
variables (``MLFLOW_TRACKING_USERNAME``...) in the driver's process, never
a child's. An https:// server is verified against the image's authorities,
the cluster's CA bundles and the server's own (``caBundle``), through
`driver.trust`'s combined file (MLflow's client takes one). MLflow's client
prints run links and logs warnings: its output is captured while it works
(the driver's stdout is the marker channel), and its requests are bounded
(`HTTP_SETTINGS`) so a server that is down costs seconds, not minutes.

Metric keys (`metric_key`): lm_eval names a score ``<metric>,<filter>``
(``acc,none``, ``exact_match,strict-match``), and MLflow allows letters,
digits, ``_ - . space / :`` in a key. The key is ``<task>/<metric>/<filter>``
(``<task>/<metric>`` for a name without a filter); in each part every other
character (a comma, a slash) becomes ``_``, and a key over 250 characters
keeps its first 241 and ``-`` and 8 hex digits of the whole key's sha256.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from driver import trust
from driver.argv import redact_argv, redact_json

if TYPE_CHECKING:
    from driver.payloads import FinalDetails

__all__ = [
    "CA_FIELD",
    "CREDENTIALS_FIELD",
    "HTTP_SETTINGS",
    "MAX_ERROR_CHARS",
    "MAX_METRICS",
    "WHERE",
    "ExportRequest",
    "MlflowExportError",
    "credentials_env",
    "export_run",
    "metric_key",
    "metrics_of",
    "params_of",
    "results_without_secrets",
    "run_url",
]

WHERE = "spec.outputs.mlflow"
CA_FIELD = f"{WHERE}.caBundle"
CREDENTIALS_FIELD = f"{WHERE}.credentialsSecret"
# What the final marker's mlflow_error holds at most (the server's words included).
MAX_ERROR_CHARS = 1000
# MLflow's own limits: a param value, a metric key.
MAX_PARAM_CHARS = 6000
MAX_KEY_CHARS = 250
# A results file of thousands of tasks logs at most this many metrics.
MAX_METRICS = 10_000
# The client's requests: a server that is down or hangs fails the export in
# about a minute at most per request, instead of MLflow's defaults (7 retries
# with exponential backoff, 120 s per request). Also: no telemetry (the pod
# may be air-gapped, and the job's author did not ask for it), no run links
# printed, no logging set up by MLflow (its output is captured anyway).
HTTP_SETTINGS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
    "MLFLOW_CONFIGURE_LOGGING": "false",
}
# The client's credential variables; the job's credentials replace any of them.
CREDENTIAL_ENV = {
    "username": "MLFLOW_TRACKING_USERNAME",
    "password": "MLFLOW_TRACKING_PASSWORD",
    "token": "MLFLOW_TRACKING_TOKEN",
}
CERT_ENV = "MLFLOW_TRACKING_SERVER_CERT_PATH"
# lm_eval's options logged as params, by the name MLflow shows.
PARAM_FLAGS = {
    "--model": "model",
    "--model_args": "model_args",
    "--tasks": "tasks",
    "--num_fewshot": "num_fewshot",
    "--limit": "limit",
}
_KEY_CHAR = re.compile(r"[^A-Za-z0-9_.\- :]")


class MlflowExportError(Exception):
    """The export failed; the message says why, naming the field to fix when it is the job's."""


class ExportRequest(NamedTuple):
    """What the job asked (the driver's --mlflow-* options)."""

    tracking_uri: str
    experiment: str
    run_name: str | None = None
    tags: str | None = None  # a JSON object of strings
    credentials: str | None = None  # a directory of username, password, token files
    ca_bundle: str | None = None  # a PEM file


def metric_key(task: str, name: str) -> str:
    """The MLflow key of lm_eval's score `name` (``acc,none``) of `task` (see the module doc)."""
    metric, comma, filter_name = name.partition(",")
    parts = [task, metric, filter_name] if comma else [task, metric]
    key = "/".join(_KEY_CHAR.sub("_", part) for part in parts)
    if len(key) > MAX_KEY_CHARS:
        digest = hashlib.sha256(key.encode()).hexdigest()[:8]
        key = f"{key[: MAX_KEY_CHARS - 9]}-{digest}"
    return key


def metrics_of(results: Mapping[str, Any]) -> dict[str, float]:
    """Every finite number of the results' ``results`` section, by `metric_key`
    (in the file's order, at most MAX_METRICS)."""
    found: dict[str, float] = {}
    scores = results.get("results")
    for task, entry in (scores if isinstance(scores, dict) else {}).items():
        if not isinstance(task, str) or not isinstance(entry, dict):
            continue
        for name, value in entry.items():
            if not isinstance(name, str) or isinstance(value, bool):
                continue
            if not isinstance(value, int | float) or not math.isfinite(value):
                continue  # "alias", "N/A" stderrs, NaN
            if len(found) >= MAX_METRICS:
                return found
            found.setdefault(metric_key(task, name), float(value))
    return found


def params_of(child_argv: Sequence[str], versions: Mapping[str, str | None]) -> dict[str, str]:
    """The run's params: lm_eval's options of `child_argv` (secrets redacted) and `versions`."""
    params: dict[str, str] = {}
    argv = redact_argv(child_argv)
    for index, token in enumerate(argv):
        flag, eq, value = token.partition("=")
        if flag not in PARAM_FLAGS:
            continue
        if not eq:  # --flag value
            if index + 1 >= len(argv) or argv[index + 1].startswith("--"):
                continue
            value = argv[index + 1]
        params[PARAM_FLAGS[flag]] = value
    for name, version in versions.items():
        if version:
            params[name] = version
    return {
        name: value if len(value) <= MAX_PARAM_CHARS else value[: MAX_PARAM_CHARS - 3] + "..."
        for name, value in params.items()
    }


def results_without_secrets(results: Mapping[str, Any]) -> dict[str, Any]:
    """lm_eval's results with secrets hidden in its echo of the configuration
    (``config``: model_args; ``configs``: dataset URLs), as the poller stores them;
    scores untouched (a metric called ``token_f1`` is not a secret)."""
    cleaned = dict(results)
    for section in ("config", "configs"):
        if section in cleaned:
            cleaned[section] = redact_json(cleaned[section])
    return cleaned


def run_url(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    """The run's page, as MLflow's own client prints it."""
    return f"{tracking_uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"


def _tags(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    try:
        tags = json.loads(text)
    except ValueError as exc:
        raise MlflowExportError(f"{WHERE}.tags: not a JSON object: {exc}") from None
    if not isinstance(tags, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in tags.items()
    ):
        raise MlflowExportError(f"{WHERE}.tags: not a JSON object of strings")
    return tags


def _read_secret(directory: str, key: str) -> str | None:
    try:
        with open(os.path.join(directory, key), encoding="utf-8") as handle:
            value = handle.read()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise MlflowExportError(f"{CREDENTIALS_FIELD}: cannot read its key {key}: {exc}") from None
    # A file made by `kubectl create secret --from-file` often ends in a newline.
    value = value.rstrip("\r\n")
    return value or None


def credentials_env(directory: str | None) -> dict[str, str]:
    """MLflow's credential variables from the Secret's files (none without a Secret)."""
    if directory is None:
        return {}
    found = {key: _read_secret(directory, key) for key in CREDENTIAL_ENV}
    if found["token"] is not None:
        return {CREDENTIAL_ENV["token"]: found["token"]}
    if found["username"] is not None and found["password"] is not None:
        return {
            CREDENTIAL_ENV["username"]: found["username"],
            CREDENTIAL_ENV["password"]: found["password"],
        }
    if found["username"] is not None or found["password"] is not None:
        missing = "password" if found["password"] is None else "username"
        raise MlflowExportError(
            f"{CREDENTIALS_FIELD}: the Secret has no key {missing} (HTTP Basic needs both "
            "username and password)"
        )
    raise MlflowExportError(
        f"{CREDENTIALS_FIELD}: the Secret has none of the keys token, username and password "
        "(or does not exist in the job's namespace)"
    )


@contextlib.contextmanager
def _environment(values: Mapping[str, str], cleared: Sequence[str]) -> Iterator[None]:
    """`values` set and `cleared` unset in os.environ (where MLflow's client reads
    them) for the export only."""
    names = {*values, *cleared}
    before = {name: os.environ.get(name) for name in names}
    try:
        for name in cleared:
            os.environ.pop(name, None)
        os.environ.update(values)
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _bounded(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def _describe(exc: BaseException) -> str:
    """What status says of a failed client call: the server's or the client's words."""
    untrusted = trust.untrusted_message(WHERE, "the tracking server", exc)
    if untrusted is None and "CERTIFICATE_VERIFY_FAILED" in str(exc):
        untrusted = (
            f"{WHERE}: the tracking server's certificate is not trusted ({exc}): give its "
            f"CA in {CA_FIELD}, or ask for it in the poller setting {trust.SETTING}"
        )
    if untrusted is not None:
        return untrusted
    name = type(exc).__name__
    text = str(exc) or name
    return text if name == "MlflowException" else f"{name}: {text}"


class _Artifacts:
    """The run's artifact files, written into a directory of their own."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.files: list[str] = []

    def write(self, name: str, data: bytes) -> None:
        path = os.path.join(self.directory, name)
        with open(path, "wb") as handle:
            handle.write(data)
        self.files.append(path)

    def copy(self, name: str, source: str) -> None:
        path = os.path.join(self.directory, name)
        shutil.copyfile(source, path)
        self.files.append(path)


def _experiment_id(client: Any, name: str) -> str:
    """The experiment named `name`, made when missing (by this run or a concurrent one)."""
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            return str(client.create_experiment(name))
        except MlflowException as exc:
            if getattr(exc, "error_code", None) != "RESOURCE_ALREADY_EXISTS":
                raise
            experiment = client.get_experiment_by_name(name)  # made meanwhile
            if experiment is None:
                raise
    if experiment.lifecycle_stage == "deleted":
        raise MlflowExportError(
            f"{WHERE}.experiment: experiment {name!r} is deleted on the tracking server "
            "(restore it, or name another)"
        )
    return str(experiment.experiment_id)


def _log(
    request: ExportRequest,
    tags: dict[str, str],
    params: dict[str, str],
    metrics: dict[str, float],
    artifacts: _Artifacts,
) -> tuple[str, str]:
    """Log the run with MLflow's client: (experiment id, run id)."""
    try:
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient
    except ImportError as exc:
        raise MlflowExportError(
            "MLflow's client library is not installed in the job image (the driver's mlflow "
            f"extra, lmeval-driver[mlflow], installs mlflow-skinny): {exc}"
        ) from None
    client = MlflowClient(tracking_uri=request.tracking_uri)
    experiment_id = _experiment_id(client, request.experiment)
    run = client.create_run(experiment_id, run_name=request.run_name, tags=tags)
    run_id = str(run.info.run_id)
    try:
        stamp = int(time.time() * 1000)
        client.log_batch(
            run_id,
            metrics=[Metric(key, value, stamp, 0) for key, value in metrics.items()],
            params=[Param(key, value) for key, value in params.items()],
        )
        for path in artifacts.files:
            client.log_artifact(run_id, path)
        client.set_terminated(run_id, "FINISHED")
    except Exception as exc:
        with contextlib.suppress(Exception):  # the run is not left RUNNING
            client.set_terminated(run_id, "FAILED")
        raise _PartialRun(run_id, exc) from exc
    return experiment_id, run_id


class _PartialRun(Exception):
    """The run was made, but logging into it failed."""

    def __init__(self, run_id: str, cause: BaseException) -> None:
        super().__init__(run_id)
        self.run_id, self.cause = run_id, cause


def export_run(
    request: ExportRequest,
    results_raw: bytes,
    *,
    child_argv: Sequence[str],
    versions: Mapping[str, str | None],
    run_id: str,
    provenance: bytes,
    items_path: str | None,
    temp_dir: str,
    note: Callable[[str], None],
) -> FinalDetails:
    """Log the completed run; its mlflow_* final marker fields. Never raises.

    `results_raw`: lm_eval's results file; `child_argv`: lm_eval's command line
    (redacted here); `versions`: lm_eval_version and driver_version; `run_id`:
    the driver's; `provenance`: the provenance JSON; `items_path`: the per-item
    scores file, if any; `note`: the driver's diagnostics (captured client output).
    """
    captured = io.StringIO()
    try:
        with contextlib.ExitStack() as stack:
            work = tempfile.mkdtemp(prefix="lmeval-mlflow-", dir=temp_dir)
            stack.callback(shutil.rmtree, work, True)
            values = dict(HTTP_SETTINGS)
            values.update(credentials_env(request.credentials))
            if request.tracking_uri.startswith("https://"):
                bundle, problem = trust.combined_bundle(
                    request.ca_bundle, work, "mlflow", CA_FIELD, note=note
                )
                if bundle is None:
                    raise MlflowExportError(problem or f"{CA_FIELD}: unusable")
                values[CERT_ENV] = bundle
            cleared = [CERT_ENV] if CERT_ENV not in values else []
            if request.credentials is not None:  # the job's credentials, and only them
                cleared += [name for name in CREDENTIAL_ENV.values() if name not in values]
            tags = {**_tags(request.tags), "lmeval.run_id": run_id}
            results = json.loads(results_raw)
            if not isinstance(results, dict):
                raise MlflowExportError("the results file is not a JSON object")
            artifacts = _Artifacts(work)
            artifacts.write(
                "results.json",
                json.dumps(results_without_secrets(results), indent=2).encode(),
            )
            if items_path is not None and os.path.isfile(items_path):
                artifacts.copy("items.json", items_path)
            artifacts.write("provenance.json", provenance)
            params = params_of(child_argv, versions)
            metrics = metrics_of(results)
            stack.enter_context(_environment(values, cleared))
            stack.enter_context(contextlib.redirect_stdout(captured))
            stack.enter_context(contextlib.redirect_stderr(captured))
            experiment_id, mlflow_run = _log(request, tags, params, metrics, artifacts)
    except MlflowExportError as exc:
        return _failed(str(exc), captured, note)
    except _PartialRun as exc:
        message = _describe(exc.cause)
        return _failed(f"run {exc.run_id} is incomplete: {message}", captured, note)
    except Exception as exc:  # the evaluation is not lost to a failed export
        return _failed(_describe(exc), captured, note)
    _replay(captured, note)
    url = run_url(request.tracking_uri, experiment_id, mlflow_run)
    note(f"run logged to MLflow: {url} ({len(metrics)} metrics, {len(params)} params)")
    return {
        "mlflow_run_id": mlflow_run,
        "mlflow_run_url": url,
        "mlflow_experiment_id": experiment_id,
    }


def _replay(captured: io.StringIO, note: Callable[[str], None]) -> None:
    """The client's own output, as the driver's notes (the last lines, each cut)."""
    lines = [line.strip() for line in captured.getvalue().splitlines() if line.strip()]
    for line in lines[-10:]:
        note(f"mlflow: {line[:300]}")


def _failed(message: str, captured: io.StringIO, note: Callable[[str], None]) -> FinalDetails:
    _replay(captured, note)
    message = _bounded(message)
    note(f"logging the run to MLflow failed: {message}")
    return {"mlflow_error": message}
