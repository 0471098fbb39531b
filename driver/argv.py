"""The child's command line: who owns ``--output_path``, and what may be logged.

Why this module exists: the driver shows the lm_eval command in its
``started`` marker (people debug evaluations from the pod log), but command
lines routinely carry API keys and tokens in ``--model_args``, in
``--api_key``-style flags and in URLs. :func:`redact_argv` removes them before
anything is written. The driver also owns lm_eval's output location (a fresh
per-run directory, so an earlier run's files on a shared volume can never be
taken for this run's), so :func:`find_output_path_flag` spots a command line
that tries to set it itself.

It also reads the installed lm_eval version from the package metadata on disk
without importing lm_eval (seconds) or ``importlib.metadata`` (~40 ms).
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

REDACTED = "***"

# A key is secret when one of its words is, or ends with, one of these.
# Word-based rather than substring-based so that "tokenizer_backend" or
# "max_tokens" stay readable while "api_key", "hf_token", "apikey",
# "client_secret", "db_password" and "authToken" are hidden.
_SECRET_WORDS = ("key", "token", "secret", "password", "passwd", "pwd", "credential", "credentials")
_WORD_RE = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
# key=value pairs inside a token; values stop at the separators used by
# lm_eval's model_args (",") and by URLs ("&", ";").
# Keys and schemes are matched at most 64 and 32 characters long: an unbounded
# run is tried from every start position, which is quadratic (6.6 s on a
# 32 KB word with no "=" after its letters); a longer key still ends in the
# part that names a secret ("..._api_key"), and a longer scheme still has its
# password hidden.
_PAIR_RE = re.compile(r"(?P<key>[A-Za-z_][A-Za-z0-9_.-]{0,63})=(?P<value>[^,&;\s]*)")
# scheme://user:password@host
_URL_CREDENTIALS_RE = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]{0,31}://[^/@:\s]*:)[^/@\s]*@")
_OUTPUT_FLAG = "--output_path"
_RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def is_secret_key(key: str) -> bool:
    """Whether a model_args key or flag name names a secret."""
    for word in _WORD_RE.findall(key):
        lowered = word.lower()
        if any(lowered.endswith(s) for s in _SECRET_WORDS):
            return True
    return False


def redact_json(value: Any) -> Any:
    """A copy of parsed JSON with secret keys' values and secrets inside strings hidden."""
    if isinstance(value, dict):
        return {
            k: (REDACTED if isinstance(k, str) and is_secret_key(k) else redact_json(v))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact_json(v) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value


def redact_text(text: str, _depth: int = 0) -> str:
    """Hide secret ``key=value`` values and URL passwords inside one string."""
    stripped = text.strip()
    if stripped.startswith("{") and stripped.endswith("}") and _depth == 0:
        import json  # rare; keeps json out of the driver's start-up

        try:
            parsed = json.loads(stripped)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            redacted = redact_json(parsed)
            # Re-written only when something was hidden: the text stays as given.
            return text if redacted == parsed else json.dumps(redacted, ensure_ascii=False)
    text = _URL_CREDENTIALS_RE.sub(lambda m: m["head"] + REDACTED + "@", text)
    if "=" not in text or _depth > 4:
        return text

    def replace(match: re.Match[str]) -> str:
        key, value = match["key"], match["value"]
        if is_secret_key(key):
            return f"{key}={REDACTED}"
        # A value may itself hold pairs, e.g. base_url=http://h/v1?token=x.
        return f"{key}={redact_text(value, _depth + 1)}"

    return _PAIR_RE.sub(replace, text)


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A copy of ``argv`` safe to print: secret flag values and pairs hidden."""
    out: list[str] = []
    hide_next = False
    for token in argv:
        if hide_next and not token.startswith("--"):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        if token.startswith("-") and len(token) > 1:
            name, eq, _value = token.lstrip("-").partition("=")
            if is_secret_key(name):
                if eq:
                    out.append(token.split("=", 1)[0] + "=" + REDACTED)
                else:
                    out.append(token)
                    hide_next = True
                continue
        out.append(redact_text(token))
    return out


def find_output_path_flag(argv: Iterable[str]) -> str | None:
    """The token by which ``argv`` sets lm_eval's output path, if any.

    Recognises ``--output_path``, its argparse abbreviations (``--output``,
    ``--out``, ...), the ``=value`` forms, and ``-o`` with or without an
    attached value.
    """
    for arg in argv:
        if arg == "--":
            continue
        if arg.startswith("--"):
            name = arg.split("=", 1)[0]
            if len(name) > 3 and _OUTPUT_FLAG.startswith(name):
                return arg
        elif arg.startswith("-o"):
            return arg
    return None


def lm_eval_version(paths: Sequence[str] | None = None) -> str | None:
    """lm_eval's installed version, read from its dist-info directory name.

    Scans the import path the way the child's interpreter would (the driver
    normally runs with the same interpreter as lm_eval) and never imports
    anything.
    """
    for entry in paths if paths is not None else sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            lowered = name.lower()
            for prefix in ("lm_eval-", "lm-eval-"):
                if lowered.startswith(prefix) and lowered.endswith(".dist-info"):
                    return name[len(prefix) : -len(".dist-info")]
    return None


def new_run_id() -> str:
    """A sortable, unique run id such as ``20261129T224541Z-3f9a1c2e``."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + os.urandom(4).hex()


def valid_run_id(run_id: str) -> bool:
    """Run ids become directory names: a restricted alphabet, no path tricks."""
    return bool(_RUN_ID_RE.match(run_id)) and run_id not in (".", "..")
