"""Operator settings from the ``lmeval-poller-config`` ConfigMap, tunable live.

The poller re-reads the ConfigMap every cycle (one cheap GET), so operators
change the poll interval, images or limits without a restart. ConfigMap
values are strings written by people, so each key is parsed on its own: a
bad value is reported once and that key keeps its last good value, while the
other keys still take effect. Nothing here can stop the poller: whatever the
ConfigMap holds (YAML syntax errors, deep nesting, anchors and aliases, huge
or non-finite numbers, thousands of junk keys), `SettingsTracker.update`
returns valid Settings. Every limit below bounds the work one hostile value
can cause per cycle, and the memory and log lines its problems can take.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from poller.api import DNS_LABEL, ResourceRequirements

__all__ = [
    "CONFIGMAP_NAME",
    "MAX_DURATION_CHARS",
    "MAX_PROBLEMS_LISTED",
    "MAX_VALUE_CHARS",
    "MAX_YAML_DEPTH",
    "Settings",
    "SettingsTracker",
    "load_plain_yaml",
    "parse_duration",
]

CONFIGMAP_NAME = "lmeval-poller-config"

log = logging.getLogger(__name__)

# A raw value longer than this is refused before any parsing: the largest
# legitimate one, size-presets, is a few hundred bytes, and PyYAML parses
# about 130 KB/s, so this caps one key's parse at about half a second (done
# again only when the ConfigMap changes).
MAX_VALUE_CHARS = 64 * 1024
# Durations are short ("1h30m"); the cap also keeps the unit regex's
# backtracking (quadratic in a run of digits: 8000 digits took 2.7 s) trivial.
MAX_DURATION_CHARS = 64
# Nesting of the YAML in size-presets (a preset needs 3: name, requests,
# resource); deeper documents are refused while parsing, before PyYAML's
# recursive composer or pydantic could exhaust the stack.
MAX_YAML_DEPTH = 10
# Problems kept (for the log and `problems`) per update; more are counted in
# `problem_count` only, so a ConfigMap of 10,000 junk keys costs 100 log lines
# once, not 10,000, and no memory beyond these.
MAX_PROBLEMS_LISTED = 100
# Characters of a bad value (and of the value kept) quoted in a problem.
_SHOWN_CHARS = 80
# Characters of a parser's own message quoted in a problem.
_REASON_CHARS = 300

# Upper bounds of the numeric settings: far above any sensible value, low
# enough that arithmetic on them (timestamps, counters) stays ordinary.
MAX_POLL_INTERVAL = 3600.0  # 1 h
MAX_PROGRESS_INTERVAL = 86400.0  # 24 h
MAX_POD_PENDING_TIMEOUT = 7 * 86400.0  # 7 days
MAX_PROGRESS_READS_PER_CYCLE = 1000  # pod log reads in one cycle
MAX_PROGRESS_READS_PER_MINUTE = 60_000  # pod log reads in one minute
# The shortest interval of the check for new jobs (`poller.service`) when it
# is on: each check is a LIST the apiserver filters over every job it holds.
MIN_NEW_JOB_CHECK_INTERVAL = 0.2
MAX_SWEEP_INTERVAL = 86400.0  # 24 h
MAX_SWEEP_JOBS = 1_000_000  # finished jobs listed in one sweep step
MAX_RUNNING_JOBS = 100_000
MAX_DEFAULT_TTL_SECONDS = 365 * 86400  # 1 year
MAX_LOG_ARCHIVE_BYTES = 512 * 1024  # the results ConfigMap must stay under 1 MiB
# An image reference is a few hundred characters at most (host 253, path
# 255, tag 128, digest 71). One with whitespace would make every job pod
# fail (the apiserver refuses it, or no registry serves it): refused here,
# where the key keeps its last good value instead.
MAX_IMAGE_CHARS = 1024
_IMAGE = r"^\S*$"

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: object) -> float:
    """Seconds in a Go-style duration ("10s", "1m30s", "500ms") or a plain number.

    Refuses what is not a finite number of seconds (nan, inf, 1e309, 10^400 h).
    """
    if isinstance(text, int | float) and not isinstance(text, bool):
        seconds = float(text)
    else:
        value = str(text).strip()
        if len(value) > MAX_DURATION_CHARS:
            raise ValueError(
                f"not a duration: {len(value)} characters, at most {MAX_DURATION_CHARS}"
            )
        try:
            seconds = float(value)
        except ValueError:
            parts = _DURATION_PART.findall(value)
            if not parts or "".join(n + u for n, u in parts) != value:
                raise ValueError(f"not a duration: {value!r} (use e.g. 10s, 2m, 1h30m)") from None
            seconds = sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)
    if not math.isfinite(seconds):
        raise ValueError(f"not a duration: {text!r} is not a finite number of seconds")
    return seconds


def _boolean(text: object) -> object:
    if isinstance(text, str):
        lowered = text.strip().lower()
        if lowered in ("true", "yes", "1", "on"):
            return True
        if lowered in ("false", "no", "0", "off"):
            return False
    return text


class _PlainYamlLoader(yaml.SafeLoader):
    """SafeLoader without anchors and aliases, and with bounded nesting.

    An alias is a pointer: ten levels of nine aliases each are a few hundred
    bytes of YAML but 9**10 nodes once pydantic walks them (the "billion
    laughs"). Settings never need them, so any anchor or alias is an error.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()  # type: ignore[no-untyped-call]  # (untyped in the stubs)
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise yaml.composer.ComposerError(
                None, None, "YAML anchors and aliases are not allowed", event.start_mark
            )
        if self._depth >= MAX_YAML_DEPTH:
            raise yaml.composer.ComposerError(
                None, None, f"nested deeper than {MAX_YAML_DEPTH} levels", event.start_mark
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load_plain_yaml(text: str) -> object:
    """One YAML document of plain data; `ValueError` naming line and column if not."""
    try:
        return yaml.load(text, Loader=_PlainYamlLoader)  # noqa: S506 (a SafeLoader)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ValueError(f"invalid YAML: {error.problem or error.context}{where}") from None
    except yaml.YAMLError as error:
        raise ValueError(f"invalid YAML: {error}") from None


def _off_or_frequent_enough(seconds: float) -> float:
    """new-job-check-interval: 0 (off), or at least MIN_NEW_JOB_CHECK_INTERVAL."""
    if 0 < seconds < MIN_NEW_JOB_CHECK_INTERVAL:
        raise ValueError(
            f"new-job-check-interval must be 0 (off) or at least "
            f"{MIN_NEW_JOB_CHECK_INTERVAL:g} s, not {seconds:g} s"
        )
    return seconds


def _yaml_mapping(text: object) -> object:
    if isinstance(text, str):
        return load_plain_yaml(text) or {}
    return text


def _name_list(text: object) -> object:
    if isinstance(text, str):
        return [part.strip() for part in text.split(",") if part.strip()]
    return text


# trusted-ca-bundles: NAME/KEY of a ConfigMap, each a projected item of every
# job pod (so Kubernetes' own rules: a DNS subdomain, a data key that is no
# "." or ".." path segment), and few of them (each is a file every TLS client
# of the pod reads).
MAX_TRUSTED_CA_BUNDLES = 16
_CA_SOURCE = re.compile(
    r"^(?P<name>[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)"
    r"/(?P<key>[-._a-zA-Z0-9]+)$"
)


def _ca_bundle_sources(entries: list[str]) -> list[str]:
    """trusted-ca-bundles' entries, checked, each once, in their order."""
    kept: list[str] = []
    for entry in entries:
        match = _CA_SOURCE.match(entry)
        if match is None:
            raise ValueError(
                f"{_clip(entry, _SHOWN_CHARS)!r} is not NAME/KEY (a ConfigMap's name and one of "
                "its keys, e.g. openshift-service-ca.crt/service-ca.crt)"
            )
        if len(match["name"]) > 253 or len(match["key"]) > 253:
            raise ValueError(f"{_clip(entry, _SHOWN_CHARS)!r}: a name or key over 253 characters")
        if match["key"] in (".", "..") or match["key"].startswith(".."):
            raise ValueError(f"{entry!r}: the key {match['key']!r} cannot be a file's name")
        if entry not in kept:
            kept.append(entry)
    if len(kept) > MAX_TRUSTED_CA_BUNDLES:
        raise ValueError(f"{len(kept)} entries, at most {MAX_TRUSTED_CA_BUNDLES}")
    return kept


Seconds = Annotated[float, BeforeValidator(parse_duration)]
Flag = Annotated[bool, BeforeValidator(_boolean)]


class Settings(BaseModel):
    """Every setting, with its default. Field aliases are the ConfigMap keys."""

    model_config = ConfigDict(
        populate_by_name=True, frozen=True, extra="ignore", allow_inf_nan=False
    )

    poll_interval: Annotated[
        Seconds,
        Field(
            alias="poll-interval",
            description=(
                "Time between poll cycles (a Go-style duration such as 10s or 1m30s, or "
                "seconds): the longest a change in the cluster waits for the poller (a "
                "new job is picked up sooner, see new-job-check-interval). A change "
                "reschedules the running poller within one old interval. The older name "
                "pod-checking-interval is accepted."
            ),
            ge=0.5,
            le=MAX_POLL_INTERVAL,
        ),
    ] = 2.0
    new_job_check_interval: Annotated[
        Seconds,
        AfterValidator(_off_or_frequent_enough),
        Field(
            alias="new-job-check-interval",
            description=(
                "How often the poller checks for new jobs between cycles (a duration; 0: "
                "never, at least 200ms otherwise): one LIST of the jobs that have no "
                "status yet, and a cycle at once when one of them is new to the poller, so "
                "that a job created while the poller is idle starts without waiting for "
                "the next poll-interval."
            ),
            ge=0.0,
            le=MAX_POLL_INTERVAL,
        ),
    ] = 1.0
    pod_image: Annotated[
        str,
        Field(
            alias="pod-image",
            description=(
                "Image of the evaluation container: Python, lm-eval and the lmeval-driver "
                "command. No whitespace."
            ),
            pattern=_IMAGE,
            min_length=1,
            max_length=MAX_IMAGE_CHARS,
        ),
    ] = "quay.io/lmeval-poller/lmeval-job:latest"
    driver_image: Annotated[
        str,
        Field(
            alias="driver-image",
            description=(
                "Image holding the driver at /opt/lmeval/driver. When set, an init "
                "container copies the driver into the pod and the evaluation runs python "
                "-m driver, so pod-image can be any image with Python and lm-eval; empty: "
                "pod-image's own lmeval-driver."
            ),
            pattern=_IMAGE,
            max_length=MAX_IMAGE_CHARS,
        ),
    ] = ""
    git_image: Annotated[
        str,
        Field(
            alias="git-image",
            description=(
                "Image of the init containers that clone Git task sources "
                "(spec.customTasks[].git): any image with git on its PATH that runs as "
                "any UID. Mirror it and pin it by digest in air-gapped clusters."
            ),
            pattern=_IMAGE,
            min_length=1,
            max_length=MAX_IMAGE_CHARS,
        ),
    ] = "docker.io/alpine/git:v2.45.1"
    git_allow_plaintext: Annotated[
        Flag,
        Field(
            alias="git-allow-plaintext",
            description=(
                "Allow Git task sources over http:// and git:// to hosts other than "
                "loopback (otherwise only https://)."
            ),
        ),
    ] = False
    image_pull_policy: Annotated[
        Literal["Always", "IfNotPresent", "Never"],
        Field(
            alias="image-pull-policy",
            description=("Pull policy of every container of the job pod."),
        ),
    ] = "IfNotPresent"
    job_service_account: Annotated[
        str,
        Field(
            alias="job-service-account",
            description=(
                "ServiceAccount of job pods, in each job's namespace: it must exist there "
                "and should have no rights (job pods mount no token)."
            ),
            pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        ),
    ] = "lmeval-job"
    progress_interval: Annotated[
        Seconds,
        Field(
            alias="progress-interval",
            description=(
                "How often a running job's progress is read from its pod log (a duration)."
            ),
            ge=1.0,
            le=MAX_PROGRESS_INTERVAL,
        ),
    ] = 30.0
    progress_reads_per_cycle: Annotated[
        int,
        Field(
            alias="progress-reads-per-cycle",
            description=(
                "At most this many progress reads of pod logs per cycle; 0 turns progress "
                "reading off."
            ),
            ge=0,
            le=MAX_PROGRESS_READS_PER_CYCLE,
        ),
    ] = 50
    progress_reads_per_minute: Annotated[
        int,
        Field(
            alias="progress-reads-per-minute",
            description=(
                "At most this many progress reads of pod logs per minute, whatever the "
                "poll-interval (each cycle reads what accrued since the last, up to "
                "progress-reads-per-cycle); 0 turns progress reading off."
            ),
            ge=0,
            le=MAX_PROGRESS_READS_PER_MINUTE,
        ),
    ] = 300
    # The sweep of finished jobs (`poller.cycle.sweep`): every finished-sweep-interval,
    # the next finished-sweep-jobs of them are listed (pages of 500), so a sweep
    # round over N finished jobs takes N / finished-sweep-jobs steps.
    finished_sweep_interval: Annotated[
        Seconds,
        Field(
            alias="finished-sweep-interval",
            description=(
                "How often the next finished-sweep-jobs finished jobs are listed "
                "(metadata only) to notice those deleted or edited since; finished jobs "
                "are not listed every cycle."
            ),
            ge=1.0,
            le=MAX_SWEEP_INTERVAL,
        ),
    ] = 60.0
    finished_sweep_jobs: Annotated[
        int,
        Field(
            alias="finished-sweep-jobs",
            description=(
                "Finished jobs listed per sweep step (in pages of 500): a sweep round "
                "over N finished jobs takes N / finished-sweep-jobs steps."
            ),
            ge=500,
            le=MAX_SWEEP_JOBS,
        ),
    ] = 10_000
    pod_pending_timeout: Annotated[
        Seconds,
        Field(
            alias="pod-pending-timeout",
            description=(
                "A job pod still Pending after this long (unschedulable, image pull "
                "errors, a stuck init container) ends the job Failed, with the "
                "scheduler's or kubelet's words in status.message."
            ),
            ge=1.0,
            le=MAX_POD_PENDING_TIMEOUT,
        ),
    ] = 600.0
    max_running_jobs: Annotated[
        int,
        Field(
            alias="max-running-jobs",
            description=(
                "Jobs with a pod at once across the cluster, first come first served; the "
                "others wait in state New with their place in status.message. 0: no "
                "limit."
            ),
            ge=0,
            le=MAX_RUNNING_JOBS,
        ),
    ] = 0
    results_source: Annotated[
        Literal["log", "exec"],
        Field(
            alias="results-source",
            description=(
                "How the poller reads results: log (from the driver's markers in the pod "
                "log) or exec (cat in the job's container, which the driver holds open "
                "for it; uses the pods/exec rule)."
            ),
        ),
    ] = "log"
    allow_online: Annotated[
        Flag,
        Field(
            alias="allow-online",
            description=(
                "Let jobs with spec.allowOnline reach model hubs and dataset hosts; when "
                "false such a job ends Failed before any pod exists."
            ),
        ),
    ] = False
    allow_code_execution: Annotated[
        Flag,
        Field(
            alias="allow-code-execution",
            description=(
                "Let jobs with spec.allowCodeExecution run model-written code and custom "
                "tasks that name Python; when false such a job ends Failed before any pod "
                "exists."
            ),
        ),
    ] = False
    allow_insecure_model_endpoints: Annotated[
        Flag,
        Field(
            alias="allow-insecure-model-endpoints",
            description=(
                "Let a job turn off TLS verification of its model endpoint (modelArgs "
                "verify_certificate other than true); when false such a job ends Failed "
                "before any pod exists."
            ),
        ),
    ] = False
    allow_insecure_storage_endpoints: Annotated[
        Flag,
        Field(
            alias="allow-insecure-storage-endpoints",
            description=(
                "Let a job turn off TLS verification of its S3 endpoint "
                "(spec.offline.storage.s3.verifySSL: false) or of its OCI registry "
                "(spec.outputs.oci.verifySSL: false); when false such a job ends Failed "
                "before any pod exists."
            ),
        ),
    ] = False
    trusted_ca_bundles: Annotated[
        list[str],
        BeforeValidator(_name_list),
        AfterValidator(_ca_bundle_sources),
        Field(
            alias="trusted-ca-bundles",
            description=(
                "ConfigMap keys of each job's namespace, as NAME/KEY (comma-separated; "
                f"at most {MAX_TRUSTED_CA_BUNDLES}), whose PEM certificates every TLS client "
                "of every job pod trusts besides the image's own authorities: lm_eval to the "
                "model endpoint, the S3 fetch, the OCI push, Git clones, the MLflow export. "
                "Each is optional: a namespace without it runs all the same. On OpenShift: "
                "odh-trusted-ca-bundle/ca-bundle.crt, "
                "openshift-service-ca.crt/service-ca.crt. Whoever may write these ConfigMaps "
                "in a namespace adds CAs that its jobs trust."
            ),
        ),
    ] = Field(default_factory=list)
    default_ttl_seconds_after_finished: Annotated[
        int | None,
        Field(
            alias="default-ttl-seconds-after-finished",
            description=(
                "Seconds after which finished jobs that set no "
                "spec.ttlSecondsAfterFinished are deleted; unset: kept until deleted."
            ),
            ge=0,
            le=MAX_DEFAULT_TTL_SECONDS,
        ),
    ] = None
    log_archive_bytes: Annotated[
        int,
        Field(
            alias="log-archive-bytes",
            description=(
                "Bytes of the end of the pod log kept (key log-tail.txt of the job's "
                "results ConfigMap) when the poller deletes a pod that ran (cancel, "
                "suspend, deadline); 0: none."
            ),
            ge=0,
            le=MAX_LOG_ARCHIVE_BYTES,
        ),
    ] = 64 * 1024
    size_presets: Annotated[
        dict[Annotated[str, Field(pattern=DNS_LABEL)], ResourceRequirements],
        BeforeValidator(_yaml_mapping),
        Field(
            alias="size-presets",
            description=(
                "YAML mapping of preset name to resources (requests and limits, GPUs "
                "included), chosen by a job's spec.size; the job's spec.pod.resources win "
                "over the preset, key by key. No YAML anchors or aliases, at most 10 "
                "levels deep."
            ),
        ),
    ] = Field(default_factory=dict)
    default_size: Annotated[
        str,
        Field(
            alias="default-size",
            description=(
                "The preset of jobs that name no spec.size; it must be a key of "
                "size-presets. Empty: none."
            ),
        ),
    ] = ""
    gpu_resource_names: Annotated[
        list[str],
        BeforeValidator(_name_list),
        Field(
            alias="gpu-resource-names",
            description=(
                "Resource names that count as GPUs (comma-separated): a job that requests "
                "one runs with --device cuda unless it sets spec.device."
            ),
            min_length=1,
        ),
    ] = Field(default_factory=lambda: ["nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915"])

    @model_validator(mode="after")
    def _default_size_exists(self) -> Settings:
        if self.default_size and self.default_size not in self.size_presets:
            known = ", ".join(sorted(self.size_presets)) or "none defined"
            raise ValueError(f"default-size {self.default_size!r} is not in size-presets ({known})")
        return self

    @classmethod
    def keys(cls) -> dict[str, str]:
        """ConfigMap key -> field name."""
        return {field.alias or name: name for name, field in cls.model_fields.items()}


# The seed's key for the interval, still accepted.
_KEY_ALIASES = {"pod-checking-interval": "poll-interval"}

# Settings an installation gives in the poller's environment (its Deployment),
# beneath the ConfigMap: the release's manifests name the release's job image
# here, by digest, so that the ConfigMap stays the operator's alone. An
# upgrade then moves the default job image without touching a key someone set
# (server-side apply never owned one), and a key set in the ConfigMap wins.
INSTALL_DEFAULT_ENV = {"pod-image": "LMEVAL_DEFAULT_POD_IMAGE"}


def install_defaults(environ: Mapping[str, str]) -> dict[str, str]:
    """The settings `environ` gives (INSTALL_DEFAULT_ENV), by ConfigMap key."""
    return {key: environ[name] for key, name in INSTALL_DEFAULT_ENV.items() if environ.get(name)}


class SettingsTracker:
    """Keeps the last good value of every key across re-reads.

    `update(data)` takes a ConfigMap's ``data`` (or None when the ConfigMap
    does not exist) and returns the effective Settings; it never raises.
    `problem_count` counts the keys currently ignored (the metric
    ``lmeval_settings_problems``); `problems` lists the first
    `MAX_PROBLEMS_LISTED` of them, each logged once while it lasts.
    `defaults` (`install_defaults`) stand beneath the ConfigMap's keys: a key
    the ConfigMap lacks, or has removed, takes them rather than the built-in
    default.
    """

    def __init__(self, defaults: Mapping[str, str] | None = None) -> None:
        self.defaults = dict(defaults or {})
        self.current = Settings()
        self.problems: dict[str, str] = {}
        self.problem_count = 0
        self._reported: set[tuple[str, str]] = set()
        self._unlisted_reported = 0
        # The data last seen: unchanged data (every cycle but the first after
        # an edit) is not parsed again.
        self._last_data: dict[str, object] | None = None
        if self.defaults:
            # Before the first read of the ConfigMap, too.
            self.update(None)

    def update(self, data: Mapping[str, object] | None) -> Settings:
        raw: dict[str, object] = dict(self.defaults)
        raw.update({str(key): value for key, value in (data or {}).items()})
        if raw == self._last_data:
            return self.current
        problems: dict[str, str] = {}
        try:
            self.current = self._apply(raw, problems)
        except Exception as error:  # a bug here must not stop the poller either
            log.exception("settings in ConfigMap %s: keeping the current ones", CONFIGMAP_NAME)
            problems["(all keys)"] = f"{type(error).__name__}: {_clip(str(error), _REASON_CHARS)}"
        self._last_data = raw
        self._report(problems, raw)
        return self.current

    def _apply(self, raw: dict[str, object], problems: dict[str, str]) -> Settings:
        """The Settings `raw` asks for, key by key; refused keys go to `problems`."""
        for old, new in _KEY_ALIASES.items():
            if old in raw and new not in raw:
                raw = {**raw, new: raw[old]}
                del raw[old]
        known = Settings.keys()
        given = {key: raw[key] for key in known if key in raw}
        refused = {key: why for key, value in given.items() if (why := _refuse_raw(value))}
        if not refused:
            # The common case, and the one where keys change together (a new
            # size-presets with a default-size among them) for good reasons.
            try:
                return Settings.model_validate(given)
            except Exception:  # noqa: S110 (judged key by key below, with reasons)
                pass
        accepted = self.current
        values = accepted.model_dump(by_alias=True)
        defaults = Settings().model_dump(by_alias=True)
        for key in known:
            # A removed key returns to its default (if the others allow it).
            value = given.get(key, defaults[key])
            if key in refused:
                problems[key] = f"{_shown(value)}: {refused[key]}; keeping {_shown(values[key])}"
                continue
            try:
                candidate = Settings.model_validate({**values, key: value})
            except ValidationError as error:
                reason = error.errors()[0]["msg"]
            except Exception as error:  # yaml, recursion, anything: this key's problem
                reason = f"{type(error).__name__}: {error}"
            else:
                accepted, values = candidate, candidate.model_dump(by_alias=True)
                continue
            where = "" if key in given else "removed, but "
            problems[key] = (
                f"{where}{_shown(value)}: {_clip(reason, _REASON_CHARS)}; "
                f"keeping {_shown(values[key])}"
            )
        return accepted

    def _report(self, problems: dict[str, str], raw: Mapping[str, object]) -> None:
        """Keep and log the first MAX_PROBLEMS_LISTED problems, count them all."""
        known = Settings.keys()
        unknown = [key for key in raw if key not in known and key not in _KEY_ALIASES]
        self.problem_count = len(problems) + len(unknown)
        listed = dict(problems)
        for key in unknown[: max(0, MAX_PROBLEMS_LISTED - len(listed))]:
            listed[_clip(key, _SHOWN_CHARS)] = "unknown key (ignored)"
        for key, problem in listed.items():
            if (key, problem) not in self._reported:
                log.warning("setting %s in ConfigMap %s: %s", key, CONFIGMAP_NAME, problem)
        unlisted = self.problem_count - len(listed)
        if unlisted and unlisted != self._unlisted_reported:
            log.warning(
                "ConfigMap %s: %d more unknown keys (ignored), not listed one by one",
                CONFIGMAP_NAME,
                unlisted,
            )
        # Only the problems still present are remembered: a bounded set, and a
        # problem that comes back after a fix is logged again.
        self._reported = set(listed.items())
        self._unlisted_reported = unlisted
        self.problems = listed


def _refuse_raw(value: object) -> str | None:
    """Why a raw ConfigMap value is refused before any parsing, or None."""
    if not isinstance(value, str):
        return f"not a string but {type(value).__name__}"
    if len(value) > MAX_VALUE_CHARS:
        return f"{len(value)} characters, at most {MAX_VALUE_CHARS}"
    return None


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _shown(value: object) -> str:
    """A value quoted in a problem, however large it is."""
    return _clip(repr(value), _SHOWN_CHARS)
