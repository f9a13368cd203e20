"""The package tree (issue 17): the design card's top-level folders are the subpackages of
``cxlssd`` by pyproject.toml's ``package-dir``, with no symlink; a wheel holds every file
the platform builds from, and a guest runs from the installed wheel."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import cxlssd

REPO = Path(__file__).resolve().parents[1]
TOP_LEVEL = ("abi", "experiments", "firmware", "guest", "host_os", "platform")


def _tracked(*paths: str) -> list[str]:
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-s", *paths], capture_output=True,
                            text=True, check=True)
    return listed.stdout.splitlines()


def _env_without_this_checkout() -> dict[str, str]:
    """The environment of a user's shell: no PYTHONPATH pointing at a checkout."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_the_tree_has_no_symlink_and_keeps_the_top_level_folders() -> None:
    links = [line for line in _tracked() if line.startswith("120000")]
    assert links == []
    assert dict(cxlssd.package_roots())["platform"] == REPO / "platform"
    assert {name for name, _ in cxlssd.package_roots() if name} == set(TOP_LEVEL)


def test_python_m_pytest_works_from_the_repository_root() -> None:
    """pytest imports the standard library's platform module: the root's platform/ folder
    must not shadow it, and pyproject.toml's pythonpath finds the package."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/firmware"],
        cwd=REPO, env=_env_without_this_checkout(), capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert " passed" in result.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of the tracked files as they are in the checkout, built in a copy of them
    (setuptools' build/ would otherwise keep files of earlier builds, and land in the tree)."""
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for line in _tracked():
        path = line.split("\t", 1)[1]
        if (REPO / path).is_file():
            (source / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / path, source / path)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
                    "-w", str(out), str(source)], check=True, timeout=600)
    (built,) = out.glob("cxlssd-*.whl")
    return built


def test_the_wheel_holds_every_file_of_the_package(wheel: Path) -> None:
    """Every tracked file of the top-level folders and of src/cxlssd, at its place in the
    package: the rootfs files (cxlssd-init, fstab, the sshd drop-in), configs, profiles and C
    sources included."""
    tracked = [line.split("\t", 1)[1] for line in _tracked("src/cxlssd", *TOP_LEVEL)]
    expected = {"cxlssd/" + path.removeprefix("src/cxlssd/") for path in tracked}
    with zipfile.ZipFile(wheel) as archive:
        names = {name for name in archive.namelist() if not name.startswith("cxlssd-")}
        init = archive.getinfo("cxlssd/guest/rootfs/usr/local/sbin/cxlssd-init")
    assert names == expected
    assert init.external_attr >> 16 & 0o111, "cxlssd-init lost its execute bits"


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a program that imports the package installed from the wheel
    (pip install --target; the dependencies are the venv's)."""
    site = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                    "--target", str(site), str(wheel)], check=True, timeout=600)
    return {**_env_without_this_checkout(), "PYTHONPATH": str(site)}


def test_the_installed_package_needs_no_checkout(installed: dict[str, str], tmp_path: Path) -> None:
    """Its files are its own (not the checkout's), its extras come from its metadata, the
    guest image it would build has the checkout's key (same inputs), and `cxlssd test`
    says that tests need a checkout."""
    probe = (
        "import json, cxlssd\n"
        "from cxlssd.guest.image import current_image\n"
        "from cxlssd.setup_commands import extra_requirements\n"
        "print(json.dumps([str(cxlssd.CHECKOUT_ROOT), [str(p) for _, p in cxlssd.package_roots()],\n"
        "                  extra_requirements('cluster'), current_image().rootfs.parent.name]))\n"
    )
    found = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=installed, capture_output=True,
                           text=True, timeout=120)
    assert found.returncode == 0, found.stderr[-3000:]
    checkout, roots, cluster, image_key = json.loads(found.stdout)
    from cxlssd.guest.image import current_image

    assert checkout == "None"
    assert len(roots) == 1 and Path(roots[0]).is_relative_to(installed["PYTHONPATH"])
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = project["optional-dependencies"]["cluster"]
    assert [Requirement(r) for r in cluster] == [Requirement(r) for r in declared]
    assert image_key == current_image().rootfs.parent.name
    tests = subprocess.run([sys.executable, "-m", "cxlssd", "test"], cwd=tmp_path, env=installed,
                           capture_output=True, text=True, timeout=120)
    assert tests.returncode == 2 and "only a source checkout holds" in tests.stderr, tests.stderr[-2000:]


@pytest.mark.guest
def test_a_guest_runs_a_design_from_the_installed_wheel(installed: dict[str, str], tmp_path: Path) -> None:
    """Installed, not run from the checkout: the package builds (from its own copies of the
    sources) the guest image, plugin, guest runtime and kernel helper, boots, attaches the
    firmware and runs a program. Each build is keyed by the contents of its inputs, so the
    installed package uses the checkout's cached builds when its files are the same (the
    test above checks the image's key)."""
    result = subprocess.run(
        [sys.executable, "-m", "cxlssd", "guest", "exec", "--design", "base-cssd", "--", "chase",
         "--bytes", "4M", "--steps", "2000"],
        cwd=tmp_path, env=installed, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "== design base-cssd: 1 regions of interest (modelled time)" in result.stdout
