"""The LMEvalJob API: what a job reads and where its outputs go.

Custom task sources (ConfigMaps, Git), models and datasets from storage
(``offline``), extra read-only files, the outputs claim, TLS to the model
endpoint and chat options. Re-exported by ``poller.api``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from poller.api import rules
from poller.api.base import (
    DATA_KEY,
    DNS_SUBDOMAIN,
    GIT_COMMIT,
    GIT_REF,
    GIT_URL,
    MOUNT_PATH,
    REPO_PATH,
    TASK_NAME,
    TEXT,
    KeyToPath,
    Quantity,
    SecretKeyRef,
    _Model,
)

__all__ = [
    "CABundle",
    "CABundleSource",
    "ChatTemplate",
    "ConfigMapKeyRef",
    "ConfigMapVolumeRef",
    "CustomTasks",
    "FileConfigMap",
    "GitSource",
    "MlflowOutput",
    "ModelTLS",
    "OciOutput",
    "Offline",
    "OfflineS3",
    "OfflineStorage",
    "Outputs",
    "PvcManaged",
]


class GitSource(_Model):
    """A Git repository of task files, cloned at a pinned commit before the evaluation."""

    url: Annotated[str, Field(pattern=GIT_URL, max_length=2048)] = Field(
        description="Repository URL: https://, or http:// and git:// (unencrypted, so only to "
        "loopback hosts unless the poller setting git-allow-plaintext is true). No user or "
        "password in the URL: use credentialsSecret. At most 2048 characters."
    )
    branch: Annotated[str, Field(pattern=GIT_REF, max_length=255)] | None = Field(
        default=None,
        description="Branch or tag to clone (at most 255 characters, ample for any branch "
        "or tag). Resolved when the pod starts; the commit actually used is recorded in "
        "status.taskSources. With commit, the commit must be on it.",
    )
    commit: Annotated[str, Field(pattern=GIT_COMMIT)] | None = Field(
        default=None,
        description="Full commit hash (40 or 64 hex digits) checked out exactly. Without "
        "branch and commit, the repository's default branch is cloned.",
    )
    path: Annotated[str, Field(pattern=REPO_PATH, max_length=1024)] | None = Field(
        default=None,
        description="Directory inside the repository that holds the task files, at most 1024 "
        "characters (no segment starting with '.'); only it is checked out. The whole "
        "repository when omitted.",
    )
    credentials_secret: Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)] | None = Field(
        default=None,
        description="Secret with a key .git-credentials in git's credential-store format "
        "(https://USER:TOKEN@HOST, one per line), mounted as a file into the clone's "
        "container only and read by git's own store helper. The requester must be allowed "
        "to get it; a name of at most 253 characters.",
    )
    ca_bundle: CABundleSource | None = Field(
        default=None,
        description="Certificate authorities that the clone trusts for an https:// url, "
        "besides the image's own and those of the poller setting trusted-ca-bundles "
        "(an internal Git server's CA). The requester must be allowed to get its "
        "ConfigMap or Secret.",
    )


class CustomTasks(_Model):
    """Task YAML files and their data, from a ConfigMap or a Git repository."""

    config_map: Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)] | None = Field(
        default=None,
        description="ConfigMap (a name of at most 253 characters) whose keys are task YAML "
        "and data files; the requester must be allowed to get it. The pod mounts an "
        "immutable copy owned by the job at /opt/lmeval/tasks/<name>; data_files paths in the "
        "YAML must be absolute under it. Task files that name Python (!function, class, .py "
        "files, templates reaching Python) need allowCodeExecution.",
    )
    git: GitSource | None = Field(
        default=None,
        description="A Git repository, cloned by an init container without API rights into "
        "/opt/lmeval/tasks/git-<i> (i: this entry's index). Its files are not inspected by the "
        "poller, so a Git source needs allowCodeExecution.",
    )


class PvcManaged(_Model):
    """A claim the poller makes for the job's outputs (TrustyAI LMES's outputs.pvcManaged)."""

    size: Quantity = Field(
        description='Requested storage, e.g. "1Gi" (a quantity of at most 64 characters).'
    )
    storage_class_name: Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)] | None = Field(
        default=None,
        description="StorageClass of the claim, at most 253 characters (default: the "
        "cluster's default class).",
    )
    keep: bool | None = Field(
        default=None,
        description="True keeps the claim when the job is deleted: the poller releases it "
        "from the job when the job ends (default: it is deleted with the job, its controller).",
    )


# host[:port]/path: a registry and a repository, no scheme; the path is the
# distribution spec's repository grammar (lower case), the host starts with
# a letter or digit (never '-': the reference reaches a command line).
OCI_REPOSITORY = (
    r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?(:[0-9]{1,5})?"
    r"/[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*(/[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*)*$"
)
OCI_TAG = r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$"
OCI_DIGEST = r"^sha256:[a-f0-9]{64}$"
# Registries plain HTTP may reach: loopback only.
OCI_LOOPBACK = ("127.0.0.1", "localhost")


def _oci_plain_http_problem(oci: OciOutput) -> str | None:
    host = oci.repository.split("/", 1)[0].rsplit(":", 1)[0]
    if oci.plain_http and host not in OCI_LOOPBACK:
        return "plainHTTP is allowed only for a loopback registry (127.0.0.1 or localhost)"
    return None


class OciOutput(_Model):
    """An OCI registry that receives the results as an artifact (TrustyAI LMES's outputs.oci)."""

    repository: Annotated[str, Field(pattern=OCI_REPOSITORY, max_length=512)] = Field(
        description="Registry and repository, host[:port]/path without a scheme, e.g. "
        "registry.example.com/team/evals; at most 512 characters."
    )
    tag: Annotated[str, Field(pattern=OCI_TAG, max_length=128)] | None = Field(
        default=None,
        description="Tag of the artifact, at most 128 characters as the distribution spec "
        "allows (default: <job name>-<8 hex digits of the job's UID>).",
    )
    subject: Annotated[str, Field(pattern=OCI_DIGEST, max_length=71)] | None = Field(
        default=None,
        description="Digest (sha256: and 64 hex digits, 71 characters) of a manifest in the "
        "same repository, e.g. the "
        "evaluated model's: the artifact names it as its OCI 1.1 subject, so that the "
        "registry's referrers of the model list the results.",
    )
    credentials_secret: Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)] | None = Field(
        default=None,
        description="A Secret of type kubernetes.io/dockerconfigjson whose "
        ".dockerconfigjson holds the registry's credentials (Basic, or the credentials "
        "a Bearer token service asks); mounted read-only into the job pod. Anonymous "
        "when omitted. The requester must be allowed to get it; a name of at most 253 "
        "characters.",
    )
    plain_http: bool | None = Field(
        default=None,
        alias="plainHTTP",
        description="Talk plain HTTP instead of HTTPS (default false): only for a loopback "
        "registry (127.0.0.1 or localhost), since it carries credentials and results in the "
        "clear.",
    )
    ca_bundle: CABundleSource | None = Field(
        default=None,
        description="Certificate authorities that the push trusts for the registry, besides "
        "the image's own and those of the poller setting trusted-ca-bundles. The requester "
        "must be allowed to get its ConfigMap or Secret.",
    )
    verify_ssl: bool | None = Field(
        default=None,
        alias="verifySSL",
        description="False skips verifying the registry's certificate (default true); "
        "allowed only when the poller setting allow-insecure-storage-endpoints is true, "
        "otherwise the job ends Failed before any pod exists.",
    )


