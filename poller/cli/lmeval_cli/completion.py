"""``lmeval completion bash|zsh|fish``: shell completion, from the parser itself.

Why this module exists: kubectl's users press Tab. argcomplete (a
well-kept library that completes argparse parsers) writes the shell's side:
a small function that, on Tab, runs ``lmeval`` again with the command line
in its environment; ``main`` hands that run to ``argcomplete.autocomplete``
before parsing, which answers with the commands, flags and ``-o`` formats
the parser declares, and with the names of the namespace's jobs where a
command takes job names (:func:`job_names`; suites' names: :func:`suite_names`),
which asks the cluster of the ``--kubeconfig``/``--context``/``-n`` typed so
far, and offers nothing when it cannot. The same parser answers ``--help``
and completion, so they cannot drift apart.
"""

from __future__ import annotations

import argparse
from typing import Any

from argcomplete.shell_integration import shellcode

from lmeval_cli.render import Output

__all__ = ["SHELLS", "add_arguments", "cmd_completion", "job_names", "suite_names"]

SHELLS = ("bash", "zsh", "fish")
# The executable the shell completes (kubectl finds `kubectl lmeval` itself).
EXECUTABLE = "lmeval"

SETUP_HELP = """\
load it:
  bash:  source <(lmeval completion bash)     (add it to ~/.bashrc)
  zsh:   source <(lmeval completion zsh)      (after compinit, in ~/.zshrc)
  fish:  lmeval completion fish | source      (or save it in
         ~/.config/fish/completions/lmeval.fish)
"""


def add_arguments(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("shell", choices=SHELLS, help="the shell to complete in")


def cmd_completion(args: argparse.Namespace, _connect: Any, out: Output) -> int:
    """Print the script; no cluster is contacted."""
    out.write(shellcode([EXECUTABLE], shell=args.shell))
    return 0


def job_names(
    prefix: str = "", parsed_args: argparse.Namespace | None = None, **_: Any
) -> list[str]:
    """Job names in the namespace the command line points at, for completion.

    Any failure (no kubeconfig, no right to list, an unreachable server)
    offers nothing rather than an error in the middle of the prompt.
    """
    return _names("jobs", prefix, parsed_args)


def suite_names(
    prefix: str = "", parsed_args: argparse.Namespace | None = None, **_: Any
) -> list[str]:
    """Suite names in the namespace the command line points at (`lmeval suite get <Tab>`)."""
    return _names("suites", prefix, parsed_args)


def _names(kind: str, prefix: str, parsed_args: argparse.Namespace | None) -> list[str]:
    from lmeval_cli.client import Cluster
    from lmeval_cli.kubeconfig import connect

    def flag(name: str) -> str | None:
        value = getattr(parsed_args, name, None) if parsed_args is not None else None
        return value if isinstance(value, str) else None

    try:
        target = connect(flag("kubeconfig"), flag("context"), flag("namespace"))
    except Exception:
        return []
    try:
        cluster = Cluster(target.api_client, target.namespace, target.server)
        listed = (
            cluster.list_suites(target.namespace)
            if kind == "suites"
            else cluster.list_jobs(target.namespace)
        )
    except Exception:
        return []
    finally:
        target.api_client.close()  # type: ignore[no-untyped-call]
    names = sorted(str(o["metadata"]["name"]) for o in listed)
    return [n for n in names if n.startswith(prefix)]
