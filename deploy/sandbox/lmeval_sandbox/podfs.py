"""The pod as local files: the sandbox runner's pure helpers.

A pod on the sandbox node runs as local processes, so every container path
that a volume provides must become a path under the pod's own directory, in
argv, environment values and configMap file contents alike; `$(VAR)`
references expand as Kubernetes expands them; and the kubelet's rules for
termination messages and field references apply. None of this touches the
API or a process, which keeps it unit-testable (tests/e2e/test_runner_pieces.py).
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from driver import protocol

__all__ = [
    "HOST_IP",
    "TERMINATION_LINES",
    "ConfigError",
    "PathMapper",
    "clean_path",
    "copies_only",
    "expand_vars",
    "field_value",
    "local_argv",
    "termination_message",
    "volume_files",
]

HOST_IP = "127.0.0.1"


class ConfigError(Exception):
    """The container cannot be set up yet (CreateContainerConfigError)."""


# What the kubelet keeps of a failed container's log as its termination message.
TERMINATION_LINES = 80
TERMINATION_BYTES = 2048

# -- pure helpers ------------------------------------------------------------------

_PATH_TOKEN = re.compile(r"(?<![\w.\-/@+])/[\w.\-/@+]*")


class PathMapper:
    """Container paths to local paths, under one per-pod root directory.

    A path is mapped when a volume provides it (it is a mount path or lies
    below one) or when it is a parent directory of a mount path (lm_eval's
    ``--include_path=/opt/lmeval/tasks`` above ``/opt/lmeval/tasks/<cm>``).
    Every other absolute path is left alone: it would come from the image.
    """

    def __init__(
        self, root: Path, mount_paths: Iterable[str], shared: Mapping[str, Path] | None = None
    ) -> None:
        self.root = root
        self.mounts = sorted({clean_path(p) for p in mount_paths if clean_path(p) != "/"})
        # Mounts whose contents every pod sees at one local path (a ConfigMap's
        # files, `PodSetup`): what lies below them maps there, not under `root`.
        self.shared = {clean_path(k): v for k, v in (shared or {}).items()}
        parents: set[str] = set()
        for mount in self.mounts:
            parent = os.path.dirname(mount)
            while parent not in ("/", ""):
                parents.add(parent)
                parent = os.path.dirname(parent)
        self.parents = parents

    def maps(self, path: str) -> bool:
        clean = clean_path(path)
        if clean in self.parents:
            return True
        return any(clean == m or clean.startswith(m + "/") for m in self.mounts)

    def local(self, path: str) -> str:
        """The local path for container path `path` (unchanged when not mapped)."""
        if not path.startswith("/") or path.startswith("//") or not self.maps(path):
            return path
        clean = clean_path(path)
        for mount, local in self.shared.items():
            if clean == mount or clean.startswith(mount + "/"):
                return str(local) + clean[len(mount) :]
        return str(self.root) + path

    def rewrite(self, text: str) -> str:
        """`text` with every mapped absolute path in it replaced by its local path."""
        return _PATH_TOKEN.sub(lambda m: self.local(m.group(0)), text)


def clean_path(path: str) -> str:
    cleaned = os.path.normpath(path) if path else path
    return "/" if cleaned in ("//", "") else cleaned


_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.\-]*)\)")


def expand_vars(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined names replaced, ``$$`` is ``$``."""

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return _VAR_REF.sub(substitute, text)


_PYTHON = re.compile(r"^python(3(\.\d+)?)?$")


def local_argv(argv: Sequence[str], mapper: PathMapper, python: str) -> list[str]:
    """A container's argv as a local command line.

    ``lmeval-driver`` becomes ``<python> -m driver``, every ``python`` word
    becomes `python` (this interpreter, where lm_eval and the driver are
    installed), and mapped paths become local paths.
    """
    out: list[str] = []
    for index, word in enumerate(argv):
        if index == 0 and word == protocol.DRIVER_PROGRAM:
            out += protocol.driver_command(python)
        elif _PYTHON.match(word):
            out.append(python)
        else:
            out.append(mapper.rewrite(word))
    return out


def termination_message(lines: Iterable[str]) -> str:
    """The kubelet's FallbackToLogsOnError message: the log's last 80 lines / 2 KiB."""
    text = "\n".join(list(lines)[-TERMINATION_LINES:])
    data = text.encode("utf-8", "replace")[-TERMINATION_BYTES:]
    return data.decode("utf-8", "replace")


def copies_only(spec: dict[str, Any]) -> bool:
    command = [*spec.get("command", []), *spec.get("args", [])]
    return bool(command) and os.path.basename(command[0]) == "cp"


def volume_files(obj: dict[str, Any], secret: bool) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for key, value in (obj.get("data") or {}).items():
        files[key] = base64.b64decode(value) if secret else str(value).encode("utf-8")
    for key, value in (obj.get("binaryData") or {}).items():
        files[key] = base64.b64decode(value)
    for key, value in (obj.get("stringData") or {}).items():
        files[key] = str(value).encode("utf-8")
    return files


_FIELD = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


def field_value(obj: dict[str, Any], path: str) -> str:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.hostIP": HOST_IP,
        "status.hostIPs": HOST_IP,
        "status.podIP": "",
        "status.podIPs": "",
    }
    if path in simple:
        return str(simple[path])
    match = _FIELD.match(path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    raise ConfigError(f"fieldRef {path} is not supported here")
