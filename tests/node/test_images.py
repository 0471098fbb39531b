"""The project's images (deploy/sandbox/lmeval_sandbox/images.py), run for real with runc.

Each image's OCI archive is copied into buildah's storage by skopeo, mounted,
and run as an OCI bundle by runc the way the restricted pod profile runs it:
an arbitrary UID in group 0, no capabilities, no new privileges, a read-only
root filesystem with tmpfs where a pod has emptyDirs, and a network namespace
of its own (no network at all).

The images are built once for the whole node suite (cached by their
inputs); like the rest of tests/node, these tests need root, buildah, skopeo
and runc (deploy/sandbox/node-packages.sh), and fail, never skip, without.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lmeval_sandbox import images

from poller import api
from poller.api.settings import Settings
from poller.jobpod import podspec

pytestmark = [pytest.mark.node]

UID = 100_123  # an arbitrary UID, as OpenShift assigns one, in group 0


@pytest.fixture(scope="module")
def image_set() -> images.ImageSet:
    return images.ensure_images()


class Mounted:
    """An image's root filesystem (mounted by buildah) and its config, from its archive.

    The archive is copied into buildah's storage under a name of the test's own:
    `buildah from oci-archive:` would retag the builder's images, which a
    concurrent `ensure_images` is about to push by name.
    """

    def __init__(self, image: images.Image, key: str) -> None:
        def run(*argv: str) -> str:
            done = subprocess.run(argv, capture_output=True, text=True, check=True)
            return done.stdout.strip()

        self._run = run
        self.name = f"localhost/lmeval-test/{image.name}:{key}"
        archive = f"oci-archive:{image.archive}"
        run("skopeo", "copy", "--quiet", archive, f"containers-storage:{self.name}")
        self.container = run("buildah", "from", "--quiet", "--pull-never", self.name)
        self.root = Path(run("buildah", "mount", self.container))
        inspected = json.loads(run("buildah", "inspect", "--type", "container", self.container))
        self.config: dict[str, Any] = inspected["OCIv1"]["config"]

    def close(self) -> None:
        self._run("buildah", "rm", self.container)
        self._run("buildah", "rmi", self.name)  # only a name when the builder's image is the same


@pytest.fixture(scope="module")
def mounted(image_set: images.ImageSet) -> Iterator[dict[str, Mounted]]:
    opened: dict[str, Mounted] = {}
    try:
        for image in image_set.all():
            opened[image.name] = Mounted(image, image_set.key)
        yield opened
    finally:
        for each in opened.values():
            each.close()


def _bundle(
    directory: Path, image: Mounted, argv: list[str], tmpfs: list[str], binds: dict[str, str]
) -> None:
    subprocess.run(["runc", "spec"], cwd=directory, check=True)
    spec = json.loads((directory / "config.json").read_text())
    process = spec["process"]
    process["terminal"] = False
    process["args"] = argv
    process["user"] = {"uid": UID, "gid": 0}
    process["env"] = image.config.get("Env") or ["PATH=/usr/bin:/bin"]
    process["cwd"] = image.config.get("WorkingDir") or "/"
    process["noNewPrivileges"] = True
    process["capabilities"] = {k: [] for k in ("bounding", "effective", "permitted")}
    spec["root"] = {"path": str(image.root), "readonly": True}
    spec["mounts"] += [
        {"destination": path, "type": "tmpfs", "source": "tmpfs", "options": ["mode=1777"]}
        for path in tmpfs
    ]
    spec["mounts"] += [
        {"destination": inside, "type": "bind", "source": outside, "options": ["rbind", "ro"]}
        for inside, outside in binds.items()
    ]
    spec["hostname"] = "pod"
    (directory / "config.json").write_text(json.dumps(spec))


def run(
    tmp_path: Path,
    image: Mounted,
    argv: list[str],
    tmpfs: tuple[str, ...] = ("/tmp",),
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run `argv` in `image` and wait for it."""
    bundle = tmp_path / f"bundle-{uuid.uuid4().hex[:8]}"
    bundle.mkdir()
    _bundle(bundle, image, argv, list(tmpfs), {})
    return subprocess.run(
        ["runc", "run", "--bundle", str(bundle), f"lmeval-test-{bundle.name}"],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _children(pid: int) -> list[tuple[int, str]]:
    """The host's view of `pid`'s children: (pid, state letter)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == pid:
            found.append((int(stat.parent.name), fields[0]))
    return found


def _command(image: Mounted) -> list[str]:
    return list(image.config.get("Entrypoint") or []) + list(image.config.get("Cmd") or [])


def test_every_image_is_described(image_set: images.ImageSet) -> None:
    described = json.loads((image_set.directory / "images.json").read_text())
    assert set(described["images"]) == set(images.IMAGE_NAMES)
    for image in image_set.all():
        assert image.ref == f"lmeval-poller/{image.ref.split('/', 1)[1]}"
        assert image.ref.endswith(f":{images.TAG}")
        assert image.archive.stat().st_size == image.archive_bytes
        assert image.size_bytes >= image.archive_bytes // 2


def test_poller_image_runs_its_entrypoint(tmp_path: Path, mounted: dict[str, Mounted]) -> None:
    poller = mounted["poller"]
    assert poller.config["Entrypoint"] == ["lmeval-poller"]
    done = run(tmp_path, poller, ["lmeval-poller", "--help"])
    assert done.returncode == 0, done.stderr
    assert "--metrics-port" in done.stdout
    # The operator's distribution and the driver's (the contract): no CLI, no
    # sandbox, none of their dependencies (kubernetes, rich).
    code = (
        "import importlib.util as u, importlib.metadata as m; "
        "print(sorted(n for n in ('lmeval_cli', 'lmeval_sandbox', 'kubernetes', 'rich')"
        " if u.find_spec(n)),"
        " sorted(d.name for d in m.distributions() if d.name.startswith('lmeval')))"
    )
    done = run(tmp_path, poller, ["python", "-c", code])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[] ['lmeval-driver', 'lmeval-operator']", done.stdout


def test_job_image_runs_the_driver_and_lm_eval(tmp_path: Path, mounted: dict[str, Mounted]) -> None:
    job = mounted["job"]
    writable = ("/tmp", podspec.HF_HOME, podspec.OUTPUT_ROOT)
    done = run(tmp_path, job, _command(job), writable)
    assert done.returncode == 0, done.stderr
    assert "lmeval-driver" in done.stdout or "usage" in done.stdout.lower()
    code = "import lm_eval, lm_eval.models.openai_completions; print(lm_eval.__file__)"
    done = run(tmp_path, job, ["python", "-c", code], writable, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("/opt/lmeval/")
    # The job image holds the driver and lm-eval, nothing of the operator's.
    code = "import importlib.util as u; print(u.find_spec('poller'))"
    done = run(tmp_path, job, ["python", "-c", code], writable)
    assert done.returncode == 0 and done.stdout.strip() == "None", done.stdout + done.stderr


def test_model_server_image_serves_the_sample_model(
    tmp_path: Path, mounted: dict[str, Mounted]
) -> None:
    server = mounted["model_server"]
    done = run(tmp_path, server, [*_command(server), "--help"])
    assert done.returncode == 0, done.stderr
    assert "--port" in done.stdout


def test_driver_image_feeds_the_init_container(tmp_path: Path, mounted: dict[str, Mounted]) -> None:
    driver = mounted["driver"]
    assert (driver.root / podspec.DRIVER_IMAGE_SOURCE.lstrip("/") / "__main__.py").is_file()
    settings = Settings.model_validate({"driver-image": "registry.example/lmeval-driver:test"})
    pod = podspec.build_pod(
        name="j",
        namespace="ns",
        uid="u",
        spec=api.LMEvalJobSpec(model="dummy", tasks=["t"]),
        settings=settings,
    )
    (init,) = pod["spec"]["initContainers"]
    copy = " ".join(init["command"])
    check = f"{copy} && ls {podspec.DRIVER_MOUNT}/driver/__main__.py"
    done = run(tmp_path, driver, ["sh", "-c", check], ("/tmp", podspec.DRIVER_MOUNT))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{podspec.DRIVER_MOUNT}/driver/__main__.py"


def test_pause_image_holds_the_sandbox_and_reaps(
    tmp_path: Path, mounted: dict[str, Mounted]
) -> None:
    pause = mounted["pause"]
    assert _command(pause) == ["/pause"]
    bundle = tmp_path / "pause-bundle"
    bundle.mkdir()
    # A static busybox bound in, only to leave an orphan behind for pause to reap.
    binds = {"/busybox": str(images.BUSYBOX)}
    _bundle(bundle, pause, ["/pause"], [], binds)
    name = f"lmeval-test-pause-{uuid.uuid4().hex[:8]}"
    started = subprocess.Popen(
        ["runc", "run", "--bundle", str(bundle), name],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        pid = 0
        for _ in range(100):
            state = subprocess.run(["runc", "state", name], capture_output=True, text=True)
            if state.returncode == 0 and json.loads(state.stdout)["status"] == "running":
                pid = json.loads(state.stdout)["pid"]
                break
            time.sleep(0.1)
        assert pid, "the pause container never ran"
        # The shell exits at once; its background sleep (holding no pipe of
        # runc's, which would keep `runc exec` waiting) is re-parented to pause.
        script = "/busybox sleep 1 </dev/null >/dev/null 2>&1 &"
        orphan = ["runc", "exec", name, "/busybox", "sh", "-c", script]
        done = subprocess.run(orphan, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        time.sleep(0.3)
        assert [state for _, state in _children(pid)] == ["S"], "no orphan re-parented"
        time.sleep(1.5)
        assert _children(pid) == [], "pause left its dead child a zombie"
        subprocess.run(["runc", "kill", name, "TERM"], check=True)
        assert started.wait(timeout=10) == 0, started.stderr.read() if started.stderr else ""
    finally:
        if started.poll() is None:
            started.send_signal(signal.SIGKILL)
            subprocess.run(["runc", "delete", "--force", name], capture_output=True)
