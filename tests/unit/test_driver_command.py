"""The job pod starts the driver with a command line the driver reads as meant.

The pod spec builds the driver's argv through ``driver.protocol.run_argv``
and the exec'd release through ``release_argv``; the driver parses them with
the same constants. Here the poller's side is read back by the driver's own
parser, and the exact tokens are pinned (they are in every pod the poller
has ever made, so they must not drift).
"""

from __future__ import annotations

from typing import Any

import pytest

from driver import __main__ as driver_cli
from driver import protocol
from poller import api
from poller.api.settings import Settings
from poller.jobpod import podspec


def _spec(**fields: Any) -> api.LMEvalJobSpec:
    return api.LMEvalJobSpec.model_validate({"model": "hf", "tasks": ["arc_easy"], **fields})


def _main(pod: dict[str, Any]) -> dict[str, Any]:
    main: dict[str, Any] = pod["spec"]["containers"][0]
    return main


def test_pod_command_is_pinned() -> None:
    pod = podspec.build_pod(
        name="e",
        namespace="n",
        uid="u",
        spec=_spec(outputs={"pvcName": "evals"}),
        settings=Settings(**{"results-source": "exec", "driver-image": "reg/driver:1"}),
    )
    log = f"/outputs/{podspec.pod_name('e', 'u')}.log"
    assert _main(pod)["command"] == [
        "python",
        "-m",
        "driver",
        "--output-root=/outputs",
        "--grace-period=20",
        "--hold-seconds=300",
        f"--log-copy={log}",
        "--",
        "python",
        "-P",
        "-m",
        "lm_eval",
        "--model=hf",
        "--tasks=arc_easy",
        "--device=cpu",
    ]


@pytest.mark.parametrize(
    ("settings", "spec"),
    [
        pytest.param(Settings(), _spec(), id="log"),
        pytest.param(
            Settings(**{"results-source": "exec", "driver-image": "reg/driver:1"}),
            _spec(outputs={"pvcName": "evals"}),
            id="exec-claim-copied-driver",
        ),
    ],
)
def test_pod_command_round_trips_through_the_driver_parser(
    settings: Settings, spec: api.LMEvalJobSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(protocol.ENV_OUTPUT_ROOT, raising=False)
    monkeypatch.delenv(protocol.ENV_RUN_ID, raising=False)
    pod = podspec.build_pod(name="e", namespace="n", uid="u", spec=spec, settings=settings)
    command = _main(pod)["command"]
    driver = podspec.driver_command(settings)
    assert command[: len(driver)] == driver
    options = driver_cli.parse_run_options(command[len(driver) :])
    assert options.output_root == podspec.OUTPUT_ROOT
    assert options.grace_period == podspec.DRIVER_GRACE_SECONDS
    # The driver must finish reporting before the kubelet's SIGKILL.
    assert options.grace_period < pod["spec"]["terminationGracePeriodSeconds"]
    exec_mode = settings.results_source == "exec"
    assert options.hold_seconds == (podspec.EXEC_HOLD_SECONDS if exec_mode else 0.0)
    keeps_log = bool(spec.outputs and spec.outputs.pvc_name)
    assert (options.log_copy is not None) == keeps_log
    lm_eval = ["python", "-P", "-m", "lm_eval", *podspec.lm_eval_argv(spec, settings)]
    assert options.child_argv == lm_eval
    # `release` (through exec) finds the same root from the pod's environment.
    env = {e["name"]: e.get("value") for e in _main(pod)["env"]}
    assert env[protocol.ENV_OUTPUT_ROOT] == options.output_root


def test_release_through_exec_is_the_driver_release_command() -> None:
    for settings in (Settings(), Settings(**{"driver-image": "reg/driver:1"})):
        release = protocol.release_argv(podspec.driver_command(settings))
        driver = podspec.driver_command(settings)
        assert release == [*driver, protocol.CMD_RELEASE]
