"""Task files from Git: the init containers that clone them, and the mounts that show them.

A ``spec.customTasks[i].git`` source is cloned before the evaluation starts,
by init containers of the job pod that run ``git`` itself (setting
``git-image``), one git command each, as argv lists (no shell anywhere), into
an emptyDir of its own mounted at ``/opt/lmeval/tasks/git-<i>``, under the
one ``--include_path`` that also holds the ConfigMap sources:

1. ``git init`` of that directory;
2. with ``path``, ``git sparse-checkout set --no-cone /<path>/``: only that
   directory of the repository is checked out, so lm_eval's recursive scan
   sees no other YAML (CI files, other task collections);
3. ``git fetch`` of exactly what the spec names: the commit (depth 1, so the
   server must allow fetching a commit by hash, as protocol v2 servers do),
   the branch or tag (depth 1), the branch in full when a commit on it is
   named too, or the remote HEAD;
4. ``git checkout --detach`` of that commit (or of what was fetched);
5. ``git log -1 --format=%H --output=/opt/lmeval/git/<i>.commit``, run in the
   task directory, which both checks that ``path`` exists and records the
   commit actually checked out, in a file the driver reads and reports in its
   markers (`driver.payloads.TaskSourceFields`); the poller puts it in
   ``status.taskSources``. So the pod needs no API rights to say which
   commit it ran.

The containers run under the job's restricted profile, without a token and
without API rights (they are the job pod's). Credentials, when a source names
a Secret, are a ``.git-credentials`` file mounted into the fetch container
only and read by git's own ``store`` credential helper (configured through
``GIT_CONFIG_*`` variables): never in the URL, the argv or the log. The
same variables declare the clone's directory, which the kubelet makes owned
by root, a ``safe.directory``: git refuses it otherwise (a real node showed
it; the local runner's directories belong to the user running git). Git never
prompts (``GIT_TERMINAL_PROMPT=0``), reads no system or user configuration,
and may use only the transports the schema allows (``GIT_ALLOW_PROTOCOL``).

TLS: git's ``http.sslCAInfo`` takes *one* file, and it replaces git's own
store. Naming the source's ``caBundle`` there alone would make every public
server untrusted, and the cluster's CA bundles (the setting
``trusted-ca-bundles``) are several files. So when an ``https://`` source
has a ``caBundle`` or the setting names bundles, a first init container,
``git-<i>-ca``, of the *job* image (the driver's ``ca-bundle``, the same
union `driver.trust` gives lm_eval) writes one file into the emptyDir
``git-ca``: the job image's authorities, the cluster's bundles (each
optional, noted when absent) and the source's own. The fetch container
alone mounts it, read-only, as its ``http.sslCAInfo``. The alternatives
were worse: ``http.<url>.sslCAInfo`` with the source's CA and the cluster's
bundles would still need them joined into one file and would drop the
public authorities for that URL; and the git image's own store differs
from image to image (alpine's, Debian's), where the job image's is the one
every other client of the pod trusts. A clone that fails verification ends
the job with git's words and the fields to fix (``caBundle``, the setting).
Sources without either keep git's own store and no extra container.

The evaluation container mounts every clone, and the commits' emptyDir at
``/opt/lmeval/git``, read-only. (No ``subPath`` mounts: the repository keeps
its layout, so a task file of ``path`` ``tasks`` is at
``/opt/lmeval/tasks/git-<i>/tasks/``.)

Pure: no I/O. Failures of an init container are told by `clone_failure`,
which names the spec field.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from driver import protocol
from poller import api
from poller.api.settings import Settings
from poller.jobpod import trust

__all__ = [
    "CA_ROOT",
    "CA_VOLUME",
    "CLONE_ROOT",
    "COMMIT_SUFFIX",
    "CONTAINER_PREFIX",
    "CREDENTIALS_KEY",
    "GIT_UID",
    "VOLUME",
    "GitPodError",
    "clone_failure",
    "git_sources",
    "init_containers",
    "is_container_name",
    "main_mounts",
    "source_name",
    "status_entries",
    "task_dir",
    "volumes",
]

# The emptyDir of the commits the clones checked out (one file per source).
VOLUME = "git-commits"
CLONE_ROOT = "/opt/lmeval/git"
COMMIT_SUFFIX = ".commit"
CONTAINER_PREFIX = "git-"
CREDENTIALS_KEY = ".git-credentials"
CREDENTIALS_MOUNT = "/var/run/lmeval/git-credentials"
# The emptyDir of the combined CA files (<i>.pem, one per source that needs
# one) and where each source's own caBundle is mounted.
CA_VOLUME = "git-ca"
CA_ROOT = "/opt/lmeval/git-ca"
SOURCE_CA_ROOT = "/opt/lmeval/git-source-ca"
# An image such as alpine/git runs as root; the restricted profile needs a
# non-root UID, which the pod gives on OpenShift (the namespace's range) and
# these containers give themselves elsewhere.
GIT_UID = 65532
_STEPS = ("ca", "init", "sparse", "fetch", "checkout", "record")
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
_COMMIT_RE = re.compile(api.GIT_COMMIT)
_CONTAINER_RE = re.compile(rf"^{CONTAINER_PREFIX}(\d+)-({'|'.join(_STEPS)})$")


class GitPodError(ValueError):
    """A Git source cannot become containers; the message names the field."""


def git_sources(spec: api.LMEvalJobSpec) -> list[tuple[int, api.GitSource]]:
    """The job's Git sources with their index in spec.customTasks."""
    return [(i, t.git) for i, t in enumerate(spec.custom_tasks or []) if t.git is not None]


