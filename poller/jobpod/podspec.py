"""Build the job pod for an LMEvalJob: a pure function of the job and settings.

The pod is where least privilege is decided, so it is built by construction
rather than patched afterwards: the restricted Pod Security profile (non-root,
no privilege escalation, every capability dropped, RuntimeDefault seccomp, a
read-only root filesystem with emptyDirs for the few writable paths), a
service account without rights and without a mounted token, and an lm_eval
command line assembled as an argv list (`poller.jobpod.argv`: every option a
single ``--flag=value`` token). Every string of the containers the poller
builds reaches the process literally: the kubelet's ``$(VAR)`` expansion is
escaped once, for all of them (`kubelet_literal`).

The pod name is derived from the job (name plus a short hash of its UID), so
creating it twice is harmless: the second create meets AlreadyExists and the
poller adopts the pod it already made. Custom-task ConfigMaps are mounted
through the job's immutable snapshots (`task_snapshot_name`), which the
poller makes before the pod.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from driver import protocol
from poller import api
from poller.api.rules import (
    CODE_EVAL_ENV,
    OFFLINE_ENV,
    env_name_problem,
    node_env_name_problem,
)
from poller.api.settings import Settings
from poller.jobpod import gittasks, mlflowoutput, modeltls, ocioutput, offline, trust
from poller.jobpod.argv import CUSTOM_TASKS_ROOT, JobPodError, lm_eval_argv, resources_for

__all__ = [
    "CUSTOM_TASKS_ROOT",
    "DRIVER_MOUNT",
    "LABEL_JOB_NAME",
    "LABEL_JOB_UID",
    "LABEL_MANAGED_BY",
    "MAIN_CONTAINER",
    "MANAGED_BY",
    "POD_TMP",
    "JobPodError",
    "build_pod",
    "driver_command",
    "driver_init_container",
    "kubelet_literal",
    "kubelet_literal_container",
    "lm_eval_argv",
    "managed_claim",
    "outputs_location",
    "placement",
    "pod_name",
    "resources_for",
    "restricted_container_context",
    "shard_count",
    "shard_pod_name",
    "shard_root",
    "task_snapshot_name",
    "uid_range_start",
]

MANAGED_BY = "lmeval-poller"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_JOB_NAME = f"{api.API_GROUP}/job-name"
LABEL_JOB_UID = f"{api.API_GROUP}/job-uid"
# A shard pod's index (spec.parallelism above 1): the merge pod has none.
LABEL_SHARD = f"{api.API_GROUP}/shard"
MAIN_CONTAINER = "lmeval"

OUTPUT_ROOT = "/outputs"
HF_HOME = "/cache/huggingface"
DRIVER_MOUNT = "/opt/lmeval-driver"
# Where the driver image keeps the `driver` package (see the Dockerfile).
DRIVER_IMAGE_SOURCE = "/opt/lmeval/driver"
# The driver must finish reporting before the kubelet's SIGKILL.
TERMINATION_GRACE_SECONDS = 30
DRIVER_GRACE_SECONDS = 20
# Exec mode: how long the driver holds its container for the poller to copy
# the results (the poller releases it as soon as it has them).
EXEC_HOLD_SECONDS = 300

_NAME_LIMIT = 63
# A ConfigMap's name is a DNS subdomain: at most 253 characters.
_CONFIGMAP_NAME_LIMIT = 253
# The container's own /tmp, an emptyDir (the root filesystem is read-only).
POD_TMP = "/tmp"  # noqa: S108


def pod_name(job_name: str, job_uid: str) -> str:
    """Deterministic pod name: the job's name (cut) plus 6 hex of its UID."""
    return _named(job_name, f"-{_uid_suffix(job_uid)}")


def _uid_suffix(job_uid: str) -> str:
    return hashlib.sha256(job_uid.encode()).hexdigest()[:6]


def _named(job_name: str, tail: str) -> str:
    """The job's name, cut so that with `tail` it fits a pod name."""
    return f"{job_name[: _NAME_LIMIT - len(tail)].rstrip('-.')}{tail}"