OciOutputSpec = Annotated[
    OciOutput,
    rules.Cel(
        rule="!has(self.plainHTTP) || !self.plainHTTP || "
        "self.repository.matches('^(127\\\\.0\\\\.0\\\\.1|localhost)(:[0-9]+)?/')",
        message="plainHTTP is allowed only for a loopback registry (127.0.0.1 or localhost)",
        problem=_oci_plain_http_problem,
    ),
]


# An MLflow tracking server: http(s), a host (name, IPv4 or [IPv6]), an optional
# port and path; no user information (credentials come from a Secret), no query
# or fragment (the client appends /api/2.0/... to it and the run's URL starts
# with it).
_URI_LABEL = r"[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?"
_URI_HOST = rf"({_URI_LABEL}([.]{_URI_LABEL})*|\[[0-9A-Fa-f:.]+\])"
MLFLOW_TRACKING_URI = rf"^(https|http)://{_URI_HOST}(:[0-9]{{1,5}})?(/[A-Za-z0-9._~%+:-]+)*/?$"
# A tag key as MLflow allows it (letters, digits, _ - . space / :), at most 250
# characters; not the keys MLflow (mlflow.*) and the poller (lmeval.*) set.
MLFLOW_TAG_KEY = r"^[A-Za-z0-9_][A-Za-z0-9_. /:-]*$"
MLFLOW_TAG_KEY_CHARS_MAX = 250
MLFLOW_TAG_VALUE_CHARS_MAX = 1000
MLFLOW_TAGS_MAX = 64  # as many as the CRD allows any map (lmeval_sandbox.crd)
# Keys and values together (UTF-8): the tags travel as one JSON token of the
# driver's command line, which must stay far below the kernel's 128 KiB.
MLFLOW_TAGS_BYTES_MAX = 16 * 1024
MLFLOW_RESERVED_TAG_PREFIXES = ("mlflow.", "lmeval.")
# Experiment and run names: one line of text.
MLFLOW_NAME = r"^[^\x00-\x1f\x7f-\x{9f}]+$"