def is_container_name(name: str) -> bool:
    """Whether `name` is one of the Git init containers' names (reserved)."""
    return _CONTAINER_RE.match(name) is not None


def source_name(index: int) -> str:
    """How the driver's markers and status.taskSources name source `index`."""
    return f"customTasks[{index}]"


def task_dir(index: int) -> str:
    """Source `index`'s directory (and volume name) under the tasks root."""
    return f"git-{index}"


def _checked(index: int, source: api.GitSource, settings: Settings) -> None:
    where = f"spec.customTasks[{index}].git"
    parts = urlsplit(source.url)
    plaintext = parts.scheme in ("http", "git")
    host = (parts.hostname or "").lower()
    if plaintext and host not in _LOOPBACK and not settings.git_allow_plaintext:
        raise GitPodError(
            f"{where}.url: {parts.scheme}:// is unencrypted and unauthenticated; use https://, "
            "or a loopback host (a sidecar), or set git-allow-plaintext: true in ConfigMap "
            "lmeval-poller-config"
        )
    if plaintext and source.credentials_secret and host not in _LOOPBACK:
        raise GitPodError(
            f"{where}.credentialsSecret: credentials are never sent over {parts.scheme}:// "
            "to another host; use https://"
        )
    if parts.scheme == "git" and source.credentials_secret:
        raise GitPodError(
            f"{where}.credentialsSecret: the git:// protocol has no authentication; use https://"
        )
    if plaintext and source.ca_bundle is not None:
        raise GitPodError(
            f"{where}.caBundle: {parts.scheme}:// uses no TLS, so no CA; use https:// or remove "
            "caBundle"
        )


def _needs_ca(source: api.GitSource, settings: Settings) -> bool:
    """Whether the clone gets a CA file of its own (the `ca` step): an https:// source
    with a caBundle, or any https:// source when the cluster's bundles are picked up."""
    https = urlsplit(source.url).scheme == "https"
    return https and (source.ca_bundle is not None or bool(settings.trusted_ca_bundles))


def _ca_file(index: int) -> str:
    return f"{CA_ROOT}/{index}.pem"


def _source_ca_dir(index: int) -> str:
    return f"{SOURCE_CA_ROOT}/{index}"


def volumes(spec: api.LMEvalJobSpec, settings: Settings) -> list[dict[str, Any]]:
    """The pod's volumes for its Git sources: one emptyDir per clone and one for
    the commits, each credentials Secret, and the CA files' emptyDir and each
    source's own caBundle when a clone needs them."""
    sources = git_sources(spec)
    if not sources:
        return []
    out: list[dict[str, Any]] = [{"name": VOLUME, "emptyDir": {}}]
    if any(_needs_ca(source, settings) for _index, source in sources):
        out.append({"name": CA_VOLUME, "emptyDir": {}})
    for index, source in sources:
        out.append({"name": task_dir(index), "emptyDir": {}})
        if source.ca_bundle is not None and _needs_ca(source, settings):
            out.append(trust.ca_volume(f"git-source-ca-{index}", source.ca_bundle))
        if source.credentials_secret:
            out.append(
                {
                    "name": f"git-credentials-{index}",
                    "secret": {
                        "secretName": source.credentials_secret,
                        "items": [{"key": CREDENTIALS_KEY, "path": CREDENTIALS_KEY}],
                        "defaultMode": 0o444,
                    },
                }
            )
    return out