def shard_pod_name(job_name: str, job_uid: str, index: int) -> str:
    """Deterministic name of shard `index`'s pods: the job's pod name plus ``-shard-<index>``."""
    return _named(job_name, f"-{_uid_suffix(job_uid)}-shard-{index}")


def shard_count(spec: api.LMEvalJobSpec) -> int:
    """How many shards the job runs (1: no shards, one pod and no merge)."""
    return spec.parallelism or 1


def shard_root(job_name: str) -> str:
    """Where a sharded job's shards keep their outputs and response caches, on its claim.

    Named after the job, not its UID: a job submitted again under the same
    name (after a failure) finds its shards' caches and resumes, and the
    driver starts a cache clean when what it was made for changed
    (`driver.shards`, cache.json).
    """
    return f"{OUTPUT_ROOT}/shards/{job_name}"


def task_snapshot_name(job_name: str, job_uid: str, source: str) -> str:
    """The immutable copy of custom-task ConfigMap `source` that a job's pod mounts.

    Readable stem (job and source names, cut) plus 10 hex of a hash of the
    job's UID and the source, so two jobs, or one job's sources, never share one.
    """
    suffix = hashlib.sha256(f"{job_uid}/{source}".encode()).hexdigest()[:10]
    stem = f"{job_name}-{source}"[: _CONFIGMAP_NAME_LIMIT - len(suffix) - len("-tasks-")]
    return f"{stem.rstrip('-.')}-tasks-{suffix}"


def _label_value(text: str) -> str:
    value = re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:63]
    return value.strip("-_.")


def kubelet_literal(text: str) -> str:
    """`text` as the kubelet will pass it on, whatever ``$(NAME)`` it holds.

    The kubelet expands ``$(NAME)`` in a container's command, args and env
    values (a defined NAME becomes its value, ``$$`` becomes ``$``, anything
    else stays): a spec value holding ``$(X)`` would take X's value, another
    variable of the container. Doubling every ``$`` is the one escape that
    holds: escaping only ``$(`` would turn ``a$$(X)`` into ``a$$$(X)``, which
    the kubelet reads as ``a$`` and an expansion.
    """
    return text.replace("$", "$$")


def kubelet_literal_container(container: dict[str, Any]) -> dict[str, Any]:
    """`container` with its command, args and env values escaped for the kubelet
    (`kubelet_literal`): applied once, to every container the poller builds."""
    escaped = dict(container)
    for key in ("command", "args"):
        if key in escaped:
            escaped[key] = [kubelet_literal(word) for word in escaped[key]]
    if "env" in escaped:
        escaped["env"] = [
            {**item, "value": kubelet_literal(item["value"])} if "value" in item else item
            for item in escaped["env"]
        ]
    return escaped


def restricted_container_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _env(
    spec: api.LMEvalJobSpec, settings: Settings, use_copied_driver: bool
) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "HOME", "value": POD_TMP},
        {"name": "HF_HOME", "value": HF_HOME},
        {"name": protocol.ENV_OUTPUT_ROOT, "value": OUTPUT_ROOT},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        # No Python of the container (the driver, lm_eval, whatever they start)
        # puts its working directory first on sys.path; the driver sets it for
        # lm_eval again, and lm_eval runs with -P as well.
        {"name": protocol.ENV_SAFE_PATH, "value": "1"},
    ]
    if spec.allow_code_execution:
        # lm_eval_argv refused the job already if the settings do not allow code.
        env.append({"name": CODE_EVAL_ENV, "value": "1"})
    if use_copied_driver:
        env.append({"name": "PYTHONPATH", "value": DRIVER_MOUNT})
    if not (spec.allow_online and settings.allow_online) or offline.forces_offline(spec):
        env += [{"name": name, "value": "1"} for name in OFFLINE_ENV]
    env += offline.storage_env(spec)
    # The schema refuses these names already (specrules holds the one list);
    # checked again here because the pod is where they would take effect.
    for item in (spec.pod.env if spec.pod else None) or []:
        if problem := env_name_problem(item.name):
            raise JobPodError(f"spec.pod.env: {problem}")
        env.append({"name": item.name, "value": item.value})
    for secret in spec.env_secrets or []:
        if problem := env_name_problem(secret.env):
            raise JobPodError(f"spec.envSecrets: {problem}")
        env.append(
            {
                "name": secret.env,
                "valueFrom": {
                    "secretKeyRef": {"name": secret.secret_ref.name, "key": secret.secret_ref.key}
                },
            }
        )
    return env


