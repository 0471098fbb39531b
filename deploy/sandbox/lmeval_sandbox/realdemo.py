"""``python -m lmeval_sandbox run --node real``: the sample job on a real kubelet.

The default ``run`` (`lmeval_sandbox.demo`) plays the kubelet with local
processes; this mode runs what a cluster runs: our images built from the
Dockerfile (`lmeval_sandbox.images`), a real node (containerd, runc, CNI, a
kubelet and kube-proxy, `lmeval_sandbox.realnode`), and the poller deployed
with ``kubectl apply -k`` of ``deploy/`` from its own image, in-cluster. The
sample is applied *without* its sandbox placement block, as a user applies a
job on their cluster: it lands on the real node (kwok's nodes are tainted
out of reach). The served-model sample's toy model server runs as a sidecar
of the job pod, from the job image, so the job's ``base_url`` stays
``127.0.0.1:8765``.

It needs root and a few Debian packages; ``deploy/sandbox/setup.sh sandbox``
(what ``deploy/sandbox/run.sh`` sources) prepares neither, so `prepare_node`
installs the packages here on first use (``deploy/sandbox/node-packages.sh``)
and says so, and the images build on first use too (cached by their
inputs). Its output and exit codes are the default mode's.
"""

from __future__ import annotations

import copy
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml
from lmeval_cli.client import Cluster
from rich.console import Console

from lmeval_sandbox import demo, images
from lmeval_sandbox.bringup import DemoError, clean_workdir
from lmeval_sandbox.controlplane import ControlPlane
from lmeval_sandbox.deployed import apply_job_namespace, apply_poller
from lmeval_sandbox.identities import api_client
from lmeval_sandbox.realnode import NodeImage, RealNode, missing_prerequisites
from poller import api

__all__ = [
    "NODE_WORKDIR",
    "model_server_sidecar",
    "prepare_node",
    "real_node_documents",
    "run",
    "run_on_real_node",
    "stop_real_node",
]

NODE_WORKDIR = "node"
SETTINGS = {"poll-interval": "1s", "progress-interval": "2s"}
NODE_PACKAGES = Path(__file__).resolve().parents[3] / "deploy" / "sandbox" / "node-packages.sh"
# Besides what the node runs (realnode.PREREQUISITES), what the image builds
# run (images.py), with the Debian package of each: node-packages.sh installs
# all of them.
IMAGE_TOOLS = {
    "/usr/bin/buildah": "buildah",
    "/usr/bin/mmdebstrap": "mmdebstrap",
    "/bin/busybox": "busybox-static",
}


def model_server_sidecar(image: str, *, delay: str = "", hold_file: str = "") -> dict[str, Any]:
    """The sample model server as a sidecar of the job pod, from `image` (the
    model-server image, images.py), on the port the sample's ``base_url`` names;
    `delay` slows each answer (seconds); with `hold_file` (a path in the
    sidecar's /tmp), no answer comes until that file exists."""
    args = ["--host", "127.0.0.1", "--port", str(demo.MODEL_SERVER_PORT)]
    if delay:
        args += ["--delay", delay]
    if hold_file:
        args += ["--hold-file", hold_file]
    return {"name": "model", "image": image, "args": args}


def real_node_documents(sample: str, model_server_image: str) -> list[dict[str, Any]]:
    """The sample as a user would apply it: no placement; the model server as a sidecar."""
    documents = copy.deepcopy(demo.sample_documents(sample, demo.MODEL_SERVER_PORT))
    for document in documents:
        if document.get("kind") != api.KIND:
            continue
        spec = document["spec"]
        spec.pop("pod", None)
        if spec.get("model") in ("local-completions", "local-chat-completions"):
            spec["pod"] = {"sidecars": [model_server_sidecar(model_server_image)]}
    return documents


def missing_packages() -> list[str]:
    """Debian packages the real node or the image builds need and lack (empty: none)."""
    tools = {package for path, package in IMAGE_TOOLS.items() if not Path(path).exists()}
    return sorted(tools.union(missing_prerequisites()))


def prepare_node(console: Console, *, euid: int | None = None) -> None:
    """Make sure this machine can run the real node, installing what it lacks.

    The sandbox profile of setup.sh (what ``deploy/sandbox/run.sh`` sources)
    leaves out what only this mode needs, so that the default ``run`` neither
    needs root nor touches the machine's packages. Here, as root, the node's
    Debian packages are installed on first use, with a line that says so;
    without root nothing can start, and the message says how to run it.
    """
    if (os.geteuid() if euid is None else euid) != 0:
        raise DemoError(
            "--node real starts containerd, runc and a kubelet on this machine and builds "
            "images with buildah: run it as root (in a root shell: bash deploy/sandbox/run.sh "
            "--node real)"
        )
    missing = missing_packages()
    if missing:
        console.print(
            f"[yellow]first run on a real node:[/] installing the Debian packages it needs "
            f"({' '.join(missing)}) with deploy/sandbox/node-packages.sh"
        )
        with demo.step(console, "real node's Debian packages installed"):
            done = subprocess.run(
                ["bash", str(NODE_PACKAGES)], capture_output=True, text=True, check=False
            )
            still = missing_packages()
            if done.returncode != 0 or still:
                tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
                raise DemoError(
                    f"deploy/sandbox/node-packages.sh did not install {' '.join(still or missing)}"
                    f" (exit code {done.returncode}):\n{tail}"
                )
    if images.cached() is None:
        console.print(
            "[yellow]first run on a real node:[/] building our images from the Dockerfile "
            "(about 3 minutes on 2 cores; cached by their inputs in ~/.cache/lmeval-poller after)"
        )


