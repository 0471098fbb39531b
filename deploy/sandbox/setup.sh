#!/usr/bin/env bash
# `return ... || exit ...` below works sourced (return) and run (exit):
# shellcheck disable=SC2317
# Source this (bash) with a profile: prepares what that caller needs from the
# project's own files, then puts this clone's environment on PATH.
#
#   source deploy/sandbox/setup.sh tests     everything the test suite runs (the default)
#   source deploy/sandbox/setup.sh sandbox   what `python -m lmeval_sandbox run` runs: the
#                                            Python environment, the control-plane and
#                                            node binaries (`run --node real` builds its
#                                            images and installs the node's Debian
#                                            packages itself, when it first needs them)
#
# Name the profile when sourcing from a script: `source FILE` without
# arguments hands the script's own arguments on.
#
# Slow things are cached outside the clone, keyed by their inputs, and shared
# by every clone on the machine:
#   ~/.cache/lmeval-poller/venv-<hash of pyproject.toml>   Python dependencies (not the project)
#   ~/.cache/lmeval-poller/bin-<hash of the Go modules>    control plane (+ kwok, kubectl)
#   ~/.cache/lmeval-poller/bin-floor-<hash>                oldest supported control plane (tests)
#   ~/.cache/lmeval-poller/kueue-<hash>                    Kueue (+ its CRDs and webhooks) (tests)
#   ~/.cache/lmeval-poller/prometheus-<hash>               Prometheus and promtool (tests/run.sh)
#   ~/.cache/lmeval-poller/helm-<hash>                     Helm (lints and renders deploy/helm) (tests)
#   ~/.cache/lmeval-poller/krew-<hash>                     krew (installs the release's kubectl plugin) (tests)
#   ~/.cache/lmeval-poller/cosign-<hash>                   cosign (verifies the suites' signed verdicts) (tests)
#   ~/.cache/lmeval-poller/images-<hash>                   our images (OCI archives),
#                                                          built when the real node needs them
# and one thing lives in the clone (git-ignored): .venv, this clone's own thin
# environment over the shared dependencies (see _setup_layer below), so that
# two clones on one machine each run their own code.
# With the tests profile, as root, it also installs the Debian packages of the
# real node (containerd, runc, CNI plugins, registry, buildah...):
# deploy/sandbox/node-packages.sh.
# LMEVAL_CACHE moves the cache; LMEVAL_SANDBOX_BIN points at ready control-plane
# binaries; LMEVAL_PROMETHEUS_BIN at ready Prometheus binaries; LMEVAL_KUEUE_BIN
# at a ready Kueue; LMEVAL_HELM_BIN at a directory holding a ready helm;
# LMEVAL_KREW_BIN at one holding a ready krew; LMEVAL_COSIGN_BIN at one holding a ready cosign.
# Afterwards LMEVAL_VENV is this clone's environment: its bin/python imports
# this clone's code and the shared dependencies.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"

_setup_profile=${1:-tests}
case $_setup_profile in
    tests | sandbox) ;;
    *)
        # Sourced from a script without arguments, setup.sh sees the script's own.
        echo "deploy/sandbox/setup.sh: unknown profile '$_setup_profile' (tests or sandbox;" \
            "from a script, name it: source deploy/sandbox/setup.sh tests)" >&2
        return 2 2>/dev/null || exit 2
        ;;
esac

cache=${LMEVAL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lmeval-poller}
export LMEVAL_SANDBOX_CACHE=$cache
mkdir -p "$cache"

if ! command -v go >/dev/null 2>&1; then
    echo "the Go toolchain (1.24 or newer) is needed to build the control plane: install Go first" >&2
    return 2 2>/dev/null || exit 2
fi

# One line per step with its time. A step's output (pip's, go's, apt's) goes to
# a log file, named with its last lines when the step fails, so that a run
# that works prints no installer noise.
_setup_step() {  # _setup_step TITLE DETAIL COMMAND...: run COMMAND, print one line
    local title=$1 detail=$2 log started status seconds
    shift 2
    log=$(mktemp "$cache/setup-log.XXXXXX")
    started=$(date +%s%N)
    # Called with `|| exit` below, so bash ignores `set -e` in here: the steps
    # chain their commands with && themselves.
    status=0
    "$@" >"$log" 2>&1 || status=$?
    seconds=$(awk -v ns="$(($(date +%s%N) - started))" 'BEGIN { printf "%.1f", ns / 1e9 }')
    if [ "$status" -ne 0 ]; then
        echo "✗ $title failed after $seconds s; its output is in $log, ending with:" >&2
        tail -n 20 "$log" | sed 's/^/    /' >&2
        return "$status"
    fi
    echo "✓ $title${detail:+ ($detail)} $seconds s"
    rm -f "$log"
}

