"""``python -m lmeval_sandbox``: a local Kubernetes control plane for people.

``up`` builds (or reuses) the binaries, starts the plane in the background and
prints the kubeconfig and how to use it; ``status`` says what runs; ``down``
stops it. The processes outlive this command: their PIDs are in the work
directory's ``state.json``, which is what ``down`` reads. ``run`` does it all
for one real evaluation (see `lmeval_sandbox.demo`): plane, poller, local pod
runner, toy model server, a sample job, its results; ``--keep`` leaves them
up for ``down``. ``images`` builds (or reuses) the project's container images
for a real node (see `lmeval_sandbox.images`).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from lmeval_sandbox import build
from lmeval_sandbox.controlplane import ControlPlane, ControlPlaneError

# Not a fixed /tmp path: another local user could pre-create it.
DEFAULT_WORKDIR = Path(os.environ.get("LMEVAL_SANDBOX_DIR") or build.cache_root() / "sandbox")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def cmd_up(args: argparse.Namespace) -> int:
    workdir: Path = args.workdir
    state = ControlPlane.read_state(workdir)
    if state and any(_alive(int(pid)) for pid in state["pids"].values()):
        print(f"a sandbox already runs in {workdir}; `python -m lmeval_sandbox down` first")
        return 1
    plane = ControlPlane(workdir, kwok_nodes=args.nodes, die_with_parent=False)
    try:
        plane.start()
    except ControlPlaneError as error:
        print(f"sandbox failed to start: {error}", file=sys.stderr)
        return 1
    kubectl = plane.binaries / "kubectl" if plane.binaries else "kubectl"
    times = plane.times
    print(f"control plane ready in {times.total:.1f} s (binaries {times.binaries:.1f} s)")
    print(f"  kubeconfig: {plane.kubeconfig}")
    print(f"  server:     {plane.server}")
    print(f"  logs:       {plane.logs_dir}")
    print(f"  audit log:  {plane.audit.path}")
    print("use it:")
    print(f"  export KUBECONFIG={plane.kubeconfig}")
    print(f"  {kubectl} get nodes")
    print("stop it:")
    print("  python -m lmeval_sandbox down")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from lmeval_sandbox.realdemo import stop_real_node

    if ControlPlane.read_state(args.workdir) is None:
        print(f"no sandbox state in {args.workdir}")
        return 0
    if stop_real_node(args.workdir):
        print("real node stopped")
    ControlPlane(args.workdir).stop()
    print("sandbox stopped")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    state = ControlPlane.read_state(args.workdir)
    if state is None:
        print(f"no sandbox in {args.workdir}")
        return 1
    alive = {name: _alive(int(pid)) for name, pid in state["pids"].items()}
    for name, ok in alive.items():
        print(f"  {name:<24} {'running' if ok else 'stopped'} (pid {state['pids'][name]})")
    print(f"kubeconfig: {state['kubeconfig']}")
    return 0 if all(alive.values()) else 1


def cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from lmeval_sandbox import demo, realdemo

    workdir: Path = args.workdir
    hint = "python -m lmeval_sandbox down"
    if workdir != DEFAULT_WORKDIR:
        hint = f"python -m lmeval_sandbox --workdir {workdir} down"
    options = demo.DemoOptions(
        workdir=workdir,
        sample=args.sample,
        keep=args.keep,
        model_port=args.model_port,
        timeout=args.timeout,
        down_hint=hint,
        node=args.node,
    )
    console = Console(soft_wrap=True)
    if options.node == "real":
        return realdemo.run(options, console)
    return demo.run(options, console)


def cmd_build(_: argparse.Namespace) -> int:
    print(build.ensure_binaries())
    return 0


def cmd_images(args: argparse.Namespace) -> int:
    from lmeval_sandbox import images

    try:
        built = images.ensure_images()
    except images.ImageBuildError as error:
        print(f"image build failed: {error}", file=sys.stderr)
        return 1
    if args.json:
        print((built.directory / "images.json").read_text(), end="")
        return 0
    for image in built.all():
        mib = image.size_bytes / 2**20, image.archive_bytes / 2**20
        sizes = f"{mib[0]:7.1f} MiB ({mib[1]:.1f} MiB archived)"
        print(f"  {image.name:<7} {image.ref:<34} {sizes}  {image.archive}")
    print(f"described in {built.directory / 'images.json'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lmeval_sandbox",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=DEFAULT_WORKDIR,
        help="where state, PKI, logs and etcd data live (default: %(default)s)",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start a control plane in the background")
    up.add_argument("--nodes", type=int, default=2, help="kwok nodes to create")
    up.set_defaults(func=cmd_up)
    run = commands.add_parser(
        "run",
        help="start everything, run one real evaluation, show its results",
        description="Start the control plane, the poller, a local pod runner and a toy model "
        "server; apply a sample LMEvalJob from deploy/samples/; follow it to its results.",
    )
    run.add_argument(
        "--sample",
        default="served-model",
        help="served-model (local-completions against the toy server), dummy-model, "
        "chat-model (local-chat-completions with a system instruction), "
        "or a path to a YAML file with one LMEvalJob (default: %(default)s)",
    )
    run.add_argument("--keep", action="store_true", help="leave everything running afterwards")
    run.add_argument(
        "--model-port",
        type=int,
        default=8765,
        help="port of the toy model server; a free one is used if taken (default: %(default)s)",
    )
    run.add_argument(
        "--timeout", type=float, default=600.0, help="seconds to wait for the job to finish"
    )
    run.add_argument(
        "--node",
        choices=("local", "real"),
        default="local",
        help="local: the local pod runner plays the kubelet (fast, no root); real: our images "
        "on a real kubelet, containerd and runc, the poller deployed in-cluster (root; the "
        "first run installs the node's Debian packages, deploy/sandbox/node-packages.sh, and "
        "builds the images) (default: %(default)s)",
    )
    run.set_defaults(func=cmd_run)
    commands.add_parser("down", help="stop it (and what `run --keep` left)").set_defaults(
        func=cmd_down
    )
    commands.add_parser("status", help="show what runs").set_defaults(func=cmd_status)
    commands.add_parser(
        "build", help="build or find the binaries, print their directory"
    ).set_defaults(func=cmd_build)
    images = commands.add_parser(
        "images",
        help="build or find the container images (OCI archives), list them",
        description="Build the Python and busybox bases from Debian packages, the pause image "
        "and the Dockerfile's targets with buildah, export each as an OCI archive outside the "
        "clone (see deploy/sandbox/lmeval_sandbox/images.py). A second run with the same "
        "inputs does nothing.",
    )
    images.add_argument("--json", action="store_true", help="print images.json instead")
    images.set_defaults(func=cmd_images)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