def main_mounts(spec: api.LMEvalJobSpec, tasks_root: str) -> list[dict[str, Any]]:
    """The evaluation container's mounts, read-only: each clone under `tasks_root`
    (lm_eval's --include_path), and the commits for the driver."""
    sources = git_sources(spec)
    if not sources:
        return []
    mounts: list[dict[str, Any]] = [{"name": VOLUME, "mountPath": CLONE_ROOT, "readOnly": True}]
    for index, _source in sources:
        mounts.append(
            {"name": task_dir(index), "mountPath": _repo(tasks_root, index), "readOnly": True}
        )
    return mounts


def _repo(tasks_root: str, index: int) -> str:
    return f"{tasks_root}/{task_dir(index)}"


def _argv(repo: str, index: int, source: api.GitSource, step: str) -> list[str]:
    if step == "init":
        return ["git", "init", "--quiet", "--", repo]
    if step == "sparse":
        # A gitignore-style pattern: the schema allows no wildcard in path.
        return ["git", "-C", repo, "sparse-checkout", "set", "--no-cone", "--", f"/{source.path}/"]
    if step == "fetch":
        # What to fetch: exactly the commit, or the branch/tag (whole when a
        # commit on it is named), or the remote's HEAD. Options as single
        # tokens, "--" before the URL and refs: nothing from the spec can be
        # read as an option.
        if source.commit and not source.branch:
            return ["git", "-C", repo, "fetch", "--depth=1", "--no-tags", "--", source.url,
                    source.commit]  # fmt: skip
        depth = [] if source.commit else ["--depth=1"]
        ref = source.branch or "HEAD"
        return ["git", "-C", repo, "fetch", *depth, "--no-tags", "--", source.url, ref]
    if step == "checkout":
        target = source.commit or "FETCH_HEAD"
        return ["git", "-C", repo, "checkout", "--quiet", "--detach", target]
    where = f"{repo}/{source.path}" if source.path else repo
    return ["git", "-C", where, "log", "-1", "--format=%H",
            f"--output={CLONE_ROOT}/{index}{COMMIT_SUFFIX}"]  # fmt: skip


def _env(repo: str, credentials: bool, ca_file: str | None = None) -> list[dict[str, str]]:
    env = [
        {"name": "HOME", "value": "/tmp"},  # noqa: S108 (the pod's own emptyDir)
        {"name": "GIT_TERMINAL_PROMPT", "value": "0"},
        {"name": "GIT_CONFIG_NOSYSTEM", "value": "1"},
        {"name": "GIT_CONFIG_GLOBAL", "value": "/dev/null"},
        {"name": "GIT_ALLOW_PROTOCOL", "value": "https:http:git"},
    ]
    # The clone's directory is the emptyDir's mount point, which the kubelet
    # makes owned by root: git (2.35.2 on) refuses a repository owned by
    # another user than the one running it ("dubious ownership"), so this
    # one directory, and only it, is declared safe. Command-scope
    # configuration (GIT_CONFIG_COUNT) is one git honours for it.
    config = [("safe.directory", repo)]
    if credentials:
        # git's own store helper reads the mounted file; it is named here, in
        # the environment, never in the URL or the argv.
        config.append(("credential.helper", f"store --file={CREDENTIALS_MOUNT}/{CREDENTIALS_KEY}"))
    if ca_file is not None:
        # The `ca` step's file: the job image's authorities, the cluster's and
        # the source's own (the module's docstring says why one file).
        config.append(("http.sslCAInfo", ca_file))
    env.append({"name": "GIT_CONFIG_COUNT", "value": str(len(config))})
    for number, (key, value) in enumerate(config):
        env += [
            {"name": f"GIT_CONFIG_KEY_{number}", "value": key},
            {"name": f"GIT_CONFIG_VALUE_{number}", "value": value},
        ]
    return env


