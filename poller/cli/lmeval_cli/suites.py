"""``lmeval suite list|get|run|verify``: read LMEvalSuites, ask one for a run, check its verdicts.

Why this module exists: a suite (``poller.api.suite``) is a second kind,
with a record of its own: its runs, each judged against a baseline, live in
its status, which only the poller writes. People want three things of it
from the command line: which suites stand where (``list``), why a run got
its verdict (``get``: the runs, their baselines and every criterion's
numbers), and a run now, without waiting for the schedule or a new model
(``run``). The last is a request, not an action: the CLI sets the
annotation ``api.RUN_REQUESTED_ANNOTATION`` to a value never used before (a
timestamp and random hex), with a JSON merge patch, and the poller starts
one run for each new value it sees (`poller.decisions.suites`), subject to
the suite's ``suspend`` and ``concurrencyPolicy``; the command says which
of those will hold it. Everything else follows the job commands: the same
cluster flags, ``-o`` vocabulary, errors and exit codes, a missing suite
reported with the names it was probably meant to be.

``verify`` checks the runs' signed verdicts (``spec.attestation``) with the
public key a person trusts; the checks are `lmeval_cli.suiteverify`'s,
imported only when it runs (it loads ``cryptography``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import secrets
from typing import Any

from lmeval_cli import facts, output, render, suiteview
from lmeval_cli.client import Cluster, fetch_suite, split_suite_ref
from lmeval_cli.errors import ApiError, CliError, ExitCode, explain, suggest
from poller.cliapi import api, timefmt

__all__ = [
    "add_get_arguments",
    "add_list_arguments",
    "add_run_arguments",
    "add_verify_arguments",
    "cmd_suite_get",
    "cmd_suite_list",
    "cmd_suite_run",
    "cmd_suite_verify",
    "request_token",
]

_KIND = api.SUITE_KIND
_REF_HELP = f"(or NAMESPACE/NAME, {api.SUITE_SHORT_NAME}/NAME)"


def _call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except ApiError as error:
        raise explain(error) from error


def _complete_names(**kwargs: Any) -> list[str]:
    from lmeval_cli.completion import suite_names  # only when completing

    return suite_names(**kwargs)


# -- flags -------------------------------------------------------------------------


def add_list_arguments(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument(
        "-A", "--all-namespaces", action="store_true", help="suites of every namespace"
    )
    cmd.add_argument("-l", "--selector", help="label selector, e.g. team=nlp")
    output.add_output(cmd, ("wide", *output.OBJECT_FORMATS), "wide: adds MESSAGE")
    cmd.add_argument(
        "--no-headers", action="store_true", help="tables without their header row (as kubectl)"
    )


def add_get_arguments(cmd: argparse.ArgumentParser) -> None:
    names = cmd.add_argument(
        "names", nargs="+", metavar="NAME", help=f"the suites to show {_REF_HELP}"
    )
    names.completer = _complete_names  # type: ignore[attr-defined]
    output.add_output(cmd, output.OBJECT_FORMATS, "print the suites themselves")


def add_run_arguments(cmd: argparse.ArgumentParser) -> None:
    name = cmd.add_argument("name", help=f"the suite {_REF_HELP}")
    name.completer = _complete_names  # type: ignore[attr-defined]
    output.add_output(cmd, output.OBJECT_FORMATS, "print the patched suite")


def add_verify_arguments(cmd: argparse.ArgumentParser) -> None:
    name = cmd.add_argument("name", metavar="NAME", help=f"the suite {_REF_HELP}")
    name.completer = _complete_names  # type: ignore[attr-defined]
    cmd.add_argument(
        "--key",
        required=True,
        metavar="PUBKEY.pem",
        help="the public key of the suite's signing key, which you trust (cosign.pub: PEM, "
        "ECDSA P-256)",
    )
    cmd.add_argument(
        "--run", metavar="RUN", help="only this run (default: every run the status keeps)"
    )
    output.add_output(cmd, ("json", "yaml"), "print the verified statements (a list)")


# -- list --------------------------------------------------------------------------


def _print_suites(
    out: render.Output,
    args: argparse.Namespace,
    suites: list[dict[str, Any]],
    *,
    all_namespaces: bool,
) -> None:
    """The suites as a table (-o wide: with MESSAGE), or in an object format (a List)."""
    fmt: output.Format | None = args.output
    if fmt is not None and fmt.name != "wide":
        output.print_objects(
            out,
            fmt,
            suites,
            single=False,
            no_headers=args.no_headers,
            resource=output.SUITE_RESOURCE,
        )
        return
    grid = suiteview.suites_grid(
        suites, all_namespaces=all_namespaces, wide=fmt is not None, now=timefmt.now()
    )
    out.show(render.grid_table(grid, right=suiteview.SUITES_RIGHT, show_header=not args.no_headers))


def cmd_suite_list(args: argparse.Namespace, cluster: Cluster, out: render.Output) -> int:
    namespace = None if args.all_namespaces else cluster.namespace
    found: list[dict[str, Any]] = _call(cluster.list_suites, namespace, args.selector)
    found.sort(key=lambda s: (s["metadata"].get("namespace", ""), s["metadata"]["name"]))
    # Like kubectl: an empty List in json/yaml/jsonpath, a remark on stderr otherwise.
    if not found and (args.output is None or args.output.name not in ("json", "yaml", "jsonpath")):
        where = "any namespace" if namespace is None else f"namespace {namespace}"
        out.note(f"No {_KIND}s found in {where}.")
        return ExitCode.OK
    _print_suites(out, args, found, all_namespaces=namespace is None)
    return ExitCode.OK


# -- get ---------------------------------------------------------------------------


def _live_runs(cluster: Cluster, suite: dict[str, Any]) -> dict[str, str]:
    """Each run going on with its job's own state ("Running 40%"), read now.

    Only the job the status names, by name and UID (a job deleted and made
    again under the run's name is not the run); a run that cannot be read
    is shown as the status has it.
    """
    namespace = str(suite["metadata"]["namespace"])
    live: dict[str, str] = {}
    for run in suiteview.runs(suite):
        if run.get("state") != "Active" or not run.get("name"):
            continue
        try:
            job = cluster.get_job(str(run["name"]), namespace)
        except ApiError:
            continue
        if run.get("uid") and job["metadata"].get("uid") != run["uid"]:
            continue
        progress = facts.progress_text(job)
        live[str(run["name"])] = facts.state(job) + ("" if progress == "-" else f" {progress}")
    return live


def _describe(cluster: Cluster, out: render.Output, suite: dict[str, Any]) -> None:
    meta = suite["metadata"]
    name, namespace = str(meta["name"]), str(meta["namespace"])
    events: list[dict[str, Any]] | None
    note = ""
    try:
        events = cluster.list_events(name, namespace, str(meta.get("uid") or ""), kind=_KIND)
    except ApiError as error:
        events, note = None, f"(not shown: {explain(error).message})"
    live = _live_runs(cluster, suite)
    for part in suiteview.details(suite, events, note, timefmt.now(), live):
        out.show(part)


def cmd_suite_get(args: argparse.Namespace, cluster: Cluster, out: render.Output) -> int:
    """Each suite named, described (or, with -o, printed); a missing one is exit 4,
    after the others are shown."""
    found, missing = [], []
    seen: list[tuple[str, str]] = []
    for ref in args.names:
        pair = split_suite_ref(ref, cluster.namespace)
        if pair in seen:
            continue
        seen.append(pair)
        try:
            found.append(fetch_suite(cluster, pair[1], pair[0]))
        except CliError as error:
            if error.code != ExitCode.NOT_FOUND:
                raise
            missing.append(error)
    if args.output is not None and found:
        output.print_objects(
            out, args.output, found, single=len(args.names) == 1, resource=output.SUITE_RESOURCE
        )
    elif args.output is None:
        for number, suite in enumerate(found):
            if number:
                out.write("")  # a blank line between two suites' descriptions
            _describe(cluster, out, suite)
    for refused in missing:
        out.note(f"error: {refused.message}")
    return int(ExitCode.NOT_FOUND) if missing else int(ExitCode.OK)


# -- run ---------------------------------------------------------------------------


def request_token(now: dt.datetime | None = None) -> str:
    """A value of the run-requested annotation never used before: the time and 32 random bits.

    The time makes it readable (when was this asked for) and ordered; the
    random part keeps two requests in the same second apart.
    """
    moment = (now or timefmt.now()).astimezone(dt.UTC)
    return f"{moment:%Y%m%dT%H%M%SZ}-{secrets.token_hex(4)}"


def _holds(suite: dict[str, Any]) -> list[str]:
    """What will keep the poller from starting the requested run at once, in words."""
    the_spec, the_status = facts.spec(suite), facts.status(suite)
    name = suite["metadata"]["name"]
    holds = []
    conditions = {str(c.get("type")): c for c in facts.conditions(suite)}
    valid = conditions.get(api.SuiteCondition.VALID.value)
    if valid is not None and valid.get("status") == "False":
        why = valid.get("message") or the_status.get("message") or "see lmeval suite get"
        holds.append(f"the suite is not valid, so no run starts until it is fixed: {why}")
    if the_spec.get("suspend") is True:
        holds.append(
            f"the suite is suspended: the run starts once spec.suspend is false "
            f"(kubectl patch {api.SUITE_SHORT_NAME} {name} --type=merge "
            '-p \'{"spec":{"suspend":false}}\')'
        )
    going = suiteview.active(suite)
    policy = the_spec.get("concurrencyPolicy") or api.ConcurrencyPolicy.FORBID.value
    if going and policy == api.ConcurrencyPolicy.FORBID.value:
        holds.append(
            f"{', '.join(going)} is still running and concurrencyPolicy is Forbid: "
            "the new run waits for it to end"
        )
    elif going and policy == api.ConcurrencyPolicy.REPLACE.value:
        holds.append(
            f"concurrencyPolicy is Replace: the poller deletes {', '.join(going)} "
            "to start the new run"
        )
    return holds


def cmd_suite_run(args: argparse.Namespace, cluster: Cluster, out: render.Output) -> int:
    namespace, name = split_suite_ref(args.name, cluster.namespace)
    suite = fetch_suite(cluster, name, namespace)
    annotations = suite["metadata"].get("annotations") or {}
    pending = annotations.get(api.RUN_REQUESTED_ANNOTATION)
    acted_on = facts.status(suite).get("lastRunRequest")
    token = request_token()
    patch = {"metadata": {"annotations": {api.RUN_REQUESTED_ANNOTATION: token}}}
    patched: dict[str, Any] = _call(cluster.patch_suite, name, namespace, patch)
    if args.output is not None:
        output.print_objects(
            out, args.output, [patched], single=True, resource=output.SUITE_RESOURCE
        )
    else:
        out.write(
            f"{api.SUITE_KIND.lower()}/{name} run requested in namespace {namespace} "
            f"({api.RUN_REQUESTED_ANNOTATION}={token})"
        )
        out.write(
            f"follow it: lmeval suite get {name} (the run is listed under Runs once the "
            "poller starts it, and its verdict when it is judged; lmeval wait RUN follows "
            "its job)"
        )
    if pending and pending != acted_on:
        out.note(
            f"note: the earlier request {pending} had not been acted on yet: "
            "this one replaces it (one run, not two)"
        )
    for hold in _holds(suite):
        out.note(f"note: {render.safe(hold, 1000)}")
    return ExitCode.OK


# -- verify ------------------------------------------------------------------------


def _run_not_kept(run: str, suite: str, namespace: str, kept: list[dict[str, Any]]) -> CliError:
    names = [str(r.get("name")) for r in kept if r.get("name")]
    message = f'run "{render.safe(run)}" is not among the runs suite {suite} keeps in {namespace}'
    close = suggest(run, names)
    if close:
        message += ": did you mean " + " or ".join(f'"{c}"' for c in close) + "?"
    elif names:
        message += f" ({', '.join(names)}; runs past the history limits are deleted, with "
        message += "their attestations)"
    else:
        message += " (it keeps none yet)"
    return CliError(message, ExitCode.NOT_FOUND)


def cmd_suite_verify(args: argparse.Namespace, cluster: Cluster, out: render.Output) -> int:
    """Each kept run's signed verdict verified with --key and checked against the
    status: exit 0 only when at least one was verified and every one verified is OK."""
    from lmeval_cli import suiteverify  # here only: it loads `cryptography`

    # The key first: a typo in its path fails before any request.
    key = suiteverify.read_public_key(args.key)
    namespace, name = split_suite_ref(args.name, cluster.namespace)
    suite = fetch_suite(cluster, name, namespace)
    kept = suiteview.runs(suite)
    chosen = kept
    if args.run is not None:
        chosen = [run for run in kept if run.get("name") == args.run]
        if not chosen:
            raise _run_not_kept(args.run, name, namespace, kept)
    checks = suiteverify.verify_runs(cluster, suite, chosen, key, args.key)
    if args.output is not None:
        verified_statements = [c.statement for c in checks if c.outcome == suiteverify.OK]
        out.write(render.dump(verified_statements, args.output.name))
    elif checks:
        out.show(render.grid_table(suiteverify.checks_grid(checks)))
    verified = [c for c in checks if c.verified]
    failed = [c for c in verified if c.outcome == suiteverify.FAILED]
    if failed:
        raise CliError(
            f"{len(failed)} of {len(verified)} signed verdicts of suite {name} failed "
            f"verification: {suiteverify.failures(failed, table=args.output is None)}",
            suiteverify.VERIFY_FAILED,
        )
    if not verified:
        raise suiteverify.nothing_verified(suite, checks, only=args.run is not None)
    skipped = len(checks) - len(verified)
    plural = "s" if len(verified) != 1 else ""
    out.note(
        f"verified: {len(verified)} signed verdict{plural} of suite {name} with {args.key}, "
        "each saying what the status records"
        + (f"; {skipped} other run{'s' if skipped != 1 else ''} not verified" if skipped else "")
    )
    return ExitCode.OK