def outputs_location(spec: api.LMEvalJobSpec, name: str, uid: str) -> str | None:
    """Where a job's full outputs go, as status reports it (None: only in the pod)."""
    claim = offline.outputs_claim(spec, name, uid)
    if claim is None:
        return None
    return (
        f"PersistentVolumeClaim {claim}: run-*/ (lm_eval outputs) and "
        f"{pod_name(name, uid)}.log (the complete log)"
    )


def managed_claim(
    name: str, namespace: str, uid: str, spec: api.LMEvalJobSpec
) -> dict[str, Any] | None:
    """The outputs claim the poller makes before the pod (outputs.pvcManaged), or None."""
    labels = {
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_JOB_NAME: _label_value(name),
        LABEL_JOB_UID: uid,
    }
    return offline.managed_claim(spec, name, namespace, uid, labels)


def uid_range_start(annotation: str | None) -> int | None:
    """The first UID of an ``openshift.io/sa.scc.uid-range`` value ("1000680000/10000")."""
    if not annotation:
        return None
    first = annotation.split("/", 1)[0].strip()
    return int(first) if first.isdigit() and int(first) > 0 else None


def _pod_security_context(run_as_user: int | None) -> dict[str, Any]:
    context: dict[str, Any] = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    if run_as_user is not None:
        # The restricted SCC admits exactly the namespace's range; group 0 is
        # what images built for arbitrary UIDs rely on.
        context.update(runAsUser=run_as_user, runAsGroup=0, fsGroup=run_as_user)
    return context


def driver_command(settings: Settings) -> list[str]:
    """How the job container invokes the driver (also for `release` through exec)."""
    # A driver copied from the driver image runs as a module of the pod's Python.
    return protocol.driver_command("python" if settings.driver_image else None)


def _sidecars(spec: api.LMEvalJobSpec) -> list[dict[str, Any]]:
    containers: list[dict[str, Any]] = []
    for sidecar in (spec.pod.sidecars if spec.pod else None) or []:
        if sidecar.name in (MAIN_CONTAINER, "install-driver") or gittasks.is_container_name(
            sidecar.name
        ):
            raise JobPodError(f"spec.pod.sidecars: the name {sidecar.name!r} is reserved")
        for item in sidecar.env or []:
            # The schema refuses them too: the node acts on them in any container.
            if problem := node_env_name_problem(item.name):
                raise JobPodError(f"spec.pod.sidecars: {problem}")
        container = sidecar.model_dump(by_alias=True, exclude_none=True)
        # Whatever the job asked for, a sidecar runs under the same restricted
        # profile as the evaluation, with a writable /tmp of its own only.
        container["securityContext"] = restricted_container_context()
        container["volumeMounts"] = [{"name": f"{sidecar.name}-tmp", "mountPath": POD_TMP}]
        containers.append(container)
    return containers