# -- Python ----------------------------------------------------------------------
#
# Two layers, because the environment is expensive and the code is not:
# * $venv, shared by every clone and keyed by its dependencies: the project's
#   dependencies (lm-eval, kubernetes, mypy, ...; about 1.2 GB, minutes to
#   make) and NOT the project itself. One shared editable install could point
#   at one clone only: setup.sh used to re-point it at whichever clone sourced
#   it last, so a suite in one clone could import another clone's code.
# * $layer (<clone>/.venv), this clone's own, made in seconds: a venv of the
#   same interpreter without pip, whose site-packages holds a .pth that adds
#   the shared site-packages (site.addsitedir, so the .pth files in there work
#   too) and the editable install of this clone (pip --no-deps
#   --no-build-isolation: nothing is downloaded). Its bin/ has this clone's
#   console scripts (lmeval, lmeval-poller, lmeval-driver, kubectl-lmeval) and
#   a copy of each shared console script (pytest, mypy, lint-imports, lm_eval,
#   ...) re-pointed at its own python; binaries (ruff, hadolint) are symlinks.
# The interpreter itself, not an environment variable, knows which clone it
# belongs to: PYTHONPATH would leak into every child process (the local pod
# runner starts job pods with this Python as their "image") and survive `-S`
# and `-I`, while `<clone>/.venv/bin/python` imports this clone's code however
# it is started. `.venv` is the name editors look for, and .gitignore has it.
# The key is what the environment holds: the build requirements and the
# dependencies with every extra, not the whole pyproject.toml. An edit of the
# import contracts or a tool's settings must not make another 1.2 GB
# environment (kept for a day, see below): a day of such edits once filled
# the disk until the real node's kubelet evicted the suite's pods.
_setup_deps=$(python3 -c 'import json, tomllib
p = tomllib.load(open("pyproject.toml", "rb"))
held = [p["build-system"]["requires"], p["project"]["dependencies"],
        p["project"].get("optional-dependencies", {})]
print(json.dumps(held, sort_keys=True))') || _setup_deps=$(cat pyproject.toml)
key=$( (echo "$_setup_deps"; python3 --version; echo "dependencies only, no project") \
    | sha256sum | cut -c1-16)
venv=$cache/venv-$key
layer=$repo/.venv
# Every change of the dependencies makes a new shared environment. An old one is
# removed once no setup has used it for this many hours (each marks the one it
# uses), unless it is the most recently used other one: a clone still on an
# older pyproject.toml, or a suite started from one, keeps its environment.
_setup_keep_hours=24

_setup_shared() {  # the shared dependencies; run under the lock
    if [ ! -f "$venv/.complete" ]; then
        local requires
        # The build backend too: the clones' editable installs build without isolation.
        requires=$(python3 -c 'import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))') \
            || return 1
        rm -rf "$venv" \
            && python3 -m venv "$venv" \
            && "$venv/bin/pip" install --upgrade pip \
            && echo "$requires" | "$venv/bin/pip" install -r /dev/stdin \
            && "$venv/bin/pip" install -e ".[dev]" \
            && "$venv/bin/pip" uninstall -y lmeval-poller \
            || return 1
        touch "$venv/.complete"
    fi
    touch "$venv/.last-used"
    # Remove old shared environments: never the most recently used other one
    # (switching back costs nothing), never one used within the last
    # $_setup_keep_hours hours (another clone or a running suite may be on it).
    # A venv made by an older setup.sh has no .last-used: its directory's time
    # stands in.
    local now old used newest=0 newest_other="" others=()
    now=$(date +%s)
    for old in "$cache"/venv-*; do
        if [ ! -d "$old" ] || [ "$old" = "$venv" ]; then
            continue
        fi
        used=$(stat -c %Y "$old/.last-used" 2>/dev/null || stat -c %Y "$old") || continue
        others+=("$used $old")
        if [ "$used" -gt "$newest" ]; then
            newest=$used newest_other=$old
        fi
    done
    for old in "${others[@]}"; do
        used=${old%% *} old=${old#* }
        if [ "$old" != "$newest_other" ] && [ $((now - used)) -gt $((_setup_keep_hours * 3600)) ]; then
            rm -rf "$old"
        fi
    done
}

_setup_layer() {  # this clone's environment over the shared one; run under the lock
    # lmeval-layer marks the directory as setup.sh's from the start (a build
    # cut short is then simply made again); lmeval-shared, written last, names
    # the shared environment it is complete for.
    if [ -f "$layer/pyvenv.cfg" ] && [ ! -f "$layer/lmeval-layer" ] && [ ! -f "$layer/lmeval-shared" ]; then
        echo "$layer holds a virtual environment setup.sh did not make; move it away:" \
            "setup.sh makes this clone's own environment there" >&2
        return 1
    fi
    "$venv/bin/python" - "$venv" "$layer" "$repo" <<'EOF'
import os
import re
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

shared, layer, repo = (Path(arg) for arg in sys.argv[1:])
# The shared environment's own interpreter (venv uses sys._base_executable);
# an existing layer is upgraded in place, never removed: a suite may be running.
existing = (layer / "pyvenv.cfg").exists()
layer.mkdir(parents=True, exist_ok=True)
(layer / "lmeval-layer").write_text("made by deploy/sandbox/setup.sh\n")
venv.EnvBuilder(with_pip=False, upgrade=existing, symlinks=True).create(layer)
python = layer / "bin" / "python"
query = "import sysconfig; print(sysconfig.get_path('purelib'))"
site = Path(subprocess.run([python, "-I", "-c", query], check=True, capture_output=True,
                           text=True).stdout.strip())
shared_sites = dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])
pth = site / "_lmeval_shared.pth"
lines = "".join(f"import site; site.addsitedir({path!r})\n" for path in shared_sites)
pth.with_suffix(".tmp").write_text(lines)
pth.with_suffix(".tmp").replace(pth)

install = [python, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
           "--disable-pip-version-check", "--no-input", "-e", str(repo)]
subprocess.run(install, check=True, cwd=repo)

# The shared console scripts, re-pointed at this layer's python; each is
# replaced atomically, and the ones the shared environment no longer has go.
bin_dir, shared_bin = layer / "bin", shared / "bin"
manifest = layer / "lmeval-shims"
before = set(manifest.read_text().split()) if manifest.exists() else set()
own = {entry.name for entry in bin_dir.iterdir()} - before
# What the venv module writes into every bin/ for itself.
VENV_SCRIPTS = {"activate", "activate.csh", "activate.fish", "Activate.ps1"}
interpreter = re.compile(re.escape(str(shared_bin)) + r"/python[0-9.]*")
made = []
for entry in sorted(shared_bin.iterdir()):
    name = entry.name
    skip = name in own or name.startswith("python") or name in VENV_SCRIPTS
    if skip or not entry.is_file() or not os.access(entry, os.X_OK):
        continue
    temporary = bin_dir / f".{name}.tmp"
    temporary.unlink(missing_ok=True)
    with entry.open("rb") as source:
        head = source.read(2)
    if head == b"#!":
        text = entry.read_text()
        first, _, rest = text.partition("\n")
        # pip writes `#!PYTHON`, or for long paths a /bin/sh line that execs it.
        second, _, tail = rest.partition("\n")
        if interpreter.search(first):
            text = interpreter.sub(str(python), first, count=1) + "\n" + rest
        elif first == "#!/bin/sh" and interpreter.search(second):
            text = f"{first}\n{interpreter.sub(str(python), second, count=1)}\n{tail}"
        temporary.write_text(text)
        temporary.chmod(0o755)
    else:  # a binary (ruff, hadolint): the shared one
        temporary.symlink_to(entry)
    temporary.replace(bin_dir / name)
    made.append(name)
for name in before - set(made):
    (bin_dir / name).unlink(missing_ok=True)
manifest.write_text("\n".join(made) + "\n")
(layer / "lmeval-shared").write_text(f"{shared}\n")
EOF
}

