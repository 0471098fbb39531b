"""spec.offline.storage in the job pod (poller/podstorage.py through podspec.build_pod)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from driver import protocol
from poller import api, podspec, podstorage
from poller.settings import Settings


def _spec(**fields: Any) -> api.LMEvalJobSpec:
    return api.LMEvalJobSpec.model_validate({"model": "hf", "tasks": ["arc_easy"], **fields})


def _pod(spec: api.LMEvalJobSpec, settings: Settings | None = None) -> dict[str, Any]:
    return podspec.build_pod(
        name="eval", namespace="ns", uid="u-1", spec=spec, settings=settings or Settings()
    )


def _main(pod: dict[str, Any]) -> dict[str, Any]:
    [main] = [c for c in pod["spec"]["containers"] if c["name"] == podspec.MAIN_CONTAINER]
    return main


def _env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in _main(pod)["env"] if "value" in e}


OFFLINE = {"storage": {"pvcName": "hf-cache"}}


def test_the_claim_is_mounted_read_only_as_the_hub_cache() -> None:
    pod = _pod(_spec(offline=OFFLINE))
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == podstorage.STORAGE_VOLUME]
    assert volume["persistentVolumeClaim"] == {"claimName": "hf-cache", "readOnly": True}
    [mount] = [m for m in _main(pod)["volumeMounts"] if m["name"] == podstorage.STORAGE_VOLUME]
    assert mount == {"name": "offline-storage", "mountPath": "/cache/storage", "readOnly": True}
    env = _env(pod)
    assert env["HF_HUB_CACHE"] == "/cache/storage/hub"
    # HF_HOME (and so the datasets Arrow cache) stays the writable emptyDir.
    assert env["HF_HOME"] == podspec.HF_HOME
    assert {"name": "hf-home", "emptyDir": {}} in pod["spec"]["volumes"]
    command = _main(pod)["command"]
    assert f"{protocol.OPT_HUB_DATASETS}=/cache/storage/hub" in command
    assert command.index(f"{protocol.OPT_HUB_DATASETS}=/cache/storage/hub") < command.index("--")


def test_offline_storage_runs_offline_even_when_online_is_allowed() -> None:
    settings = Settings(allow_online=True)
    online = _env(_pod(_spec(allowOnline=True), settings))
    assert "HF_HUB_OFFLINE" not in online
    stored = _env(_pod(_spec(allowOnline=True, offline=OFFLINE), settings))
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        assert stored[name] == "1"
    names = [e["name"] for e in _main(_pod(_spec(offline=OFFLINE)))["env"]]
    assert len(names) == len(set(names))


def test_without_offline_storage_nothing_changes() -> None:
    pod = _pod(_spec())
    assert podstorage.STORAGE_VOLUME not in {v["name"] for v in pod["spec"]["volumes"]}
    assert "HF_HUB_CACHE" not in _env(pod)
    assert not [w for w in _main(pod)["command"] if w.startswith(protocol.OPT_HUB_DATASETS)]


@pytest.mark.parametrize(
    "offline",
    [
        {"storage": {"pvcName": "Bad_Name"}},
        {"storage": {"pvcName": "-x"}},
        {"storage": {}},
        {},
        {"storage": {"pvcName": "ok", "path": "/x"}},
    ],
)
def test_bad_offline_specs_are_refused(offline: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        _spec(offline=offline)


def test_the_hub_cache_variable_is_the_pollers() -> None:
    with pytest.raises(ValidationError, match="HF_HUB_CACHE"):
        _spec(pod={"env": [{"name": "HF_HUB_CACHE", "value": "/elsewhere"}]})