def _mlflow_plain_http_problem(mlflow: MlflowOutput) -> str | None:
    scheme, _, rest = mlflow.tracking_uri.partition("://")
    host = rest.split("/", 1)[0].rsplit(":", 1)[0]
    if scheme == "http" and host not in OCI_LOOPBACK:
        return (
            "trackingUri: http:// is allowed only for a loopback server (127.0.0.1 or "
            "localhost), since it carries credentials and results in the clear: use https://"
        )
    return None


def _mlflow_reserved_tags_problem(tags: dict[str, str]) -> str | None:
    keys = [k for k in tags if k.startswith(MLFLOW_RESERVED_TAG_PREFIXES)]
    if keys:
        return (
            "tag keys may not start with mlflow. or lmeval. (set by MLflow and the poller): "
            + ", ".join(keys)
        )
    return None


def _mlflow_tags_size_problem(tags: dict[str, str]) -> str | None:
    size = sum(len(k.encode()) + len(v.encode()) for k, v in tags.items())
    if size > MLFLOW_TAGS_BYTES_MAX:
        return (
            f"tag keys and values may take at most {MLFLOW_TAGS_BYTES_MAX} bytes (UTF-8) "
            f"together; these take {size}"
        )
    return None


MlflowTags = Annotated[
    dict[
        Annotated[str, Field(pattern=MLFLOW_TAG_KEY, max_length=MLFLOW_TAG_KEY_CHARS_MAX)],
        Annotated[str, Field(pattern=TEXT, max_length=MLFLOW_TAG_VALUE_CHARS_MAX)],
    ],
    Field(max_length=MLFLOW_TAGS_MAX),
    rules.Cel(
        rule="!self.exists(k, k.startsWith('mlflow.') || k.startsWith('lmeval.'))",
        message="tag keys may not start with mlflow. or lmeval. (set by MLflow and the poller)",
        problem=_mlflow_reserved_tags_problem,
    ),
    rules.Cel(
        rule=f"self.map(k, size(bytes(k)) + size(bytes(self[k]))).sum() <= {MLFLOW_TAGS_BYTES_MAX}",
        message=f"tag keys and values may take at most {MLFLOW_TAGS_BYTES_MAX} bytes (UTF-8) "
        "together",
        problem=_mlflow_tags_size_problem,
    ),
]


