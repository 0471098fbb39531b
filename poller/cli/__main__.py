"""``lmeval`` (also ``kubectl lmeval``): submit, follow and compare evaluations.

Why this module exists: it is the entry point of both console scripts and of
``python -m poller.cli``. It declares the commands and their flags, finds the
cluster the way kubectl does (``--kubeconfig``, ``--context``, ``-n``; the
global flags work before or after the command), runs the command, and turns
every failure into one line on stderr and a documented exit code.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NoReturn

from poller import buildinfo
from poller.cli import commands, follow, submit, version
from poller.cli.client import Cluster, fetch_job, split_ref
from poller.cli.errors import ApiError, CliError, ExitCode, explain
from poller.cli.kubeconfig import connect
from poller.cli.render import Output

__all__ = ["EXIT_CODES_HELP", "build_parser", "main"]

EXIT_CODES_HELP = """\
exit codes:
  0  success
  1  the job ended Failed or Cancelled (wait, submit --wait)
  2  wait timed out
  3  invalid flags, spec or file; request refused as invalid
  4  job not found, or it has no pod, log or results yet
  5  the LMEvalJob API is not installed on the cluster
  6  permission denied (RBAC, or an admission policy: its own message)
  7  kubeconfig, credentials or connection problem, other API errors
  8  an object the job names (results ConfigMap, pod) is not the job's: not shown
"""

Command = Callable[[argparse.Namespace, Cluster, Output], int]
# A command that connects only if it needs the cluster (given how to connect).
LazyCommand = Callable[[argparse.Namespace, Callable[[], Cluster], Output], int]


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors exit with ExitCode.USAGE like every other bad input."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(ExitCode.USAGE, f"{self.prog}: error: {message}\n")


if TYPE_CHECKING:
    # Generic only in typeshed: subscripting it at run time raises TypeError.
    _Commands = argparse._SubParsersAction[_Parser]


def _global_flags(parser: argparse.ArgumentParser, *, top: bool) -> None:
    # On the commands, SUPPRESS keeps a flag given before the command from being reset.
    default = None if top else argparse.SUPPRESS
    group = parser.add_argument_group("cluster (as kubectl)")
    group.add_argument(
        "--kubeconfig",
        default=default,
        help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)",
    )
    group.add_argument("--context", default=default, help="kubeconfig context (default: current)")
    group.add_argument(
        "-n", "--namespace", default=default, help="namespace (default: the context's)"
    )


def _number(kind: type[int] | type[float], least: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least:g}")
        return value

    return parse


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.5 <= value < 1:
        raise argparse.ArgumentTypeError("must be at least 0.5 and below 1, e.g. 0.95")
    return value


def _interval(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--interval",
        type=_number(float, 0.1),
        default=1.0,
        metavar="SECONDS",
        help="how often to poll the cluster (default: %(default)s)",
    )


def _formats(parser: argparse.ArgumentParser, choices: list[str], default: str) -> None:
    parser.add_argument(
        "-o",
        "--output",
        choices=choices,
        default=default,
        help=f"output format: {', '.join(choices)}",
    )


def build_parser(prog: str = "lmeval") -> argparse.ArgumentParser:
    parser = _Parser(
        prog=prog,
        description="Submit LMEvalJobs (lm-evaluation-harness on Kubernetes), follow them, "
        "read their logs and compare their scores.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _global_flags(parser, top=True)
    parser.add_argument("--version", action=buildinfo.VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    # The order of these calls is the order of the commands in --help.
    _add_submit(sub)
    _add_rerun(sub)
    _add_list(sub)
    _add_get(sub)
    _add_logs(sub)
    _add_results(sub)
    _add_compare(sub)
    _add_wait(sub)
    _add_patch_commands(sub)
    _add_version(sub)
    return parser


def _command(
    sub: _Commands,
    name: str,
    func: Command | LazyCommand,
    help_text: str,
    aliases: Sequence[str] = (),
    *,
    connects_lazily: bool = False,
) -> argparse.ArgumentParser:
    """A command's parser: its help, the exit codes, the global flags and what runs it."""
    cmd = sub.add_parser(
        name,
        help=help_text,
        description=help_text,
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        aliases=aliases,
    )
    cmd.set_defaults(func=func, connects_lazily=connects_lazily)
    _global_flags(cmd, top=False)
    return cmd


