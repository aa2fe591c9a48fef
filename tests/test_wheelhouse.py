"""deploy/wheelhouse.py: which wheels an offline machine needs (no index reached here)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_wheelhouse() -> Any:
    spec = importlib.util.spec_from_file_location("wheelhouse", ROOT / "deploy" / "wheelhouse.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["wheelhouse"] = module
    spec.loader.exec_module(module)
    return module


wheelhouse = load_wheelhouse()


def item(name: str, version: str, *requires: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "version": version, "requires_dist": list(requires)}}


#: A report as ``pip install --dry-run --report`` writes it, run on Python 3.11 for a
#: 3.12 target: the app needs a framework (with an extra) and PyTorch, which needs an
#: index's CUDA library; one dependency only exists for Python 3.12 and up.
REPORT = {
    "environment": {
        "python_version": "3.11",
        "python_full_version": "3.11.7",
        "platform_machine": "x86_64",
        "sys_platform": "linux",
    },  # fmt: skip
    "install": [
        item(
            "Framework",
            "1.0",
            "wire>=2",
            'sim-engine; extra == "simulation"',
            'new-only; python_version >= "3.12"',
        ),  # fmt: skip
        item("wire", "2.1"),
        item("sim_engine", "3.0", "wire"),
        item("new-only", "0.1"),
        item("torch", "2.9.0", "nvidia-cublas-cu12==12.6", "filelock"),
        item("nvidia-cublas-cu12", "12.6"),
        item("filelock", "3.0"),
        item("hatchling", "1.0", "pathspec"),
        item("pathspec", "0.12"),
    ],
}
ROOTS = ["framework[simulation]>=1", "torch>=2", "hatchling"]


def names(pins: list[Any]) -> list[str]:
    return [pin.name for pin in pins]


def test_a_distribution_the_target_has_is_not_carried_nor_what_it_alone_needs() -> None:
    """The target's own PyTorch stays, and the CUDA library the index's PyTorch would
    need is not carried; the extra's and the target Python's dependencies are."""
    target = wheelhouse.target_environment("3.12", ["manylinux_2_28_x86_64"])
    carry, kept = wheelhouse.needed(REPORT, ROOTS, {"torch": "2.11.0"}, target)
    assert names(carry) == ["Framework", "hatchling", "new-only", "pathspec", "sim_engine",
                            "wire"]  # fmt: skip
    assert kept == [wheelhouse.Kept(wheelhouse.Pinned("torch", "2.9.0"), "2.11.0")]


def test_without_the_target_listed_everything_resolved_is_carried_for_its_python() -> None:
    on_311 = wheelhouse.target_environment("3.11", ["manylinux_2_17_x86_64"])
    carry, kept = wheelhouse.needed(REPORT, ROOTS, {}, on_311)
    assert "new-only" not in names(carry) and kept == []
    assert {"torch", "nvidia-cublas-cu12", "filelock"} <= set(names(carry))


def test_a_kept_distribution_that_fails_a_requirement_on_it_is_named() -> None:
    """The target's PyTorch is older than the app asks: it is kept (a machine's own build
    is not replaced unasked), and the requirement it fails is given."""
    target = wheelhouse.target_environment("3.12", ["manylinux_2_28_x86_64"])
    _, kept = wheelhouse.needed(REPORT, ROOTS, {"torch": "1.13.1+cu117"}, target)
    assert kept == [wheelhouse.Kept(wheelhouse.Pinned("torch", "2.9.0"), "1.13.1+cu117",
                                    ("torch>=2",))]  # fmt: skip
    _, kept = wheelhouse.needed(REPORT, ROOTS, {"torch": "2.11.0+cu130"}, target)
    assert kept[0].unmet == ()


def test_without_the_extra_its_dependencies_are_not_carried() -> None:
    target = wheelhouse.target_environment("3.12", ["manylinux_2_28_x86_64"])
    carry, _ = wheelhouse.needed(REPORT, ["framework", "torch"], {"torch": ""}, target)
    assert names(carry) == ["Framework", "new-only", "wire"]


def test_the_targets_list_is_read_from_pip_freeze_and_pip_list() -> None:
    text = "\n".join([
        "Torch==2.11.0+cu130", "numpy==2.5.2", "jax", "# a comment", "",
        "-e git+https://example.org/x.git#egg=x", "mylib @ file:///tmp/mylib",
        "typing_extensions==4.15.0  # pinned",
    ])  # fmt: skip
    assert wheelhouse.read_have(text) == {
        "torch": "2.11.0+cu130", "numpy": "2.5.2", "jax": "", "mylib": "",
        "typing-extensions": "4.15.0",
    }  # fmt: skip
    with pytest.raises(ValueError, match="--have: not a distribution line: '=== oops'"):
        wheelhouse.read_have("=== oops")
    with pytest.raises(ValueError, match="--have: not a version in 'torch==latest'"):
        wheelhouse.read_have("torch==latest")


def test_the_projects_requirements_come_with_its_build_backend_and_extras() -> None:
    pyproject = ROOT / "pyproject.toml"
    plain = wheelhouse.project_requirements(pyproject, [])
    assert any(r.startswith("flwr[simulation]") for r in plain) and "hatchling" in plain
    with_privacy = wheelhouse.project_requirements(pyproject, ["privacy"])
    assert set(with_privacy) - set(plain) == {"dp-accounting>=0.4"}
    with pytest.raises(SystemExit, match="--extra=gpu is not allowed: expected one of dev, "):
        wheelhouse.project_requirements(pyproject, ["gpu"])


def test_the_target_machine_is_read_from_its_platform_tags() -> None:
    assert wheelhouse.target_environment("3.11", ["manylinux_2_28_aarch64"]) == {
        "python_version": "3.11", "python_full_version": "3.11.0", "platform_machine": "aarch64",
    }  # fmt: skip
    assert "platform_machine" not in wheelhouse.target_environment("3.12", ["any"])


def test_a_python_version_that_is_not_3_n_is_refused(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        wheelhouse.parse_args(["out", "--python-version", "312", "--platform", "any"])
    assert "--python-version='312' is not allowed: expected 3.N" in capsys.readouterr().err


def fake_backend(folder: Path, body: str) -> Path:
    """A build backend module ``fakebackend`` in ``folder`` (as if installed there)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "fakebackend.py").write_text(body)
    return folder