class MlflowOutput(_Model):
    """An MLflow tracking server that receives the evaluation as a run."""

    tracking_uri: Annotated[str, Field(pattern=MLFLOW_TRACKING_URI, max_length=2048)] = Field(
        description="The tracking server's URL, e.g. https://mlflow.example.com or "
        "https://host/mlflow: https://, or http:// to a loopback server only (127.0.0.1 or "
        "localhost); no user, password, query or fragment (credentials come from "
        "credentialsSecret). The server must serve the run's artifacts itself (mlflow "
        "server's default, --serve-artifacts). At most 2048 characters."
    )
    experiment: Annotated[str, Field(pattern=MLFLOW_NAME, max_length=500)] = Field(
        description="Name of the experiment the run is logged in, created when it does not "
        "exist (the credentials must allow that); one line of at most 500 characters."
    )
    run_name: Annotated[str, Field(pattern=MLFLOW_NAME, max_length=250)] | None = Field(
        default=None,
        description="Name of the run, one line of at most 250 characters (default: the "
        "job's name).",
    )
    tags: MlflowTags | None = Field(
        default=None,
        description=f"Tags of the run, at most {MLFLOW_TAGS_MAX}: keys of at most "
        f"{MLFLOW_TAG_KEY_CHARS_MAX} characters (letters, digits, _ - . space / :), not "
        "starting with mlflow. or lmeval.; values of at most "
        f"{MLFLOW_TAG_VALUE_CHARS_MAX} characters, {MLFLOW_TAGS_BYTES_MAX} bytes (UTF-8) in "
        "all. The poller adds lmeval.job.namespace, "
        "lmeval.job.name and lmeval.job.uid, the run's link back to the job.",
    )
    credentials_secret: Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)] | None = Field(
        default=None,
        description="A Secret with the server's credentials, mounted read-only into the job "
        "pod and read by the driver only after lm_eval has exited: keys username and "
        "password (HTTP Basic, e.g. a kubernetes.io/basic-auth Secret; MLflow's "
        "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD), or token (a Bearer token, "
        "MLFLOW_TRACKING_TOKEN). Anonymous when omitted. The requester must be allowed to "
        "get it; a name of at most 253 characters.",
    )
    ca_bundle: CABundleSource | None = Field(
        default=None,
        description="Certificate authorities that the export trusts for an https:// "
        "trackingUri, besides the image's own (an internal server's CA). The requester must "
        "be allowed to get its ConfigMap or Secret.",
    )


MlflowOutputSpec = Annotated[
    MlflowOutput,
    rules.Cel(
        rule="!self.trackingUri.startsWith('http://') || "
        "self.trackingUri.matches('^http://(127[.]0[.]0[.]1|localhost)(:[0-9]+)?(/.*)?$')",
        message="trackingUri: http:// is allowed only for a loopback server (127.0.0.1 or "
        "localhost), since it carries credentials and results in the clear: use https://",
        problem=_mlflow_plain_http_problem,
    ),
]


class Outputs(_Model):
    """Where a job's full outputs go: a claim (named or made for it), an OCI registry
    and an MLflow tracking server."""

    pvc_name: Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)] | None = Field(
        default=None,
        description="PersistentVolumeClaim (a name of at most 253 characters) mounted at "
        "/outputs: it receives lm_eval's run-*/ directories and the complete pod log. The "
        "requester must be allowed to get it and to create pods in the namespace.",
    )
    pvc_managed: PvcManaged | None = Field(
        default=None,
        description="A ReadWriteOnce claim that the poller creates for the outputs, named "
        "<job>-outputs-<hash>, before the pod; the requester must be allowed to create "
        "PersistentVolumeClaims in the namespace. Not with pvcName.",
    )
    oci: OciOutputSpec | None = Field(
        default=None,
        description="Also push the full results and the run's provenance to an OCI "
        "registry, as an artifact (artifactType application/vnd.lmeval.results.v1+json), "
        "from the job pod after the evaluation; status.resultsArtifact names its digest. A "
        "failed push does not fail the job: status says why (resultsArtifactError).",
    )
    mlflow: MlflowOutputSpec | None = Field(
        default=None,
        description="Also log the evaluation to an MLflow tracking server, from the job pod "
        "after the evaluation, with MLflow's own client and the job's credentials: params "
        "(model, redacted model arguments, tasks, few-shot, limit, versions), one metric per "
        "task, metric and filter, the results, per-item scores and provenance as artifacts, "
        "and tags linking the run to the job; status.mlflowRun names the run. A failed "
        "export does not fail the job: status says why (mlflowRunError).",
    )


