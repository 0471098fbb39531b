"""Operator settings from the ``lmeval-poller-config`` ConfigMap, tunable live.

The poller re-reads the ConfigMap every cycle (one cheap GET), so operators
change the poll interval, images or limits without a restart. ConfigMap
values are strings written by people, so each key is parsed on its own: a
bad value is reported once and that key keeps its last good value, while the
other keys still take effect. Nothing here can stop the poller.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Annotated, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from poller.api import DNS_LABEL, ResourceRequirements

__all__ = ["CONFIGMAP_NAME", "Settings", "SettingsTracker", "parse_duration"]

CONFIGMAP_NAME = "lmeval-poller-config"

log = logging.getLogger(__name__)

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: object) -> float:
    """Seconds in a Go-style duration ("10s", "1m30s", "500ms") or a plain number."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        return float(text)
    value = str(text).strip()
    try:
        return float(value)
    except ValueError:
        pass
    parts = _DURATION_PART.findall(value)
    if not parts or "".join(n + u for n, u in parts) != value:
        raise ValueError(f"not a duration: {value!r} (use e.g. 10s, 2m, 1h30m)")
    return sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)


def _boolean(text: object) -> object:
    if isinstance(text, str):
        lowered = text.strip().lower()
        if lowered in ("true", "yes", "1", "on"):
            return True
        if lowered in ("false", "no", "0", "off"):
            return False
    return text


def _yaml_mapping(text: object) -> object:
    if isinstance(text, str):
        return yaml.safe_load(text) or {}
    return text


def _name_list(text: object) -> object:
    if isinstance(text, str):
        return [part.strip() for part in text.split(",") if part.strip()]
    return text


Seconds = Annotated[float, BeforeValidator(parse_duration)]
Flag = Annotated[bool, BeforeValidator(_boolean)]


class Settings(BaseModel):
    """Every setting, with its default. Field aliases are the ConfigMap keys."""

    model_config = ConfigDict(populate_by_name=True, frozen=True, extra="ignore")

    poll_interval: Annotated[Seconds, Field(alias="poll-interval", ge=0.5, le=3600.0)] = 10.0
    pod_image: Annotated[str, Field(alias="pod-image", min_length=1)] = (
        "quay.io/lmeval-poller/lmeval-job:latest"
    )
    driver_image: Annotated[str, Field(alias="driver-image")] = ""
    image_pull_policy: Annotated[
        Literal["Always", "IfNotPresent", "Never"], Field(alias="image-pull-policy")
    ] = "IfNotPresent"
    job_service_account: Annotated[
        str, Field(alias="job-service-account", pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    ] = "lmeval-job"
    progress_interval: Annotated[Seconds, Field(alias="progress-interval", ge=1.0)] = 30.0
    progress_reads_per_cycle: Annotated[int, Field(alias="progress-reads-per-cycle", ge=0)] = 50
    pod_pending_timeout: Annotated[Seconds, Field(alias="pod-pending-timeout", ge=1.0)] = 600.0
    max_running_jobs: Annotated[int, Field(alias="max-running-jobs", ge=0)] = 0
    results_source: Annotated[Literal["log", "exec"], Field(alias="results-source")] = "log"
    allow_online: Annotated[Flag, Field(alias="allow-online")] = False
    allow_code_execution: Annotated[Flag, Field(alias="allow-code-execution")] = False
    default_ttl_seconds_after_finished: Annotated[
        int | None, Field(alias="default-ttl-seconds-after-finished", ge=0)
    ] = None
    log_archive_bytes: Annotated[int, Field(alias="log-archive-bytes", ge=0, le=512 * 1024)] = (
        64 * 1024
    )
    size_presets: Annotated[
        dict[Annotated[str, Field(pattern=DNS_LABEL)], ResourceRequirements],
        BeforeValidator(_yaml_mapping),
        Field(alias="size-presets"),
    ] = Field(default_factory=dict)
    default_size: Annotated[str, Field(alias="default-size")] = ""
    gpu_resource_names: Annotated[
        list[str], BeforeValidator(_name_list), Field(alias="gpu-resource-names", min_length=1)
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


class SettingsTracker:
    """Keeps the last good value of every key across re-reads.

    `update(data)` takes a ConfigMap's ``data`` (or None when the ConfigMap
    does not exist) and returns the effective Settings. Problems are logged
    once per distinct bad value and kept in `problems` for metrics.
    """

    def __init__(self) -> None:
        self.current = Settings()
        self.problems: dict[str, str] = {}
        self._reported: set[tuple[str, str]] = set()

    def update(self, data: Mapping[str, str] | None) -> Settings:
        raw = dict(data or {})
        for old, new in _KEY_ALIASES.items():
            if old in raw and new not in raw:
                raw[new] = raw.pop(old)
        known = Settings.keys()
        values = self.current.model_dump(by_alias=True)
        defaults = Settings().model_dump(by_alias=True)
        problems: dict[str, str] = {}
        for key in raw:
            if key not in known and key not in _KEY_ALIASES:
                problems[key] = "unknown key (ignored)"
        for key in known:
            if key not in raw:
                values[key] = defaults[key]  # a removed key returns to its default
                continue
            try:
                candidate = Settings.model_validate({**values, key: raw[key]})
            except ValidationError as error:
                problems[key] = f"{raw[key]!r}: {error.errors()[0]['msg']}; keeping {values[key]!r}"
                continue
            values[key] = candidate.model_dump(by_alias=True)[key]
        for key, problem in problems.items():
            if (key, problem) not in self._reported:
                self._reported.add((key, problem))
                log.warning("setting %s in ConfigMap %s: %s", key, CONFIGMAP_NAME, problem)
        self.problems = problems
        self.current = Settings.model_validate(values)
        return self.current
