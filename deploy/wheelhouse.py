"""Wheels to install this project on a machine that cannot reach a package index: a GPU
server behind a firewall, a board on an isolated network.

Run it where pip can reach an index, for the target's Python and platform; it resolves
the project's dependencies (with the extras asked for) and its build backend as pip would
install them there, leaves out what the target already has (``--have``: its ``pip list
--format=freeze``; a CUDA build of PyTorch, say, is kept and not replaced by PyPI's) and
downloads the rest. The target then installs them, and the checkout (copied over too)
in editable mode, as the runner wants it (it submits the checkout as the Flower app)::

    # on the target:
    python3 -m pip list --format=freeze > have.txt
    # here:
    python deploy/wheelhouse.py wheels --python-version 3.12 \\
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --have have.txt
    # on the target, in the checkout, with the folder copied over:
    python3 -m venv --system-site-packages .venv && . .venv/bin/activate
    python3 -m pip install --no-index --no-deps wheels/*.whl
    python3 -m pip install --no-index --no-deps --no-build-isolation -e .

It ends with one line ``wheelhouse: wheels=N kept_on_target=M ...``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Pinned:
    """One distribution the resolver chose for the target."""

    name: str
    version: str

    @property
    def key(self) -> str:
        return canonical(self.name)

    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


def canonical(name: str) -> str:
    """PEP 503's normalised name: ``Foo_Bar.baz`` and ``foo-bar-baz`` are one project."""
    return re.sub(r"[-_.]+", "-", name).lower()


def project_requirements(pyproject: Path, extras: list[str]) -> list[str]:
    """The project's dependencies, those of the extras asked for, and its build backend
    (an editable install builds with it), as its ``pyproject.toml`` declares them. An
    unknown extra is refused, naming the known ones."""
    declared = tomllib.loads(pyproject.read_text())
    project, backend = declared["project"], declared["build-system"]["requires"]
    optional = project.get("optional-dependencies", {})
    unknown = sorted(set(extras) - set(optional))
    if unknown:
        raise SystemExit(f"--extra={','.join(unknown)} is not allowed: expected one of "
                         f"{', '.join(sorted(optional))}")  # fmt: skip
    return [*project["dependencies"], *(r for extra in extras for r in optional[extra]),
            *backend]  # fmt: skip


def read_have(text: str) -> dict[str, str]:
    """The target's installed distributions, from ``pip list --format=freeze`` (or
    ``pip freeze``): canonical name -> version. Lines that pin nothing (``-e``, ``@``
    URLs, comments) name no version and are kept as installed with version ``""``."""
    have: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        name, sep, version = line.partition("==")
        if not sep:
            name = re.split(r"\s*@\s*|[<>=!~;\[\s]", line, maxsplit=1)[0]
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name.strip()):
            raise ValueError(f"--have: not a distribution line: {raw!r}")
        if version.strip() and not is_version(version.strip()):
            raise ValueError(f"--have: not a version in {raw!r}")
        have[canonical(name.strip())] = version.strip()
    return have


def is_version(text: str) -> bool:
    try:
        Version(text)
    except InvalidVersion:
        return False
    return True


@dataclass(frozen=True)
class Kept:
    """A distribution the target has, left out: the resolver's pin, the target's version
    ("" where ``--have`` named none) and the requirements on it that version fails."""

    pin: Pinned
    version: str
    unmet: tuple[str, ...] = ()


def needed(
    report: dict, roots: list[str], have: dict[str, str], target: dict[str, str]
) -> tuple[list[Pinned], list[Kept]]:
    """The distributions of ``pip install --dry-run --report`` that the target lacks, and
    those it has. The report's dependency graph is walked from ``roots`` (the requirements
    resolved) and not through a distribution the target has: what that one needs is
    installed with it there (the CUDA libraries of the target's PyTorch are not carried
    because the index's PyTorch would need others). Markers are evaluated for the target
    (``target``: its Python version and machine)."""
    items = {canonical(item["metadata"]["name"]): item for item in report["install"]}
    environment = {**report["environment"], **target}
    carry: dict[str, Pinned] = {}
    asked: dict[str, list[Requirement]] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    stack = [Requirement(root) for root in roots]
    while stack:
        requirement = stack.pop()
        key, extras = canonical(requirement.name), frozenset(requirement.extras)
        asked.setdefault(key, []).append(requirement)
        if (key, extras) in seen or key not in items or key in have:
            continue
        seen.add((key, extras))
        metadata = items[key]["metadata"]
        carry[key] = Pinned(metadata["name"], metadata["version"])
        for line in metadata.get("requires_dist", []):
            child = Requirement(line)
            if child.marker is None or any(
                child.marker.evaluate({**environment, "extra": extra}) for extra in (extras or {""})
            ):
                stack.append(child)
    kept = [_kept(items[key]["metadata"], have[key], asked[key])
            for key in sorted(asked) if key in have and key in items]  # fmt: skip
    return sorted(carry.values(), key=lambda pin: pin.key), kept


def _kept(metadata: dict, version: str, requirements: list[Requirement]) -> Kept:
    unmet = () if not version else tuple(
        str(r) for r in requirements if not r.specifier.contains(version, prereleases=True)
    )  # fmt: skip
    return Kept(Pinned(metadata["name"], metadata["version"]), version, unmet)


