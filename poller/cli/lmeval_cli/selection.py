"""Which jobs a command acts on: names, or ``-l/--selector`` (or ``--all``), as kubectl.

Why this module exists: ``get``, ``wait``, ``cancel``, ``suspend``,
``resume`` and ``delete`` take the same selection, and kubectl's users
expect its rules: several names, or a label selector, never both; ``-A``
widens a selector (or ``--all``) to every namespace, and cannot be combined
with names (a name is looked up in one namespace; ``NAMESPACE/NAME`` names
another). A name that matches no job does not stop the others: the command
acts on those that exist, reports each missing one (with the names it was
probably meant to be) and exits 4 at the end, as kubectl exits non-zero.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from lmeval_cli.client import Cluster, fetch_job, split_ref
from lmeval_cli.errors import ApiError, CliError, ExitCode, explain
from lmeval_cli.render import Output

__all__ = ["Selection", "add_selection", "none_found", "report_missing", "select_jobs"]


def add_selection(cmd: argparse.ArgumentParser, *, verb: str, all_flag: bool = False) -> None:
    """NAME..., -l/--selector, -A/--all-namespaces (and --all) on `cmd`."""
    names = cmd.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"the jobs to {verb} (or NAMESPACE/NAME, lmevaljob/NAME)",
    )
    # Shell completion offers the namespace's job names (lmeval_cli.completion).
    names.completer = _complete_names  # type: ignore[attr-defined]
    cmd.add_argument(
        "-l", "--selector", help=f"{verb} the jobs with these labels, e.g. team=nlp (not with NAME)"
    )
    cmd.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        help="with -l" + (" or --all" if all_flag else "") + ": in every namespace",
    )
    if all_flag:
        cmd.add_argument("--all", action="store_true", help=f"{verb} every job in the namespace")


def _complete_names(**kwargs: Any) -> list[str]:
    from lmeval_cli.completion import job_names  # only when completing

    return job_names(**kwargs)


def check_selection(args: argparse.Namespace) -> None:
    """Usage errors of the selection flags (exit 3)."""
    every = bool(getattr(args, "all", False))
    if args.names and (args.selector is not None or every):
        raise CliError(
            "give job names or "
            + ("-l/--all" if hasattr(args, "all") else "-l/--selector")
            + ", not both",
            ExitCode.USAGE,
        )
    if args.names and args.all_namespaces:
        raise CliError(
            "-A selects with -l in every namespace; a name is looked up in one namespace "
            "(-n NAMESPACE, or NAMESPACE/NAME)",
            ExitCode.USAGE,
        )
    if not args.names and args.selector is None and not every:
        more = ", -l SELECTOR or --all" if hasattr(args, "all") else " or -l SELECTOR"
        raise CliError(f"name the jobs (NAME...){more} (`lmeval list` shows them)", ExitCode.USAGE)


@dataclass
class Selection:
    """The jobs found, the errors of names that match none, and how they were chosen."""

    jobs: list[dict[str, Any]]
    missing: list[CliError] = field(default_factory=list)
    # One job asked for by name: machine formats print the object, not a List.
    single: bool = False
    where: str = ""


def refs(args: argparse.Namespace, cluster: Cluster) -> list[tuple[str, str]]:
    """(namespace, name) of the names given, in order, without duplicates."""
    found: list[tuple[str, str]] = []
    for ref in args.names:
        pair = split_ref(ref, cluster.namespace)
        if pair not in found:
            found.append(pair)
    return found


def select_jobs(
    cluster: Cluster, args: argparse.Namespace, *, ignore_not_found: bool = False
) -> Selection:
    """The jobs named, or matching -l (or --all); a missing name is kept in `missing`."""
    check_selection(args)
    if args.names:
        jobs, missing = [], []
        for namespace, name in refs(args, cluster):
            try:
                jobs.append(fetch_job(cluster, name, namespace))
            except CliError as error:
                if error.code != ExitCode.NOT_FOUND:
                    raise
                if not ignore_not_found:
                    missing.append(error)
        return Selection(jobs, missing, single=len(args.names) == 1)
    where_to: str | None = None if args.all_namespaces else cluster.namespace
    try:
        jobs = cluster.list_jobs(where_to, args.selector or None)
    except ApiError as error:
        raise explain(error) from error
    jobs.sort(key=lambda j: (j["metadata"].get("namespace", ""), j["metadata"]["name"]))
    where = "any namespace" if where_to is None else f"namespace {where_to}"
    return Selection(jobs, where=where)


def none_found(out: Output, selection: Selection) -> bool:
    """Say so (stderr, as kubectl) when a selector matched nothing; True if it did."""
    if selection.jobs or selection.missing:
        return False
    out.note(f"No LMEvalJobs found in {selection.where}.")
    return True


def report_missing(out: Output, selection: Selection) -> int:
    """Print each name that matched no job; the exit code for what was selected."""
    for error in selection.missing:
        out.note(f"error: {error.message}")
    return int(ExitCode.NOT_FOUND) if selection.missing else int(ExitCode.OK)