def _add_submit(sub: _Commands) -> None:
    cmd = _command(sub, "submit", commands.cmd_submit, "create an LMEvalJob from flags or a file")
    submit.add_arguments(cmd)
    _interval(cmd)


def _add_rerun(sub: _Commands) -> None:
    cmd = _command(
        sub,
        "rerun",
        commands.cmd_rerun,
        "run a finished job again: a new job with its spec, annotated with the original",
    )
    cmd.add_argument("name", help="the finished job (or NAMESPACE/NAME)")
    cmd.add_argument(
        "--name",
        dest="new_name",
        metavar="NEW",
        help="the new job's name (default: the original's, plus a suffix the server picks)",
    )
    cmd.add_argument(
        "--dry-run",
        choices=["server"],
        help="server: validated by the apiserver and the admission policy, not created",
    )
    cmd.add_argument(
        "-o", "--output", choices=["yaml", "json", "name"], help="print the new job in this format"
    )
    cmd.add_argument("--wait", action="store_true", help="follow the new job to its end")
    cmd.add_argument(
        "--for",
        dest="wait_for",
        choices=["succeeded", "finished"],
        default="succeeded",
        help="with --wait: what to wait for (default: succeeded)",
    )
    cmd.add_argument("--timeout", help="with --wait: give up after this long (default: never)")
    _interval(cmd)


def _add_list(sub: _Commands) -> None:
    cmd = _command(
        sub, "list", commands.cmd_list, "list jobs with state, progress and score", aliases=["ls"]
    )
    cmd.add_argument("-A", "--all-namespaces", action="store_true", help="jobs of every namespace")
    cmd.add_argument("-l", "--selector", help="label selector, e.g. team=nlp")
    cmd.add_argument("-o", "--output", choices=["wide", "json", "yaml"], help="output format")


def _add_get(sub: _Commands) -> None:
    cmd = _command(sub, "get", commands.cmd_get, "show one job: spec, conditions, events, results")
    cmd.add_argument("name", help="job name (or NAMESPACE/NAME)")
    cmd.add_argument("-o", "--output", choices=["json", "yaml"], help="print the object instead")


def _add_logs(sub: _Commands) -> None:
    cmd = _command(sub, "logs", _cmd_logs, "print the evaluation's log (markers hidden)")
    cmd.add_argument("name", help="job name (or NAMESPACE/NAME)")
    cmd.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    cmd.add_argument("--raw", action="store_true", help="keep the driver's ::lmeval:: marker lines")
    cmd.add_argument("--tail", type=_number(int, 0), metavar="N", help="only the last N lines")
    _interval(cmd)


def _add_results(sub: _Commands) -> None:
    cmd = _command(sub, "results", commands.cmd_results, "print a job's scores")
    cmd.add_argument("name", help="job name (or NAMESPACE/NAME)")
    _formats(cmd, ["table", "json", "csv", "markdown"], "table")


def _add_compare(sub: _Commands) -> None:
    cmd = _command(
        sub,
        "compare",
        commands.cmd_compare,
        "compare jobs: for two with per-item scores, a paired significance test per task and "
        "metric (A = the first, the baseline; B = the second); else scores side by side",
    )
    cmd.add_argument("names", nargs="+", metavar="NAME", help="job names (or NAMESPACE/NAME)")
    _formats(cmd, ["table", "json", "csv", "markdown"], "table")
    cmd.add_argument(
        "--json", dest="output", action="store_const", const="json", help="same as -o json"
    )
    cmd.add_argument(
        "--task", action="append", metavar="TASK", help="compare only this task (repeatable)"
    )
    cmd.add_argument(
        "--metric",
        action="append",
        metavar="METRIC",
        help="compare only this metric: acc (any filter) or acc,none (repeatable)",
    )
    cmd.add_argument(
        "--confidence",
        type=_fraction,
        default=0.95,
        help="confidence level of the intervals; significant means p < 1 - it (default: 0.95)",
    )