def target_environment(python_version: str, platforms: list[str]) -> dict[str, str]:
    """The marker variables that differ on the target: its Python and its machine (from
    the platform tags, ``manylinux_2_28_aarch64`` -> ``aarch64``)."""
    machine = re.compile(r"(x86_64|aarch64|armv7l|ppc64le|s390x|i686)$")
    machines = {m.group(1) for tag in platforms if (m := machine.search(tag))}
    environment = {"python_version": python_version, "python_full_version": f"{python_version}.0"}
    if len(machines) == 1:
        environment["platform_machine"] = machines.pop()
    return environment


def target_flags(args: argparse.Namespace) -> list[str]:
    flags = ["--only-binary=:all:", "--python-version", args.python_version,
             "--implementation", "cp"]  # fmt: skip
    for platform in args.platform:
        flags += ["--platform", platform]
    return flags


def editable_requirements(build_system: dict, backend_site: Path, project: Path) -> list[str]:
    """What the build backend asks for, beyond itself, to install ``project`` in editable
    mode (PEP 660's ``get_requires_for_build_editable``; hatchling's is ``editables``).
    ``pip install --no-build-isolation -e .`` on the target installs none of it, so the
    wheelhouse must carry it. The backend is imported from ``backend_site`` (a folder it
    is installed in) in a fresh interpreter run in ``project``; a backend without the hook
    asks for nothing."""
    module, _, attribute = build_system["build-backend"].partition(":")
    ask = (
        "import importlib, json\n"
        f"backend = importlib.import_module({module!r})\n"
        + (f"backend = getattr(backend, {attribute!r})\n" if attribute else "")
        + "hook = getattr(backend, 'get_requires_for_build_editable', None)\n"
        "print(json.dumps(list(hook()) if hook else []))"
    )
    paths = [str(backend_site), *(str(project / p) for p in build_system.get("backend-path", []))]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    done = subprocess.run([sys.executable, "-c", ask], cwd=project, env=environment,
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"the build backend {build_system['build-backend']} failed to say "
                         f"what an editable install needs:\n{done.stderr.strip()}")  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def backend_editable_requirements(project: Path) -> list[str]:
    """``editable_requirements`` with the backend installed here, in a temporary folder,
    for this machine's Python (the hook only reads the project's configuration)."""
    build_system = tomllib.loads((project / "pyproject.toml").read_text())["build-system"]
    with tempfile.TemporaryDirectory() as tmp:
        pip(["install", "--quiet", "--no-warn-conflicts", "--target", tmp,
             *build_system["requires"]])  # fmt: skip
        return editable_requirements(build_system, Path(tmp), project)


def resolve(requirements: list[str], args: argparse.Namespace) -> dict:
    """pip's installation report of ``requirements`` for the target."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        pip(["install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
             "--target", str(Path(tmp) / "t"), *target_flags(args), *requirements])  # fmt: skip
        return json.loads(report.read_text())


def pip(arguments: list[str]) -> None:
    command = [sys.executable, "-m", "pip", *arguments]
    done = subprocess.run(command, check=False)
    if done.returncode != 0:
        raise SystemExit(f"pip {arguments[0]} failed (exit {done.returncode}): {' '.join(command)}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder for the wheels (made if missing)")
    parser.add_argument("--python-version", required=True, help="the target's, e.g. 3.12")
    parser.add_argument("--platform", action="append", required=True,
                        help="a wheel platform tag of the target (repeat: pip matches "
                             "each exactly), e.g. manylinux_2_28_x86_64")  # fmt: skip
    parser.add_argument("--have", type=Path, help="the target's pip list --format=freeze")
    parser.add_argument("--replace", action="append", default=[],
                        help="carry this distribution even where the target has it")  # fmt: skip
    parser.add_argument("--extra", action="append", default=[],
                        help="an optional dependency group, e.g. privacy")  # fmt: skip
    args = parser.parse_args(argv)
    if not re.fullmatch(r"3\.\d+", args.python_version):
        parser.error(f"--python-version={args.python_version!r} is not allowed: expected 3.N")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    replaced = {canonical(name) for name in args.replace}
    have = read_have(args.have.read_text()) if args.have else {}
    have = {name: version for name, version in have.items() if name not in replaced}
    requirements = project_requirements(ROOT / "pyproject.toml", args.extra)
    requirements += backend_editable_requirements(ROOT)
    target = target_environment(args.python_version, args.platform)
    carry, kept = needed(resolve(requirements, args), requirements, have, target)
    for left in kept:
        if left.unmet:
            print(f"the target's {left.pin.name} {left.version} does not meet "
                  f"{', '.join(left.unmet)}: --replace {left.pin.name} carries "
                  f"{left.pin.version}")  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    if carry:
        pip(["download", "--no-deps", "--quiet", "-d", str(args.out), *target_flags(args),
             *(pin.requirement() for pin in carry)])  # fmt: skip
    size = sum(p.stat().st_size for p in args.out.glob("*.whl")) / 2**20
    print(
        f"wheelhouse: wheels={len(carry)} kept_on_target={len(kept)} "
        f"mib={size:.1f} python={args.python_version} out={args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