def _ca_container(
    index: int,
    source: api.GitSource,
    settings: Settings,
    driver: Sequence[str],
    job_image: Callable[[dict[str, Any]], dict[str, Any]],
) -> dict[str, Any]:
    """Source `index`'s `ca` step: the driver (in the job image, `job_image` gives
    image and profile) writes the clone's one CA file."""
    own = source.ca_bundle is not None
    mounts: list[dict[str, Any]] = [
        {"name": CA_VOLUME, "mountPath": CA_ROOT},
        *trust.cluster_mounts(settings),
    ]
    if own:
        mounts.append(
            {"name": f"git-source-ca-{index}", "mountPath": _source_ca_dir(index), "readOnly": True}
        )
    command = protocol.ca_bundle_argv(
        driver,
        _ca_file(index),
        f"{_source_ca_dir(index)}/{trust.CA_FILE}" if own else None,
        f"spec.customTasks[{index}].git.caBundle" if own else None,
    )
    return job_image(
        {
            "name": f"{CONTAINER_PREFIX}{index}-ca",
            "command": command,
            "env": trust.cluster_env(settings),
            "volumeMounts": mounts,
        }
    )


def init_containers(
    spec: api.LMEvalJobSpec,
    settings: Settings,
    security_context: dict[str, Any],
    pod_sets_user: bool,
    tmp_volume: str,
    tasks_root: str,
    *,
    driver: Sequence[str],
    job_image: Callable[[dict[str, Any]], dict[str, Any]],
) -> list[dict[str, Any]]:
    """The init containers that clone every Git source, in order.

    `security_context` is the restricted container profile; `pod_sets_user`
    says whether the pod already gives a UID (else these run as GIT_UID);
    `tmp_volume` is the pod's emptyDir for /tmp (git's HOME); `tasks_root` is
    lm_eval's --include_path, where each clone is made. A clone that needs a
    CA file of its own starts with a container of the job image running the
    driver (`driver`: the words that start it), which `job_image` completes
    with image, profile and resources.
    Raises GitPodError for a source the settings refuse.
    """
    containers: list[dict[str, Any]] = []
    context = dict(security_context)
    if not pod_sets_user:
        context.update(runAsUser=GIT_UID, runAsGroup=GIT_UID)
    for index, source in git_sources(spec):
        _checked(index, source, settings)
        repo = _repo(tasks_root, index)
        ca_file = _ca_file(index) if _needs_ca(source, settings) else None
        for step in _STEPS:
            if step == "sparse" and not source.path:
                continue
            if step == "ca":
                if ca_file is not None:
                    containers.append(_ca_container(index, source, settings, driver, job_image))
                continue
            credentials = step == "fetch" and bool(source.credentials_secret)
            mounts: list[dict[str, Any]] = [
                {"name": task_dir(index), "mountPath": repo},
                {"name": tmp_volume, "mountPath": "/tmp"},  # noqa: S108
            ]
            if step == "record":
                mounts.append({"name": VOLUME, "mountPath": CLONE_ROOT})
            if credentials:
                mounts.append(
                    {
                        "name": f"git-credentials-{index}",
                        "mountPath": CREDENTIALS_MOUNT,
                        "readOnly": True,
                    }
                )
            fetch_ca = ca_file if step == "fetch" else None
            if fetch_ca is not None:
                mounts.append({"name": CA_VOLUME, "mountPath": CA_ROOT, "readOnly": True})
            containers.append(
                {
                    "name": f"{CONTAINER_PREFIX}{index}-{step}",
                    "image": settings.git_image,
                    "imagePullPolicy": settings.image_pull_policy,
                    "command": _argv(repo, index, source, step),
                    "env": _env(repo, credentials, fetch_ca),
                    "securityContext": context,
                    "volumeMounts": mounts,
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                    "resources": {
                        "requests": {"cpu": "50m", "memory": "64Mi"},
                        "limits": {"memory": "512Mi"},
                    },
                }
            )
    return containers


_WHAT = {
    "ca": "gathering the CAs trusted for",
    "init": "preparing the clone",
    "sparse": "selecting the path of",
    "fetch": "fetching",
    "checkout": "checking out",
    "record": "reading the commit of",
}