class _NodeWatch:
    """What `demo.follow` checks each tick: the node's processes are alive."""

    def __init__(self, node: RealNode) -> None:
        self.node = node

    def check(self) -> None:
        for name, alive in self.node.running().items():
            if not alive:
                raise DemoError(f"{name} of the real node exited\n{self.node.log_tail(name)}")


def run(options: demo.DemoOptions, console: Console) -> int:
    """The whole command on the real node, its errors worded; returns the exit code."""
    return demo.guarded(lambda: run_on_real_node(options, console), console)


def run_on_real_node(options: demo.DemoOptions, console: Console) -> int:
    """The whole command on a real node; returns the exit code."""
    begin = time.monotonic()
    plane: ControlPlane | None = None
    node: RealNode | None = None
    keep = False
    try:
        prepare_node(console)
        clean_workdir(options.workdir)
        with demo.step(console, "images built from the Dockerfile (cached by their inputs)"):
            built = images.ensure_images()
        plane = ControlPlane(options.workdir, kwok_nodes=1, die_with_parent=False, real_node=True)
        with demo.step(
            console, "local control plane (etcd, apiserver, controller-manager, scheduler, kwok)"
        ):
            plane.start()
        node = RealNode(plane, options.workdir / NODE_WORKDIR, die_with_parent=False)
        with demo.step(console, "real node (containerd, runc, kubelet, kube-proxy, registry)"):
            node.start(
                [NodeImage(image.archive, image.ref) for image in built.all()],
                pause=built.pause.ref,
            )
        refs = {image.name: node.image(image.ref) for image in built.all()}
        with demo.step(console, "poller deployed with kubectl apply -k deploy/ (in-cluster)"):
            apply_poller(
                plane,
                options.workdir / "overlay",
                poller_image=refs["poller"],
                settings={**SETTINGS, "pod-image": refs["job"]},
            )
            apply_job_namespace(plane, options.workdir / "namespace", demo.DEMO_NAMESPACE)
        documents = real_node_documents(options.sample, refs["model_server"])
        job_name = next(d["metadata"]["name"] for d in documents if d.get("kind") == api.KIND)
        plane.kubectl(
            "apply",
            "-n",
            demo.DEMO_NAMESPACE,
            "-f",
            "-",
            input_text=yaml.safe_dump_all(documents),
        )
        console.print(f"[green]✓[/] applied sample {options.sample} (no placement: any node)")
        console.print(f"following LMEvalJob [bold]{demo.DEMO_NAMESPACE}/{job_name}[/]:")
        evaluation_begin = time.monotonic()
        with api_client(plane.kubeconfig) as admin:
            cluster = Cluster(admin, demo.DEMO_NAMESPACE)
            status = demo.follow(cluster, job_name, console, options.timeout, _NodeWatch(node))
            succeeded = demo.show_outcome(console, cluster, status)
        pod = status.get("podName") or ""
        where = plane.kubectl(
            "get",
            "pod",
            pod,
            "-n",
            demo.DEMO_NAMESPACE,
            "-o",
            "jsonpath={.spec.nodeName}",
            check=False,
        ).stdout
        console.print(
            f"finished in {time.monotonic() - begin:.0f} s: evaluation "
            f"{time.monotonic() - evaluation_begin:.0f} s on node {where or '(pod gone)'}"
        )
        keep = options.keep
        if keep:
            console.print(f"\nthe sandbox keeps running:\n  export KUBECONFIG={plane.kubeconfig}")
            console.print(f"stop it:\n  {options.down_hint}", highlight=False)
        return 0 if succeeded else 1
    finally:
        if not keep:
            if node is not None:
                node.stop()
            if plane is not None:
                plane.stop()
                console.print("sandbox stopped")


def stop_real_node(workdir: Path) -> bool:
    """Stop the real node a ``run --node real --keep`` left (for ``down``)."""
    node_dir = workdir / NODE_WORKDIR
    if not (node_dir / "state.json").exists():
        return False
    plane = ControlPlane(workdir, real_node=True)
    RealNode(plane, node_dir).stop()
    return True