class OfflineS3(_Model):
    """An S3 prefix copied into the pod before the evaluation (TrustyAI LMES's shape)."""

    access_key_id: SecretKeyRef = Field(description="Secret key holding the access key id.")
    secret_access_key: SecretKeyRef = Field(description="Secret key holding the secret access key.")
    bucket: SecretKeyRef = Field(description="Secret key holding the bucket name.")
    endpoint: SecretKeyRef = Field(
        description="Secret key holding the endpoint URL (http:// or https://, host and port "
        "only; checked by the copy before any request)."
    )
    region: SecretKeyRef | None = Field(
        default=None, description="Secret key holding the region (default us-east-1 when omitted)."
    )
    path: Annotated[str, Field(pattern=r"^([A-Za-z0-9_-][A-Za-z0-9._-]*/?)*$", max_length=1024)] = (
        Field(
            default="",
            description="Prefix copied, a folder of the bucket (default empty: the whole "
            "bucket); at most 1024 characters, S3's limit for a key. Its objects land below "
            "/cache/storage relative to it, so hub/... is the hub cache.",
        )
    )
    verify_ssl: bool | None = Field(
        default=None,
        alias="verifySSL",
        description="False skips verifying the endpoint's certificate (default true); "
        "allowed only when the poller setting allow-insecure-storage-endpoints is true, "
        "otherwise the job ends Failed before any pod exists.",
    )
    ca_bundle: CABundleSource | None = Field(
        default=None,
        description="Certificate authorities that the copy trusts for an https:// endpoint, "
        "besides the image's own and those of the poller setting trusted-ca-bundles. The "
        "requester must be allowed to get its ConfigMap or Secret.",
    )


class OfflineStorage(_Model):
    """Where an offline job finds models and datasets: a claim, or an S3 prefix."""

    pvc_name: Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)] | None = Field(
        default=None,
        description="PersistentVolumeClaim mounted read-only at /cache/storage. Its hub/ "
        "directory is the Hugging Face hub cache (HF_HUB_CACHE, huggingface_hub's layout: "
        "models--ORG--NAME and datasets--ORG--NAME with refs/, snapshots/ and blobs/), so "
        "pretrained=ORG/NAME and a task's dataset_path ORG/NAME load from it; any other "
        "directory can be named by path, e.g. pretrained=/cache/storage/models/NAME. The "
        "job runs offline (HF_HUB_OFFLINE=1, HF_DATASETS_OFFLINE=1) whatever allowOnline "
        "says. The requester must be allowed to get the claim (a name of at most 253 "
        "characters).",
    )
    s3: OfflineS3 | None = Field(
        default=None,
        description="An S3-compatible prefix that an init container (the job's restricted "
        "profile, no API rights) copies into an emptyDir mounted read-only at /cache/storage, "
        "used as a claim would be. The requester must be allowed to get its Secrets.",
    )


class Offline(_Model):
    """Models and datasets from storage, for clusters without internet."""

    storage: Annotated[OfflineStorage, rules.exactly_one_rule("pvcName", "s3")] = Field(
        description="Where the models and datasets are: pvcName or s3."
    )


