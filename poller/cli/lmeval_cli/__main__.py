"""``lmeval`` (also ``kubectl lmeval``): submit, follow and compare evaluations, and read suites.

Why this module exists: it is the entry point of both console scripts and of
``python -m lmeval_cli``. It declares the commands and their flags, finds the
cluster the way kubectl does (``--kubeconfig``, ``--context``, ``-n``; the
global flags work before or after the command), runs the command, and turns
every failure into one line on stderr and a documented exit code.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import argcomplete

from lmeval_cli import (
    commands,
    completion,
    follow,
    output,
    selection,
    submit,
    suites,
    version,
    waitfor,
)
from lmeval_cli.client import Cluster, fetch_job, split_ref
from lmeval_cli.errors import ApiError, CliError, ExitCode, explain
from lmeval_cli.kubeconfig import connect
from lmeval_cli.render import Output
from poller.cliapi import api, buildinfo

__all__ = ["EXIT_CODES_HELP", "build_parser", "main"]

EXIT_CODES_HELP = """\
exit codes:
  0  success
  1  a job ended without meeting --for: Failed or Cancelled (wait, submit --wait);
     suite verify: a signed verdict failed verification, or none was verified
  2  wait (or delete --wait, submit --wait) timed out
  3  invalid flags, spec, file, -o format or template; request refused as invalid
  4  job or suite not found (the others named are still acted on), or the job
     has no pod, log or results yet; wait: no job matches -l
  5  the LMEvalJob (or LMEvalSuite) API is not installed on the cluster
  6  permission denied (RBAC, or an admission policy: its own message)
  7  kubeconfig, credentials or connection problem, other API errors
  8  an object the job names (results ConfigMap, pod) is not the job's: not shown
  130  interrupted (Ctrl-C; how list -w and get -w end)
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


def _no_headers(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-headers", action="store_true", help="tables without their header row (as kubectl)"
    )