_setup_python() {
    # One setup at a time makes or removes environments: two clones (or two
    # shells) starting at once would otherwise build into the same directory,
    # or one would prune what the other has just chosen.
    (
        flock 9 || exit 1
        _setup_shared || exit 1
        if _setup_layer_needed; then
            _setup_layer || exit 1
        fi
        if _setup_layer_needed; then
            echo "$layer/bin/python does not import $repo/poller after it was made" >&2
            exit 1
        fi
    ) 9>"$cache/venv.lock"
}

_setup_layer_needed() {  # whether $layer must be (re)made: a new shared env, a moved clone,
    local found           # console scripts added to the shared env (pip install there)
    [ "$(cat "$layer/lmeval-shared" 2>/dev/null)" = "$venv" ] || return 0
    [ "$venv/bin" -nt "$layer/lmeval-shims" ] && return 0
    found=$("$layer/bin/python" -I -c 'import poller; print(poller.__path__[0])' 2>/dev/null) || return 0
    [ "$found" != "$repo/poller" ]
}

if [ ! -f "$venv/.complete" ]; then
    detail="created in $venv"
    echo "… python environment: creating $venv (first run: a few minutes)"
elif _setup_layer_needed; then
    detail="cached; this clone's layer made in .venv"
else
    detail=cached
