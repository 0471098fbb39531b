"""The evaluation logged to MLflow: the job pod's share of ``spec.outputs.mlflow``.

A pure module (no I/O), called by ``podspec.build_pod``. The export itself is
the driver's (``driver.mlflowexport``, in the pod, after lm_eval wrote its
results, with MLflow's own client): this module gives it the tracking URI,
the experiment, the run's name (the job's by default) and its tags, the
user's with the poller's own link back to the job (``lmeval.job.namespace``,
``.name``, ``.uid``: the pod has no API rights and no other way to know
them), and the two things it must read from files:

* the credentials Secret, mounted read-only under ``/opt`` (where no
  fileSecret may be mounted), only its keys ``username``, ``password`` and
  ``token``. Files, not ``secretKeyRef`` variables: a variable of the
  container is inherited by lm_eval and by every process it starts (the
  model's code, task code with allowCodeExecution) and is shown by anything
  that dumps its environment, while the driver reads these files only once
  lm_eval has exited and hands them to MLflow's client in its own process.
  The volume is ``optional``: a Secret without one of the keys (a
  ``kubernetes.io/basic-auth`` one has no ``token``), or no Secret at all,
  still lets the evaluation run, and the driver says what is missing as the
  export's error, which leaves the job Succeeded;
* the server's CA bundle (``caBundle``: one key of a ConfigMap or Secret,
  `trust.ca_volume`), mounted read-only, which the driver adds to the
  image's authorities and the cluster's (``driver.trust``).

Only the job's pod (or, for a sharded job, its merge pod) exports: shard
pods get none of this (``podspec`` asks for it only without a shard index).
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from poller import api
from poller.jobpod import trust

__all__ = [
    "CA_DIR",
    "CA_FILE",
    "CREDENTIALS_DIR",
    "CREDENTIAL_KEYS",
    "JOB_TAGS",
    "ExportOptions",
    "driver_options",
    "mlflow_volumes",
    "run_tags",
]

CREDENTIALS_DIR = "/opt/lmeval/mlflow-credentials"
CA_DIR = "/opt/lmeval/mlflow-ca"
CA_FILE = f"{CA_DIR}/{trust.CA_FILE}"
CREDENTIALS_VOLUME = "mlflow-credentials"
CA_VOLUME = "mlflow-ca"
# The Secret's keys the driver reads (MLflow's MLFLOW_TRACKING_USERNAME,
# MLFLOW_TRACKING_PASSWORD and MLFLOW_TRACKING_TOKEN); no other is mounted.
CREDENTIAL_KEYS = ("username", "password", "token")
# The tags that link a run to its job, set by the poller after the user's.
JOB_TAGS = ("lmeval.job.namespace", "lmeval.job.name", "lmeval.job.uid")


def _mlflow(spec: api.LMEvalJobSpec) -> api.MlflowOutput | None:
    return spec.outputs.mlflow if spec.outputs is not None else None


class ExportOptions(NamedTuple):
    """The driver's --mlflow-* options (``protocol.run_argv``'s mlflow_* arguments)."""

    tracking_uri: str | None = None
    experiment: str | None = None
    run_name: str | None = None
    tags: str | None = None  # a JSON object of strings, one token
    credentials: str | None = None  # a directory of CREDENTIAL_KEYS files
    ca_bundle: str | None = None  # a PEM file


def run_tags(mlflow: api.MlflowOutput, namespace: str, name: str, uid: str) -> dict[str, str]:
    """The run's tags: the spec's, then the job's identity (whose keys the schema
    keeps out of the spec's)."""
    tags = dict(mlflow.tags or {})
    tags.update(zip(JOB_TAGS, (namespace, name, uid), strict=True))
    return tags


def driver_options(spec: api.LMEvalJobSpec, namespace: str, name: str, uid: str) -> ExportOptions:
    """What the driver needs for the export (all None without spec.outputs.mlflow)."""
    mlflow = _mlflow(spec)
    if mlflow is None:
        return ExportOptions()
    tags = run_tags(mlflow, namespace, name, uid)
    return ExportOptions(
        tracking_uri=mlflow.tracking_uri,
        experiment=mlflow.experiment,
        run_name=mlflow.run_name or name,
        # UTF-8 as given: the schema bounds the tags' bytes, not their escapes.
        tags=json.dumps(tags, ensure_ascii=False, sort_keys=True, separators=(",", ":")),
        credentials=CREDENTIALS_DIR if mlflow.credentials_secret is not None else None,
        ca_bundle=CA_FILE if mlflow.ca_bundle is not None else None,
    )


def mlflow_volumes(spec: api.LMEvalJobSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The credentials Secret's and the CA bundle's volumes and their read-only
    mounts (none without them)."""
    mlflow = _mlflow(spec)
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if mlflow is not None and mlflow.credentials_secret is not None:
        volumes.append(
            {
                "name": CREDENTIALS_VOLUME,
                "secret": {
                    "secretName": mlflow.credentials_secret,
                    "items": [{"key": key, "path": key} for key in CREDENTIAL_KEYS],
                    "defaultMode": 0o444,
                    # Missing keys (or Secret) are the export's error, not the pod's.
                    "optional": True,
                },
            }
        )
        mounts.append({"name": CREDENTIALS_VOLUME, "mountPath": CREDENTIALS_DIR, "readOnly": True})
    if mlflow is not None and mlflow.ca_bundle is not None:
        volumes.append(trust.ca_volume(CA_VOLUME, mlflow.ca_bundle))
        mounts.append({"name": CA_VOLUME, "mountPath": CA_DIR, "readOnly": True})
    return volumes, mounts