def build_pod(
    *,
    name: str,
    namespace: str,
    uid: str,
    spec: api.LMEvalJobSpec,
    settings: Settings,
    run_as_user: int | None = None,
    shard: int | None = None,
) -> dict[str, Any]:
    """The complete pod manifest for job `namespace/name` with UID `uid`.

    `run_as_user` is the first UID of the namespace's OpenShift range
    (``openshift.io/sa.scc.uid-range``) when it has one; otherwise the pod
    leaves the UID to the image and the platform. A job with spec.parallelism
    above 1 has shard pods (`shard`: the index) and, under the job's pod name,
    the merge pod (`shard` None) that computes its results from theirs.

    Raises JobPodError when the spec asks for something the settings forbid.
    """
    volumes, mounts = _job_volumes(name, uid, spec)
    for extra_volumes, extra_mounts in (
        modeltls.tls_volumes(spec),
        offline.storage_volumes(spec),
        offline.config_map_volumes(spec),
        ocioutput.oci_volumes(spec),
        # Only the job's pod (a sharded job's merge pod) exports, and sees the credentials.
        mlflowoutput.mlflow_volumes(spec) if shard is None else ([], []),
        (trust.cluster_volumes(settings), trust.cluster_mounts(settings)),
    ):
        volumes, mounts = volumes + extra_volumes, mounts + extra_mounts
    init_containers = _init_containers(spec, settings, run_as_user, volumes, mounts)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": settings.job_service_account,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "securityContext": _pod_security_context(run_as_user),
        # The kubelet expands $(VAR) in what a container runs: in the poller's
        # containers nothing may expand (kubelet_literal). The job's sidecars
        # are its own and keep the expansion.
        "containers": [
            kubelet_literal_container(
                _main_container(name, uid, spec, settings, mounts, shard, namespace=namespace)
            ),
            *_sidecars(spec),
        ],
        "volumes": volumes,
    }
    for sidecar in (spec.pod.sidecars if spec.pod else None) or []:
        volumes.append({"name": f"{sidecar.name}-tmp", "emptyDir": {}})
    if init_containers:
        pod_spec["initContainers"] = [kubelet_literal_container(c) for c in init_containers]
    pod_spec.update(placement(spec))
    if shard_count(spec) > 1:
        _colocate(pod_spec, uid)
    metadata = _pod_metadata(name, namespace, uid, spec)
    if shard is not None:
        metadata["name"] = shard_pod_name(name, uid, shard)
        metadata["labels"][LABEL_SHARD] = str(shard)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": pod_spec,
    }