class ConfigMapVolumeRef(_Model):
    """The ConfigMap of a fileConfigMaps entry and the keys to project."""

    name: Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)] = Field(
        description="ConfigMap name (at most 253 characters, Kubernetes' limit for a name). "
        "The requester must be allowed to get it."
    )
    items: list[KeyToPath] | None = Field(
        default=None, description="Keys to project as files; all keys when omitted."
    )


class FileConfigMap(_Model):
    """A ConfigMap mounted read-only as files in the evaluation container."""

    config_map_ref: ConfigMapVolumeRef = Field(description="The ConfigMap to mount.")
    mount_path: Annotated[
        str, Field(pattern=MOUNT_PATH, max_length=1024), rules.mount_path_rule()
    ] = Field(
        description="Absolute path of the mount, at most 1024 characters; not over code or the "
        "poller's own mounts (the same rules as fileSecrets' mountPath)."
    )


class ConfigMapKeyRef(_Model):
    """One key of a ConfigMap in the job's namespace."""

    name: Annotated[
        str,
        Field(
            pattern=DNS_SUBDOMAIN,
            max_length=253,
            description="ConfigMap name (at most 253 characters, Kubernetes' limit for a "
            "name). The requester must be allowed to get it.",
        ),
    ]
    key: Annotated[
        str,
        Field(
            pattern=DATA_KEY,
            max_length=253,
            description="Key in the ConfigMap (at most 253 characters, Kubernetes' limit for "
            "a data key).",
        ),
    ]


def _one_ca_source(bundle: CABundle) -> str | None:
    if (bundle.config_map_key_ref is None) == (bundle.secret_key_ref is None):
        return "set exactly one of configMapKeyRef and secretKeyRef"
    return None


class CABundle(_Model):
    """PEM certificates of the certificate authorities to trust, from one key."""

    config_map_key_ref: ConfigMapKeyRef | None = Field(
        default=None,
        description="The ConfigMap key that holds the PEM bundle (e.g. an OpenShift service CA "
        "or trusted-ca-bundle ConfigMap).",
    )
    secret_key_ref: SecretKeyRef | None = Field(
        default=None, description="The Secret key that holds the PEM bundle (e.g. ca.crt)."
    )


CABundleSource = Annotated[
    CABundle,
    rules.Cel(
        rule="has(self.configMapKeyRef) != has(self.secretKeyRef)",
        message="set exactly one of configMapKeyRef and secretKeyRef",
        problem=_one_ca_source,
    ),
]


class ModelTLS(_Model):
    """How the evaluation verifies the model endpoint's TLS certificate."""

    ca_bundle: CABundleSource = Field(
        description="Certificate authorities the evaluation trusts for https:// model "
        "endpoints, added to the image's own (system and certifi) authorities. Mounted "
        "read-only; SSL_CERT_FILE and REQUESTS_CA_BUNDLE point lm_eval's HTTP clients "
        "(aiohttp, requests) at the combined bundle."
    )


class ChatTemplate(_Model):
    """lm_eval's --apply_chat_template."""

    enabled: bool = Field(description="Format prompts as chat messages (--apply_chat_template).")
    name: Annotated[str, Field(pattern=TASK_NAME, max_length=128)] | None = Field(
        default=None,
        description="A named chat template of the model's tokenizer "
        "(--apply_chat_template=NAME), a plain word of at most 128 characters; the default "
        "template when omitted.",
    )


def _task_source_problem(entries: list[CustomTasks]) -> str | None:
    wrong = [i for i, t in enumerate(entries) if (t.config_map is None) == (t.git is None)]
    if not wrong:
        return None
    where = ", ".join(f"spec.customTasks[{i}]" for i in wrong)
    return f"each custom task source sets exactly one of configMap and git: {where}"


_ONE_TASK_SOURCE_RULE = rules.Cel(
    rule="self.all(t, has(t.configMap) != has(t.git))",
    message="each custom task source sets exactly one of configMap and git",
    problem=_task_source_problem,
)