fi
_setup_step "python environment" "$detail" _setup_python || { return 1 2>/dev/null || exit 1; }
export PATH=$layer/bin:$PATH
export LMEVAL_VENV=$layer

# -- Go-built binaries --------------------------------------------------------------

if python -c 'import sys; from lmeval_sandbox import build; sys.exit(not build.needs_build())'; then
    detail=built
    echo "… control-plane and node binaries: building from their Go modules (about 8 minutes)"
else
    detail=cached
fi
_setup_step "control-plane and node binaries" "$detail" python -m lmeval_sandbox build \
    || { return 1 2>/dev/null || exit 1; }

if [ "$_setup_profile" = tests ]; then
    # The oldest Kubernetes minor the project claims (deploy/sandbox/controlplane-floor
    # says why), built like the current one into bin-floor-<hash>; tests/cluster/
    # test_floor_plane.py runs the project on it. LMEVAL_SANDBOX_FLOOR_BIN points at
    # ready binaries instead.
    floor=$(python -c 'from lmeval_sandbox import build; print(build.kubernetes_version("floor"))') \
        || { return 1 2>/dev/null || exit 1; }
    if python -c 'import sys; from lmeval_sandbox import build; sys.exit(not build.needs_build("floor"))'; then
        detail=built
        echo "… control plane, oldest supported Kubernetes ($floor): building from its Go module (about 8 minutes)"
    else
        detail=cached
    fi
    floor_minor=${floor#v}
    _setup_step "control plane, oldest supported Kubernetes (${floor_minor%.*})" "$detail" \
        python -m lmeval_sandbox.build floor || { return 1 2>/dev/null || exit 1; }
    unset floor floor_minor

    if python -c 'import sys; from lmeval_sandbox import kueue; sys.exit(not kueue.needs_build())'; then
        detail=built
        echo "… Kueue: building from its Go module (about 7 minutes)"
    else
        detail=cached
    fi
    _setup_step "Kueue" "$detail" python -m lmeval_sandbox.kueue || { return 1 2>/dev/null || exit 1; }

    if python -c 'import sys; from lmeval_sandbox import helm; sys.exit(not helm.needs_build())'; then
        detail=built
        echo "… Helm: building from its Go module (about 4 minutes)"
    else
        detail=cached
    fi
    _setup_step "Helm" "$detail" python -m lmeval_sandbox.helm || { return 1 2>/dev/null || exit 1; }

    if python -c 'import sys; from lmeval_sandbox import krew; sys.exit(not krew.needs_build())'; then
        detail=built
        echo "… krew: building from its Go module (about 2 minutes)"
    else
        detail=cached
    fi
    _setup_step "krew" "$detail" python -m lmeval_sandbox.krew || { return 1 2>/dev/null || exit 1; }

    if python -c 'import sys; from lmeval_sandbox import cosign; sys.exit(not cosign.needs_build())'; then
        detail=built
        echo "… cosign: building from its Go module (about 2 minutes)"
    else
        detail=cached
    fi
    _setup_step "cosign" "$detail" python -m lmeval_sandbox.cosign || { return 1 2>/dev/null || exit 1; }

    if [ "$(id -u)" -eq 0 ]; then
        _setup_step "real node's Debian packages" "" bash deploy/sandbox/node-packages.sh \
            || { return 1 2>/dev/null || exit 1; }
    else
        echo "- real node's Debian packages: skipped (not root: tests/node and run --node real cannot start here)"
    fi
fi
unset -f _setup_step _setup_python _setup_shared _setup_layer _setup_layer_needed
unset detail _setup_profile _setup_keep_hours
