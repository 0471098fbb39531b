"""The poller's own connection (`poller.kube.transport`) against the real apiserver and kwok.

Checks: client-certificate and token kubeconfigs authenticate; pods/exec
through kwok returns the command's output (also when larger than a frame),
exit code 0 on success and an unknown (None) exit code with kwok's reason on
stderr when the command fails (kwok reports no exit code), None when the
command outlives the timeout; through `Kube`, a missing pod is NotFound and an
identity without pods/exec rights gets ApiError 403, each counted with its
code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from kubernetes import client
from lmeval_sandbox import kwok
from lmeval_sandbox.controlplane import ControlPlane
from lmeval_sandbox.identities import service_account_kubeconfig

from poller.kube.client import ApiError, Kube, NotFound
from poller.kube.transport import ApiTransport
from tests.cluster.test_controlplane import _main_state, _pod
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster


def test_authentication_and_exec_through_kwok(
    control_plane: ControlPlane, admin_api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    core = client.CoreV1Api(admin_api)
    core.create_namespaced_pod(namespace, _pod("target"))
    wait_for(
        lambda: (s := _main_state(core, namespace, "target")) and s.running, what="pod Running"
    )
    (tmp_path / "results.json").write_text(json.dumps({"results": {"t": {"acc,none": 0.5}}}))
    client.CustomObjectsApi(admin_api).create_namespaced_custom_object(
        "kwok.x-k8s.io",
        "v1alpha1",
        namespace,
        "execs",
        kwok.exec_body(
            namespace, "target", tmp_path, env={"PATH": f"{Path(sys.executable).parent}:/bin"}
        ),
    )
    counted: list[tuple[str, str, str]] = []
    with ApiTransport.from_kubeconfig(control_plane.kubeconfig) as admin:  # client certificate
        version = admin.request("GET", "/version")
        assert version.status == 200 and json.loads(version.data)["major"] == "1"
        kube = Kube(admin, on_request=lambda *args: counted.append(args))

        def cat() -> tuple[int | None, str, str] | None:
            done = kube.exec_in_pod(namespace, "target", "main", ["cat", "results.json"])
            return done if done[0] == 0 else None  # kwok may not have seen the Exec yet

        assert wait_for(cat, what="exec") == (0, (tmp_path / "results.json").read_text(), "")
        big = ["python", "-c", "print('é' * 200000)"]
        assert kube.exec_in_pod(namespace, "target", "main", big) == (0, "é" * 200000 + "\n", "")
        code, out, err = kube.exec_in_pod(namespace, "target", "main", ["cat", "missing"])
        assert (code, out) == (None, "")
        assert "No such file or directory" in err and "exit status 1" in err
        assert admin.exec(namespace, "target", "main", ["sleep", "5"], timeout=1) == (None, "", "")
        with pytest.raises(NotFound):
            kube.exec_in_pod(namespace, "no-such-pod", "main", ["true"])
    assert ("get", "pods/exec", "404") in counted
    assert all(code in ("101", "404") for _, _, code in counted)

    nobody = service_account_kubeconfig(control_plane, namespace, "default")  # token
    with ApiTransport.from_kubeconfig(nobody) as transport:
        counted.clear()
        with pytest.raises(ApiError) as refused:
            Kube(transport, on_request=lambda *a: counted.append(a)).exec_in_pod(
                namespace, "target", "main", ["true"]
            )
    assert refused.value.status == 403 and "pods/exec" in str(refused.value)
    assert counted == [("get", "pods/exec", "403")]
