"""Command line of the in-pod driver: ``lmeval-driver`` and ``python -m driver``.

Why this module exists: it is the container's entry point, so it must start
lm_eval quickly (only ``argparse`` and the light :mod:`driver.run` and
:mod:`driver.prepare` are imported before the child starts) and it must report its own usage errors
the way it reports everything else, as a ``failed`` marker with exit code
``EXIT_DRIVER_ERROR``, because the poller only sees the log and the exit code.

Three forms::

    lmeval-driver [options] -- <lm_eval argv...>   run and report
    lmeval-driver decode [FILE]                    what the poller sees in a log
    lmeval-driver release [--output-root DIR]      end an exec-mode hold early
    lmeval-driver fetch-s3 --dest DIR --path P     copy an S3 prefix (init container)
    lmeval-driver ca-bundle --out FILE             one PEM file of every trusted CA
                                                   (init container of Git sources)
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from driver import __version__
from driver.contract import (
    CMD_CA_BUNDLE,
    CMD_DECODE,
    CMD_FETCH_S3,
    CMD_RELEASE,
    DRIVER_PROGRAM,
    END_OF_OPTIONS,
    ENV_OUTPUT_ROOT,
    ENV_RUN_ID,
    EVENT_FAILED,
    EXIT_DRIVER_ERROR,
    OPT_OUTPUT_ROOT,
    RunArgs,
    option_flag,
)
from driver.prepare import DEFAULT_OUTPUT_ROOT, RunOptions
from driver.run import Run, release

USAGE = (
    f"{DRIVER_PROGRAM} [options] {END_OF_OPTIONS} <lm_eval command...>\n"
    f"       {DRIVER_PROGRAM} {CMD_DECODE} [FILE]\n"
    f"       {DRIVER_PROGRAM} {CMD_RELEASE} [{OPT_OUTPUT_ROOT} DIR]"
)

DESCRIPTION = """\
Run an lm_eval command as a child process, forward its output with anything
that looks like a marker neutralised, and write ::lmeval:: markers (started,
progress, results, then exactly one of completed, failed, cancelled).

Exit codes: 0 completed; N when lm_eval exits N; 128+S when it is killed by
signal S; 70 lm_eval exited 0 without a results file; 71 cancelled (SIGTERM
or SIGINT); 72 driver error (bad options, cannot start the command, ...).
"""


def _default_root() -> str:
    return os.environ.get(ENV_OUTPUT_ROOT) or DEFAULT_OUTPUT_ROOT


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0: {text!r}")
    return value


class _RunParser(argparse.ArgumentParser):
    """Usage errors become a ``failed`` marker and exit code 72."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        from driver.protocol import encode_final

        text = f"{DRIVER_PROGRAM}: usage error: {message}"
        print(
            encode_final(
                EVENT_FAILED, {"exit_code": EXIT_DRIVER_ERROR, "signal": None, "message": text}
            )
        )
        sys.stdout.flush()
        print(text, file=sys.stderr)
        sys.exit(EXIT_DRIVER_ERROR)


def _run_parser() -> argparse.ArgumentParser:
    parser = _RunParser(
        prog=DRIVER_PROGRAM,
        usage=USAGE,
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"{DRIVER_PROGRAM} {__version__}")
    # The order of these calls is the order of the options in --help.
    _add_run_options(parser)
    _add_source_options(parser)
    _add_oci_options(parser)
    _add_mlflow_options(parser)
    return parser


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    """Where the run writes, how often it reports, how it ends."""
    parser.add_argument(
        OPT_OUTPUT_ROOT,
        default=_default_root(),
        metavar="DIR",
        help="parent of the per-run directory run-<id> that receives lm_eval's "
        f"--output_path (default: ${ENV_OUTPUT_ROOT} or %(default)s)",
    )
    parser.add_argument(
        option_flag("run_id"),
        default=os.environ.get(ENV_RUN_ID) or None,
        metavar="ID",
        help=f"run id, names the run directory (default: ${ENV_RUN_ID} or a fresh "
        "timestamp-random id); a reused id is refused",
    )
    parser.add_argument(
        option_flag("progress_interval"),
        type=_seconds,
        default=5.0,
        metavar="S",
        help="at most one progress marker per S seconds (default: %(default)s)",
    )
    parser.add_argument(
        option_flag("grace_period"),
        type=_seconds,
        default=20.0,
        metavar="S",
        help="after SIGTERM/SIGINT, SIGKILL lm_eval's process group after S seconds; keep "
        "it below the pod's terminationGracePeriodSeconds (default: %(default)s)",
    )
    parser.add_argument(
        option_flag("log_copy"),
        metavar="FILE",
        help="also append the complete (neutralised) output and markers to FILE",
    )
    parser.add_argument(
        option_flag("hold_seconds"),
        type=_seconds,
        default=0.0,
        metavar="S",
        help="exec mode: after the final marker stay alive up to S seconds, or until "
        f"'{DRIVER_PROGRAM} {CMD_RELEASE}' (default: %(default)s)",
    )


def _add_source_options(parser: argparse.ArgumentParser) -> None:
    """lm_eval's inputs the driver reports (task sources' commits) or lays out (Hub datasets)."""
    parser.add_argument(
        option_flag("task_sources"),
        metavar="DIR",
        help="report the commit in each DIR/<name>.commit file (task sources cloned from "
        "Git) in the started and final markers",
    )
    parser.add_argument(
        option_flag("hub_datasets"),
        metavar="DIR",
        help="a Hugging Face hub cache: start lm_eval in a directory where each cached "
        "dataset ORG/NAME is a symlink to its snapshot, so that offline runs load Hub "
        "datasets from the cache",
    )