def _git_entry(raw_spec: Mapping[str, Any], index: int) -> api.GitSource | None:
    """spec.customTasks[index].git of a raw spec, if it is a valid Git source."""
    entries = raw_spec.get("customTasks")
    if not isinstance(entries, list) or not 0 <= index < len(entries):
        return None
    entry = entries[index]
    git = entry.get("git") if isinstance(entry, dict) else None
    try:
        return api.GitSource.model_validate(git)
    except ValueError:
        return None


def clone_failure(
    raw_spec: Mapping[str, Any], container: str, exit_code: int | None, message: str
) -> str | None:
    """The job's message when init container `container` failed (`message`: its
    termination message, git's last words); None when it is no Git container."""
    match = _CONTAINER_RE.match(container)
    if match is None:
        return None
    index, step = int(match.group(1)), match.group(2)
    source = _git_entry(raw_spec, index)
    where = f"spec.customTasks[{index}].git"
    if source is None:
        return f"{where}: init container {container} failed (exit code {exit_code})"
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    detail = next((line for line in reversed(lines) if line.startswith("fatal:")), None)
    detail = detail or (lines[-1] if lines else f"exit code {exit_code}")
    if step == "ca":
        # The driver's own words name the field already (a bundle without PEM).
        named = detail if detail.startswith(where) else f"{where}.caBundle: {detail}"
        return f"{named} ({_WHAT[step]} {source.url})"
    if step == "fetch" and any(text in detail.lower() for text in _UNTRUSTED):
        return (
            f"{where}: fetching {source.url} failed, its certificate is not trusted ({detail}): "
            f"give its CA in {where}.caBundle, or ask for it in the poller setting "
            "trusted-ca-bundles"
        )
    field, what = _blamed(source, step, detail)
    named = f"{where}.{field}" if field else where
    return f"{named}: {_WHAT[step]} {what} failed: {detail}"


def status_entries(
    raw_spec: Mapping[str, Any], reported: Sequence[tuple[str, str]]
) -> list[dict[str, Any]]:
    """status.taskSources from the (name, commit) pairs the driver reported.

    The pairs come from the pod log (untrusted): only names of the spec's Git
    sources and full commit hashes are kept, each source once.
    """
    out: dict[int, dict[str, Any]] = {}
    for name, commit in reported:
        if not name.isdigit() or not _COMMIT_RE.match(commit):
            continue
        index = int(name)
        source = _git_entry(raw_spec, index)
        if source is None or index in out:
            continue
        out[index] = {
            "name": source_name(index),
            "url": source.url,
            "branch": source.branch,
            "commit": commit,
        }
    return [out[i] for i in sorted(out)]


# What git says when the ref or the commit is not there, and when the server
# wants (other) credentials.
_NO_REF = ("couldn't find remote ref", "not our ref", "unadvertised object", "not a tree",
           "unknown revision", "pathspec", "invalid reference")  # fmt: skip
_NO_AUTH = ("authentication failed", "could not read username", "could not read password",
            "terminal prompts disabled", "403")  # fmt: skip
# What git (through curl with OpenSSL or GnuTLS) says of a certificate no CA
# it trusts has signed.
_UNTRUSTED = ("ssl certificate problem", "server certificate verification failed",
              "certificate verify failed", "self-signed certificate", "self signed certificate",
              "unable to get local issuer certificate")  # fmt: skip


def _blamed(source: api.GitSource, step: str, detail: str) -> tuple[str | None, str]:
    """The field of `source` a failed `step` points at, and what it was doing with it."""
    lowered = detail.lower()
    if source.commit and (step == "checkout" or not source.branch):
        ref_field: str | None = "commit"
    else:
        ref_field = "branch" if source.branch else None
    what = source.url
    if step == "fetch":
        ref = source.commit if source.commit and not source.branch else source.branch
        what = f"{source.url} at {ref or 'HEAD'}"
    elif step == "checkout" and source.commit:
        what = f"{source.commit} from {source.url}"
    if step == "record" and source.path:
        return "path", f"{source.path} in {source.url}"
    if any(text in lowered for text in _NO_AUTH):
        return "credentialsSecret" if source.credentials_secret else "url", what
    if any(text in lowered for text in _NO_REF):
        return ref_field, what
    return ("url" if step == "fetch" else ref_field), what