def test_the_editable_install_carries_what_the_backend_asks_for(tmp_path: Path) -> None:
    """``pip install --no-build-isolation -e .`` installs no build requirement: what the
    backend's PEP 660 hook names (hatchling: ``editables``) must be among the wheels,
    read from the backend run in the project's folder."""
    site = fake_backend(tmp_path / "site", (
        "import os\n"
        "def get_requires_for_build_editable(config_settings=None):\n"
        "    return ['editables~=0.3', 'from-' + os.path.basename(os.getcwd())]\n"
    ))  # fmt: skip
    project = tmp_path / "myproject"
    project.mkdir()
    build_system = {"requires": ["fakebackend"], "build-backend": "fakebackend"}
    asked = wheelhouse.editable_requirements(build_system, site, project)
    assert asked == ["editables~=0.3", "from-myproject"]


def test_a_backend_without_the_editable_hook_asks_for_nothing(tmp_path: Path) -> None:
    site = fake_backend(tmp_path / "site", "def build_wheel(*args):\n    pass\n")
    build_system = {"requires": ["fakebackend"], "build-backend": "fakebackend"}
    assert wheelhouse.editable_requirements(build_system, site, tmp_path) == []


def test_a_backend_that_fails_is_named(tmp_path: Path) -> None:
    site = fake_backend(tmp_path / "site", "raise RuntimeError('no config')\n")
    build_system = {"requires": ["fakebackend"], "build-backend": "fakebackend:api"}
    with pytest.raises(SystemExit, match="(?s)fakebackend:api failed.*no config"):
        wheelhouse.editable_requirements(build_system, site, tmp_path)