def _add_wait(sub: _Commands) -> None:
    cmd = _command(sub, "wait", _cmd_wait, "wait for a job to end, with a progress bar")
    cmd.add_argument("name", help="job name (or NAMESPACE/NAME)")
    cmd.add_argument(
        "--for",
        dest="wait_for",
        choices=["succeeded", "finished"],
        default="succeeded",
        help="succeeded: exit 0 only on success (default); finished: exit 0 once it ended",
    )
    cmd.add_argument("--timeout", help="give up after this long, e.g. 10m (default: no limit)")
    _interval(cmd)


def _add_patch_commands(sub: _Commands) -> None:
    """cancel, suspend and resume: one patch of spec each, on any number of jobs."""
    for name, words in (
        ("cancel", "stop jobs for good (they end Complete/Cancelled)"),
        ("suspend", "pause jobs (their pods are deleted)"),
        ("resume", "resume suspended jobs (fresh pods)"),
    ):
        cmd = _command(sub, name, commands.cmd_patch, words)
        cmd.add_argument("names", nargs="+", metavar="NAME", help="job names")


def _add_version(sub: _Commands) -> None:
    # Lazily: the client's version is printed before (and without, with
    # --client) a kubeconfig, as `kubectl version` does.
    cmd = _command(
        sub,
        "version",
        version.cmd_version,
        "print the versions of this client, of Kubernetes and of the poller",
        connects_lazily=True,
    )
    version.add_arguments(cmd)


def _cmd_logs(args: argparse.Namespace, cluster: Cluster, out: Output) -> int:
    namespace, name = split_ref(args.name, cluster.namespace)
    job = fetch_job(cluster, name, namespace)
    return follow.show_logs(
        cluster,
        out,
        job,
        raw=args.raw,
        tail=args.tail,
        follow=args.follow,
        interval=args.interval,
    )


def _cmd_wait(args: argparse.Namespace, cluster: Cluster, out: Output) -> int:
    namespace, name = split_ref(args.name, cluster.namespace)
    return follow.wait_job(
        cluster,
        out,
        name,
        namespace,
        want=args.wait_for,
        timeout=follow.timeout_seconds(args.timeout),
        interval=args.interval,
    )


def _prog() -> str:
    called = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return "kubectl lmeval" if called.startswith("kubectl-") else "lmeval"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(_prog())
    args = parser.parse_args(argv)
    out = Output()
    if args.command is None:
        parser.print_help(sys.stderr)
        return ExitCode.USAGE
    target = None

    def connected() -> Cluster:
        nonlocal target
        target = connect(args.kubeconfig, args.context, args.namespace)
        return Cluster(target.api_client, target.namespace, target.server)

    try:
        if args.connects_lazily:
            return int(args.func(args, connected, out))
        cluster: Cluster | None = None
        if not (args.command == "submit" and args.dry_run == "client"):
            cluster = connected()
        return int(args.func(args, cluster, out))
    except CliError as error:
        out.note(f"error: {error.message}")
        return int(error.code)
    except ApiError as error:  # a request no command mapped itself
        mapped = explain(error)
        out.note(f"error: {mapped.message}")
        return int(mapped.code)
    except KeyboardInterrupt:
        out.note("interrupted")
        return int(ExitCode.INTERRUPTED)
    except BrokenPipeError:  # `lmeval logs x | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return int(ExitCode.OK)
    finally:
        if target is not None:
            target.api_client.close()  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    sys.exit(main())