def _watch(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-w",
        "--watch",
        action="store_true",
        help="after the table, print a line for every job that changes, until interrupted",
    )
    parser.add_argument(
        "--watch-only", action="store_true", help="as --watch, without the table first"
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
    _add_delete(sub)
    _add_suite(sub)
    _add_version(sub)
    _add_completion(sub)
    return parser


def _command(
    sub: _Commands,
    name: str,
    func: Command | LazyCommand,
    help_text: str,
    aliases: Sequence[str] = (),
    *,
    connects_lazily: bool = False,
    epilog: str = EXIT_CODES_HELP,
) -> argparse.ArgumentParser:
    """A command's parser: its help, the exit codes, the global flags and what runs it."""
    cmd = sub.add_parser(
        name,
        help=help_text,
        description=help_text,
        epilog=epilog,
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
    name = cmd.add_argument("name", help="the finished job (or NAMESPACE/NAME)")
    name.completer = completion.job_names  # type: ignore[attr-defined]
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
    output.add_output(cmd, output.OBJECT_FORMATS, "print the new job in this format")
    cmd.add_argument("--wait", action="store_true", help="follow the new job to its end")
    waitfor.add_wait_flags(cmd, timeout_default=None, prefix="with --wait: ")
    _interval(cmd)


def _add_list(sub: _Commands) -> None:
    cmd = _command(
        sub, "list", commands.cmd_list, "list jobs with state, progress and score", aliases=["ls"]
    )
    cmd.add_argument("-A", "--all-namespaces", action="store_true", help="jobs of every namespace")
    cmd.add_argument("-l", "--selector", help="label selector, e.g. team=nlp")
    output.add_output(cmd, ("wide", *output.OBJECT_FORMATS))
    _no_headers(cmd)
    _watch(cmd)
    _interval(cmd)


def _add_get(sub: _Commands) -> None:
    cmd = _command(
        sub,
        "get",
        commands.cmd_get,
        "show jobs: spec, conditions, events, results (-o for the objects, -w to watch them)",
    )
    selection.add_selection(cmd, verb="show")
    output.add_output(
        cmd, ("wide", *output.OBJECT_FORMATS), "wide: the jobs as rows of `list -o wide`"
    )
    _no_headers(cmd)
    _watch(cmd)
    _interval(cmd)


def _add_logs(sub: _Commands) -> None:
    cmd = _command(sub, "logs", _cmd_logs, "print the evaluation's log (markers hidden)")
    name = cmd.add_argument("name", help="job name (or NAMESPACE/NAME)")
    name.completer = completion.job_names  # type: ignore[attr-defined]
    cmd.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    cmd.add_argument("--raw", action="store_true", help="keep the driver's ::lmeval:: marker lines")
    cmd.add_argument("--tail", type=_number(int, 0), metavar="N", help="only the last N lines")
    _interval(cmd)


def _add_results(sub: _Commands) -> None:
    cmd = _command(sub, "results", commands.cmd_results, "print a job's scores")
    name = cmd.add_argument("name", help="job name (or NAMESPACE/NAME)")
    name.completer = completion.job_names  # type: ignore[attr-defined]
    output.add_output(cmd, output.TABLE_FORMATS, "default table")
    _no_headers(cmd)


def _add_compare(sub: _Commands) -> None:
    cmd = _command(
        sub,
        "compare",
        commands.cmd_compare,
        "compare jobs: for two with per-item scores, a paired significance test per task and "
        "metric (A = the first, the baseline; B = the second); else scores side by side",
    )
    names = cmd.add_argument(
        "names", nargs="+", metavar="NAME", help="job names (or NAMESPACE/NAME)"
    )
    names.completer = completion.job_names  # type: ignore[attr-defined]
    output.add_output(cmd, output.TABLE_FORMATS, "default table")
    # The older spelling of -o json: hidden, kept for scripts that use it.
    cmd.add_argument("--json", dest="output", action=_DeprecatedJson, help=argparse.SUPPRESS)
    _no_headers(cmd)
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


class _DeprecatedJson(argparse.Action):
    """``compare --json``: -o json, with a warning on stderr."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        sys.stderr.write("warning: --json is deprecated: use -o json\n")
        setattr(namespace, self.dest, output.Format("json"))


def _add_wait(sub: _Commands) -> None:
    cmd = _command(
        sub,
        "wait",
        _cmd_wait,
        "wait for jobs to meet a condition (by default: to succeed), with a progress bar",
    )
    selection.add_selection(cmd, verb="wait for", all_flag=True)
    waitfor.add_wait_flags(cmd, timeout_default=waitfor.WAIT_DEFAULT_TIMEOUT)
    _interval(cmd)


def _add_patch_commands(sub: _Commands) -> None:
    """cancel, suspend and resume: one patch of spec each, on any number of jobs."""
    for name, words in (
        ("cancel", "stop jobs for good (they end Complete/Cancelled)"),
        ("suspend", "pause jobs (their pods are deleted)"),
        ("resume", "resume suspended jobs (fresh pods)"),
    ):
        cmd = _command(sub, name, commands.cmd_patch, words)
        selection.add_selection(cmd, verb=name)
        output.add_output(cmd, output.OBJECT_FORMATS, "print the patched jobs")


def _add_delete(sub: _Commands) -> None:
    cmd = _command(
        sub,
        "delete",
        commands.cmd_delete,
        "delete jobs; their pods and results ConfigMaps go with them",
    )
    selection.add_selection(cmd, verb="delete", all_flag=True)
    cmd.add_argument(
        "--ignore-not-found",
        action="store_true",
        help="a name that matches no job is not an error",
    )
    cmd.add_argument(
        "--wait",
        nargs="?",
        const="true",
        default="true",
        type=_boolean,
        metavar="true|false",
        help="wait until the jobs are gone (default: true, as kubectl)",
    )
    cmd.add_argument(
        "--timeout",
        type=waitfor.timeout_arg,
        metavar="DURATION",
        help="with --wait: give up after this long (default: no limit; exit 2)",
    )
    output.add_output(cmd, ("name",), "only the names of the deleted jobs")
    _interval(cmd)


def _boolean(text: str) -> bool:
    lowered = text.lower()
    if lowered not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"true or false, not {text!r}")
    return lowered == "true"


SUITE_DESCRIPTION = """\
LMEvalSuites: evaluations that run again on a schedule, when the model
changes or by hand, each run judged against a baseline (Passed, Regressed or
Inconclusive). Its commands:
  `lmeval suite list`: NAME, VERDICT, TRIGGERS, LAST RUN, ACTIVE, AGE;
  `lmeval suite get NAME...`: the suite, its runs (trigger, revision or
    scheduled time, state, verdict, reason, baseline) and each run's criteria
    (tier, verdict, difference, p-value, documents paired, minimum detectable
    drop); -o json|yaml prints the object;
  `lmeval suite run NAME`: a run now (a new value of the run-requested
    annotation, which the poller acts on once);
  `lmeval suite verify NAME --key cosign.pub`: each kept run's signed
    verdict (its DSSE envelope, in ConfigMap <run>-attestation) verified
    with the key and checked against the status; exit 0 only when every one
    verified is OK and at least one was.
Each takes --help."""


def _add_suite(sub: _Commands) -> None:
    """`suite list|get|run|verify`: a command with commands of its own, as `kubectl config`."""
    cmd = _command(
        sub,
        "suite",
        _cmd_help,
        "LMEvalSuites: list them, show their runs and verdicts, ask for a run, verify the "
        "signed verdicts",
        aliases=[api.SUITE_SHORT_NAME],
        connects_lazily=True,
    )
    cmd.description = SUITE_DESCRIPTION
    cmd.set_defaults(help_parser=cmd)
    nested = cmd.add_subparsers(dest="suite_command", metavar="COMMAND", parser_class=_Parser)
    listed = _command(
        nested,
        "list",
        suites.cmd_suite_list,
        "list suites with their latest verdict, triggers, last run and active runs",
        aliases=["ls"],
    )
    suites.add_list_arguments(listed)
    shown = _command(
        nested,
        "get",
        suites.cmd_suite_get,
        "show suites: triggers, baseline rule, criteria, conditions, every run kept with "
        "its verdict and each criterion's numbers, events (-o for the objects)",
    )
    suites.add_get_arguments(shown)
    ran = _command(
        nested,
        "run",
        suites.cmd_suite_run,
        "ask for a run now: a new value of the suite's run-requested annotation (merge "
        "patch), which the poller acts on once",
    )
    suites.add_run_arguments(ran)
    verified = _command(
        nested,
        "verify",
        suites.cmd_suite_verify,
        "verify the runs' signed verdicts (spec.attestation) with a public key, and that "
        "each says what the suite's status records",
    )
    suites.add_verify_arguments(verified)


def _cmd_help(args: argparse.Namespace, _connect: Callable[[], Cluster], out: Output) -> int:
    """A command of commands, given none: its help, as kubectl prints it."""
    args.help_parser.print_help(out.stdout)
    return int(ExitCode.OK)


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


def _add_completion(sub: _Commands) -> None:
    cmd = _command(
        sub,
        "completion",
        completion.cmd_completion,
        "print a shell completion script (bash, zsh or fish)",
        connects_lazily=True,
        epilog=completion.SETUP_HELP + "\n" + EXIT_CODES_HELP,
    )
    completion.add_arguments(cmd)


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
    if args.wait_for.delete and args.names:
        # A job already gone has met --for=delete: nothing to look up first.
        selection.check_selection(args)
        targets = selection.refs(args, cluster)
        code = int(ExitCode.OK)
    else:
        chosen = selection.select_jobs(cluster, args)
        if not chosen.jobs and not chosen.missing:
            raise CliError(f"no LMEvalJobs match in {chosen.where}", ExitCode.NOT_FOUND)
        code = selection.report_missing(out, chosen)
        targets = [
            (str(j["metadata"]["namespace"]), str(j["metadata"]["name"])) for j in chosen.jobs
        ]
    if not targets:
        return code
    waited = follow.wait_jobs(
        cluster,
        out,
        targets,
        want=args.wait_for,
        timeout=args.timeout,
        interval=args.interval,
    )
    return code or waited


def _prog() -> str:
    called = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return "kubectl lmeval" if called.startswith("kubectl-") else "lmeval"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(_prog())
    # On Tab, the shell runs lmeval with the command line in its environment
    # (_ARGCOMPLETE): this answers and exits; otherwise it returns at once.
    argcomplete.autocomplete(parser)
    args = parser.parse_args(argv)
    out = Output()
    if args.command is None:  # bare `lmeval`: its help, as kubectl
        parser.print_help(sys.stdout)
        return ExitCode.OK
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