def _init_containers(
    spec: api.LMEvalJobSpec,
    settings: Settings,
    run_as_user: int | None,
    volumes: list[dict[str, Any]],
    mounts: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """The init containers, in the order they run: the driver's copy (setting
    driver-image), the Git clones (spec.customTasks[].git), the storage fetch
    (spec.offline); the volumes and main-container mounts they need are added
    to `volumes` and `mounts`."""
    init_containers: list[dict[str, Any]] = []
    if settings.driver_image:
        volumes.append({"name": "driver", "emptyDir": {}})
        mounts.append({"name": "driver", "mountPath": DRIVER_MOUNT, "readOnly": True})
        init_containers.append(driver_init_container(settings))
    try:
        init_containers += gittasks.init_containers(
            spec,
            settings,
            restricted_container_context(),
            run_as_user is not None,
            "tmp",
            CUSTOM_TASKS_ROOT,
            driver=driver_command(settings),
            job_image=lambda container: _with_profile(container, settings),
        )
    except gittasks.GitPodError as error:
        raise JobPodError(str(error)) from None
    volumes += gittasks.volumes(spec, settings)
    mounts += gittasks.main_mounts(spec, CUSTOM_TASKS_ROOT)
    if (fetch := offline.fetch_container(spec, driver_command(settings), settings)) is not None:
        init_containers.append(_with_profile(fetch, settings))
    return init_containers


def _colocate(pod_spec: dict[str, Any], uid: str) -> None:
    """A sharded job's pods run on one node (a required pod affinity to each
    other, beside any the job asks for): they share one claim, which may be
    ReadWriteOnce, and they are clients of the model server, not its replicas."""
    term = {
        "labelSelector": {"matchLabels": {LABEL_JOB_UID: uid}},
        "topologyKey": "kubernetes.io/hostname",
    }
    affinity = pod_spec.setdefault("affinity", {})
    pod_affinity = affinity.setdefault("podAffinity", {})
    required = pod_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", [])
    required.append(term)


def _child_argv(
    name: str, spec: api.LMEvalJobSpec, settings: Settings, shard: int | None
) -> list[str]:
    """What the driver runs: lm_eval, or for a sharded job its shard's run or the merge."""
    args = lm_eval_argv(spec, settings)
    count = shard_count(spec)
    if count == 1:
        # -P: lm_eval's working directory (the hub view of a shared cache, see
        # driver.hubview) never comes first on sys.path.
        return ["python", "-P", "-m", "lm_eval", *args]
    if shard is None:
        return protocol.shard_merge_argv(count, shard_root(name), args)
    return protocol.shard_run_argv(shard, count, shard_root(name), args)


def placement(spec: api.LMEvalJobSpec) -> dict[str, Any]:
    """Where the pod may run, as spec.pod asks: node selector, affinity,
    priority class, tolerations (only the ones it sets)."""
    pod = spec.pod
    placement: dict[str, Any] = {}
    if pod and pod.node_selector:
        placement["nodeSelector"] = dict(pod.node_selector)
    if pod and pod.affinity:
        placement["affinity"] = pod.affinity.model_dump(by_alias=True, exclude_none=True)
    if pod and pod.priority_class_name:
        placement["priorityClassName"] = pod.priority_class_name
    if pod and pod.tolerations:
        placement["tolerations"] = [
            t.model_dump(by_alias=True, exclude_none=True) for t in pod.tolerations
        ]
    return placement


def _job_volumes(
    name: str, uid: str, spec: api.LMEvalJobSpec
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The evaluation's volumes and their mounts: the writable emptyDirs (or the
    outputs claim), secrets as files, and the job's task snapshots."""
    volumes: list[dict[str, Any]] = [
        {"name": "tmp", "emptyDir": {}},
        {"name": "hf-home", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "tmp", "mountPath": POD_TMP},
        {"name": "hf-home", "mountPath": HF_HOME},
    ]
    pvc = offline.outputs_claim(spec, name, uid)
    if pvc:
        volumes.append({"name": "outputs", "persistentVolumeClaim": {"claimName": pvc}})
    else:
        volumes.append({"name": "outputs", "emptyDir": {}})
    mounts.append({"name": "outputs", "mountPath": OUTPUT_ROOT})
    for index, secret in enumerate(spec.file_secrets or []):
        volume: dict[str, Any] = {"secretName": secret.secret_ref.secret_name}
        if secret.secret_ref.items:
            volume["items"] = [{"key": i.key, "path": i.path} for i in secret.secret_ref.items]
        volumes.append({"name": f"secret-{index}", "secret": volume})
        mounts.append({"name": f"secret-{index}", "mountPath": secret.mount_path, "readOnly": True})
    for source in spec.custom_tasks or []:
        if source.config_map is None:
            continue  # a Git source: see poller.jobpod.gittasks
        # The pod mounts the job's immutable snapshot of the ConfigMap (made by
        # the poller just before the pod, see poller/cycle/tasksnapshot.py), at the
        # path named after the source, where the task files point.
        volume_name = f"tasks-{hashlib.sha256(source.config_map.encode()).hexdigest()[:10]}"
        snapshot = task_snapshot_name(name, uid, source.config_map)
        volumes.append({"name": volume_name, "configMap": {"name": snapshot}})
        mounts.append(
            {
                "name": volume_name,
                "mountPath": f"{CUSTOM_TASKS_ROOT}/{source.config_map}",
                "readOnly": True,
            }
        )
    return volumes, mounts


def driver_init_container(settings: Settings) -> dict[str, Any]:
    """Copies the driver from the driver image into the pod (setting driver-image)."""
    return {
        "name": "install-driver",
        "image": settings.driver_image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["cp", "-R", DRIVER_IMAGE_SOURCE, f"{DRIVER_MOUNT}/"],
        "securityContext": restricted_container_context(),
        "volumeMounts": [{"name": "driver", "mountPath": DRIVER_MOUNT}],
        "resources": {
            "requests": {"cpu": "10m", "memory": "16Mi"},
            "limits": {"memory": "64Mi"},
        },
    }


def _with_profile(container: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """An init container of the job's image, under the restricted profile; with the
    copied driver mounted when the image has none (setting driver-image)."""
    container = {
        **container,
        "image": settings.pod_image,
        "imagePullPolicy": settings.image_pull_policy,
        "securityContext": restricted_container_context(),
        "resources": {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"memory": "512Mi"},
        },
        # Its last log lines become the pod's account of a failure.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if settings.driver_image:
        container["env"] = [*container["env"], {"name": "PYTHONPATH", "value": DRIVER_MOUNT}]
        container["volumeMounts"] = [
            *container["volumeMounts"],
            {"name": "driver", "mountPath": DRIVER_MOUNT, "readOnly": True},
        ]
    return container


def _main_container(
    name: str,
    uid: str,
    spec: api.LMEvalJobSpec,
    settings: Settings,
    mounts: list[dict[str, Any]],
    shard: int | None = None,
    *,
    namespace: str,
) -> dict[str, Any]:
    """The evaluation container: the driver running lm_eval (a shard's: its part,
    holding, pushing and exporting nothing; the merge pod reports the job's)."""
    # The complete output outlives the pod on the claim, beside the results.
    keeps_log = offline.outputs_claim(spec, name, uid) is not None
    own_name = pod_name(name, uid) if shard is None else shard_pod_name(name, uid, shard)
    oci = ocioutput.driver_options(spec, name, uid) if shard is None else ocioutput.PushOptions()
    export = (
        mlflowoutput.driver_options(spec, namespace, name, uid)
        if shard is None
        else mlflowoutput.ExportOptions()
    )
    holds = settings.results_source == "exec" and shard is None
    command = protocol.run_argv(
        driver_command(settings),
        _child_argv(name, spec, settings, shard),
        protocol.RunArgs(
            output_root=OUTPUT_ROOT,
            grace_period=DRIVER_GRACE_SECONDS,
            hold_seconds=EXEC_HOLD_SECONDS if holds else None,
            log_copy=f"{OUTPUT_ROOT}/{own_name}.log" if keeps_log else None,
            task_sources=gittasks.CLONE_ROOT if gittasks.git_sources(spec) else None,
            hub_datasets=offline.hub_datasets(spec),
            oci_push=oci.push,
            oci_subject=oci.subject,
            oci_auth=oci.auth,
            oci_scheme=oci.scheme,
            oci_ca_bundle=oci.ca_bundle,
            oci_tls=oci.tls,
            mlflow_tracking_uri=export.tracking_uri,
            mlflow_experiment=export.experiment,
            mlflow_run_name=export.run_name,
            mlflow_tags=export.tags,
            mlflow_credentials=export.credentials,
            mlflow_ca_bundle=export.ca_bundle,
        ),
    )
    main: dict[str, Any] = {
        "name": MAIN_CONTAINER,
        "image": settings.pod_image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": command,
        "env": _env(spec, settings, bool(settings.driver_image))
        + modeltls.tls_env(spec)
        + trust.cluster_env(settings),
        "securityContext": restricted_container_context(),
        "volumeMounts": mounts,
        "workingDir": POD_TMP,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    resources = resources_for(spec, settings)
    if resources:
        main["resources"] = resources
    return main


def _pod_metadata(name: str, namespace: str, uid: str, spec: api.LMEvalJobSpec) -> dict[str, Any]:
    """Name, the job's labels and annotations with ours, and the job as controller."""
    labels = dict(spec.labels or {})
    labels.update(
        {
            LABEL_MANAGED_BY: MANAGED_BY,
            LABEL_JOB_NAME: _label_value(name),
            LABEL_JOB_UID: uid,
        }
    )
    return {
        "name": pod_name(name, uid),
        "namespace": namespace,
        "labels": labels,
        "annotations": dict(spec.annotations or {}),
        "ownerReferences": [api.job_owner_reference(name, uid)],
    }
