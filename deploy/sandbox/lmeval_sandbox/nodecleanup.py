"""Leaving the machine as the real node found it: processes, mounts, cgroups, iptables.

`lmeval_sandbox.realnode` starts a kubelet, containerd and kube-proxy, which
make machine-wide things: containers in the ``kubepods`` cgroups, shims
that outlive containerd by design, overlay/shm/netns/tmpfs mounts, and
iptables chains (kube-proxy's, which its ``--cleanup`` removes, and the
kubelet's, which nothing removes). Each function here finds them by path,
cgroup or chain name rather than by what this process remembers, so a stop
after a crash (or from another process) cleans up as well as a normal one.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

__all__ = [
    "kill_cgroup_tree",
    "kill_shims",
    "leftovers",
    "remove_cgroup_tree",
    "remove_kube_chains",
    "run_quiet",
    "unmount_under",
]


def run_quiet(argv: list[str]) -> None:
    """Run a cleanup command; its failure (nothing to clean) is not an error."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(argv, capture_output=True, timeout=60)


def remove_kube_chains() -> None:
    """Remove the kubelet's own iptables chains (KUBE-FIREWALL, the canaries).

    kube-proxy's ``--cleanup`` removes its chains but not the kubelet's, and
    a stopped node must leave the machine's firewall as it found it.
    """
    for table in ("filter", "nat", "mangle"):
        try:
            listed = subprocess.run(
                ["iptables", "-t", table, "-S"], capture_output=True, text=True, timeout=30
            ).stdout.splitlines()
        except (OSError, subprocess.SubprocessError):
            return
        chains = [line.split()[1] for line in listed if line.startswith("-N KUBE-")]
        for line in listed:
            words = shlex.split(line)
            jumps_to_ours = "-j" in words and words[words.index("-j") + 1] in chains
            if words[:1] == ["-A"] and words[1] not in chains and jumps_to_ours:
                run_quiet(["iptables", "-t", table, "-D", *words[1:]])
        for chain in chains:
            run_quiet(["iptables", "-t", table, "-F", chain])
        for chain in chains:
            run_quiet(["iptables", "-t", table, "-X", chain])


def _cgroup_dirs(name: str) -> list[Path]:
    """Every directory of cgroup `name` in every v1 hierarchy, deepest first."""
    found: list[Path] = []
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        top = hierarchy / name
        if top.is_dir():
            found.extend(Path(path) for path, _, _ in os.walk(top))
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def kill_cgroup_tree(name: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids: set[int] = set()
        for directory in _cgroup_dirs(name):
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in (directory / "cgroup.procs").read_text().split())
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def remove_cgroup_tree(name: str) -> None:
    for directory in _cgroup_dirs(name):
        with contextlib.suppress(OSError):
            directory.rmdir()


def kill_shims(socket: Path) -> None:
    """SIGKILL the containerd shims of the containerd listening on `socket`."""
    for pid in _shims(socket):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def unmount_under(roots: list[Path]) -> None:
    """Detach every mount below `roots`, deepest first (overlays, shm, netns, tmpfs)."""
    for point in sorted(set(_mounts_under(roots)), key=len, reverse=True):
        run_quiet(["umount", "-l", point])


def _mounts_under(roots: list[Path]) -> list[str]:
    prefixes = [str(root) + "/" for root in roots]
    found: list[str] = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].encode().decode("unicode_escape")
            if any(point.startswith(prefix) for prefix in prefixes):
                found.append(point)
    return found


def _shims(socket: Path) -> list[int]:
    marker = str(socket).encode()
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"containerd-shim-runc-v2") and marker in argv:
            found.append(int(entry.name))
    return found


def leftovers(roots: list[Path], socket: Path, bridge: str) -> list[str]:
    """What a stopped node left behind (empty when `stop` did its job)."""
    found = [f"mount {point}" for point in _mounts_under(roots)]
    found += [f"shim pid {pid}" for pid in _shims(socket)]
    found += [f"cgroup {path}" for path in _cgroup_dirs("kubepods")]
    if Path(f"/sys/class/net/{bridge}").exists():
        found.append(f"bridge {bridge}")
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        rules = subprocess.run(
            ["iptables-save"], capture_output=True, text=True, timeout=30
        ).stdout.splitlines()
        found += [f"iptables {line}" for line in rules if "KUBE-" in line or bridge in line]
    return found