def _add_oci_options(parser: argparse.ArgumentParser) -> None:
    """Publishing the results as an OCI artifact after a completed run."""
    parser.add_argument(
        option_flag("oci_push"),
        metavar="REF",
        help="after a completed run, push the results and the run's provenance as an OCI "
        "artifact to REF (host[:port]/path:tag) and report its digest in the final marker",
    )
    parser.add_argument(
        option_flag("oci_subject"),
        metavar="DIGEST",
        help="attach the artifact to this manifest (sha256:...) of the same repository",
    )
    parser.add_argument(
        option_flag("oci_auth"),
        metavar="FILE",
        help="a .dockerconfigjson with the registry's credentials",
    )
    parser.add_argument(
        option_flag("oci_scheme"),
        choices=("https", "http"),
        default="https",
        help="http only for a loopback registry (default: %(default)s)",
    )
    parser.add_argument(
        option_flag("oci_ca_bundle"),
        metavar="FILE",
        help="PEM certificates of CAs to trust for the registry, besides the image's own "
        "and the cluster's ($LMEVAL_CLUSTER_CA_BUNDLES)",
    )
    parser.add_argument(
        option_flag("oci_tls"),
        choices=("verify", "insecure"),
        default="verify",
        help="insecure: do not verify the registry's certificate (default: %(default)s)",
    )


def _add_mlflow_options(parser: argparse.ArgumentParser) -> None:
    """Logging the evaluation to an MLflow tracking server after a completed run."""
    parser.add_argument(
        option_flag("mlflow_tracking_uri"),
        metavar="URI",
        help="after a completed run, log it to this MLflow tracking server with MLflow's "
        "client (params, metrics, the results, per-item scores and provenance as "
        "artifacts) and report the run in the final marker",
    )
    parser.add_argument(
        option_flag("mlflow_experiment"),
        metavar="NAME",
        help="the experiment of the run, created when missing (default: %(default)s)",
        default="Default",
    )
    parser.add_argument(option_flag("mlflow_run_name"), metavar="NAME", help="the run's name")
    parser.add_argument(
        option_flag("mlflow_tags"),
        metavar="JSON",
        help='tags of the run, a JSON object of strings ({"key": "value", ...})',
    )
    parser.add_argument(
        option_flag("mlflow_credentials"),
        metavar="DIR",
        help="a directory with the server's credentials, read after the run: files "
        "username and password (HTTP Basic), or token (Bearer)",
    )
    parser.add_argument(
        option_flag("mlflow_ca_bundle"),
        metavar="FILE",
        help="PEM certificates of CAs to trust for the server, besides the image's own "
        "and the cluster's",
    )


def _decode(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog=f"{DRIVER_PROGRAM} {CMD_DECODE}",
        description="Decode the markers of a pod log (plain or CRI format) into one JSON "
        "object: events, results, results_error, outcome.",
    )
    parser.add_argument("file", nargs="?", help="log file (default: standard input)")
    parser.add_argument("--compact", action="store_true", help="no indentation")
    args = parser.parse_args(argv)
    import json

    from driver.decoder import decode_stream

    try:
        if args.file is None or args.file == "-":
            decoded = decode_stream(sys.stdin.buffer)
        else:
            with open(args.file, "rb") as fh:
                decoded = decode_stream(fh)
    except OSError as exc:
        print(f"{DRIVER_PROGRAM} {CMD_DECODE}: {exc}", file=sys.stderr)
        return 2
    json.dump(decoded.to_json(), sys.stdout, indent=None if args.compact else 2)
    sys.stdout.write("\n")
    return 0


def _release(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog=f"{DRIVER_PROGRAM} {CMD_RELEASE}",
        description="End the exec-mode hold of a driver using the same output root.",
    )
    parser.add_argument(OPT_OUTPUT_ROOT, default=_default_root(), metavar="DIR")
    args = parser.parse_args(argv)
    try:
        path = release(args.output_root)
    except OSError as exc:
        print(f"{DRIVER_PROGRAM} {CMD_RELEASE}: {exc}", file=sys.stderr)
        return 1
    print(f"released ({path})")
    return 0


def parse_run_options(args: Sequence[str]) -> RunOptions:
    """The options of a run from its arguments (what `contract.run_argv` builds,
    after the command). A usage error ends the process as `_RunParser` says."""
    args = list(args)
    if END_OF_OPTIONS in args:
        split = args.index(END_OF_OPTIONS)
        options, child_argv = args[:split], args[split + 1 :]
    else:
        options, child_argv = args, []
    parser = _run_parser()
    parsed = parser.parse_args(options)
    if not child_argv:
        parser.error(f"missing '{END_OF_OPTIONS} <lm_eval command...>'")
    given = {field: getattr(parsed, field) for field in RunArgs._fields}
    plain_http = given.pop("oci_scheme") == "http"
    verify_tls = given.pop("oci_tls") != "insecure"
    return RunOptions(
        child_argv=child_argv, oci_plain_http=plain_http, oci_verify_tls=verify_tls, **given
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == CMD_DECODE:
        return _decode(args[1:])
    if args and args[0] == CMD_RELEASE:
        return _release(args[1:])
    if args and args[0] == CMD_FETCH_S3:
        from driver import s3fetch

        return s3fetch.main(args[1:])
    if args and args[0] == CMD_CA_BUNDLE:
        from driver import trust

        return trust.main(args[1:])
    return Run(parse_run_options(args)).execute()


if __name__ == "__main__":
    sys.exit(main())
