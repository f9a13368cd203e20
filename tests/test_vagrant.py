"""The Vagrantfile: `vagrant validate` passes, and provisioning uses the README's setup
entry point (`./cxlssd setup` in the synced project folder), not a second install path.

`vagrant validate` needs no box and no network; it runs with a private VAGRANT_HOME so
the user's boxes, plugins and machine state are never touched. Vagrant (and Debian's
vagrant-libvirt plugin, for the libvirt block) is installed with apt
(`--no-install-recommends`) when missing and we are root; otherwise the validation test
is skipped with the reason. Each provider's block is validated with that provider active
(vagrant only validates the active provider's settings).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VAGRANTFILE = REPO / "Vagrantfile"
README = REPO / "README.md"


def _apt_install(package: str) -> str | None:
    """Install a Debian package without recommends; return why it failed, or None."""
    if os.geteuid() != 0:
        return f"{package} is not installed and installing it needs root"
    if shutil.which("apt-get") is None:
        return f"{package} is not installed and apt-get is not available"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}

    def run(*argv: str) -> str | None:
        try:
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            return f"`{' '.join(argv)}` timed out"
        if done.returncode == 0:
            return None
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return f"`{' '.join(argv)}` failed: {' / '.join(tail)}"

    install = ("apt-get", "install", "-y", "-qq", "--no-install-recommends", package)
    if run(*install) is None:  # the package lists are usually current already
        return None
    return run("apt-get", "update", "-qq") or run(*install)


def _installed(package: str) -> bool:
    done = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True)
    return done.returncode == 0 and "ok installed" in done.stdout


@pytest.fixture(scope="session")
def vagrant() -> str:
    """The vagrant binary, installed from Debian (no recommends) when missing."""
    if shutil.which("vagrant") is None:
        reason = _apt_install("vagrant")
        if reason is not None or shutil.which("vagrant") is None:
            reason = reason or "vagrant was installed but is not on PATH"
            print(f"\nskipping vagrant validate: {reason}")
            pytest.skip(f"vagrant unavailable: {reason}")
    found = shutil.which("vagrant")
    assert found is not None
    return found


@pytest.fixture(scope="session")
def libvirt_plugin(vagrant: str) -> None:
    """Debian's vagrant-libvirt (a system-wide plugin, so a private VAGRANT_HOME sees it).

    Without it vagrant has no libvirt provider and cannot check the libvirt block.
    """
    if not _installed("vagrant-libvirt"):
        reason = _apt_install("vagrant-libvirt")
        if reason is not None:
            print(f"\nskipping the libvirt provider check: {reason}")
            pytest.skip(f"vagrant-libvirt unavailable: {reason}")


def _validate(vagrant: str, tmp_path: Path, provider: str, path_prefix: str = "") -> None:
    env = {
        **os.environ,
        # Private state: the user's boxes, plugins and machines are never touched, and
        # no .vagrant/ appears in the checkout.
        "VAGRANT_HOME": str(tmp_path / "vagrant-home"),
        "VAGRANT_DOTFILE_PATH": str(tmp_path / "dotfile"),
        "VAGRANT_CHECKPOINT_DISABLE": "1",  # no version check over the network
        "VAGRANT_NO_COLOR": "1",
        # Only the active provider's block is validated (the others are just compiled).
        "VAGRANT_DEFAULT_PROVIDER": provider,
    }
    if path_prefix:
        env["PATH"] = f"{path_prefix}:{env.get('PATH', '')}"
    for name in ("VAGRANT_VAGRANTFILE", "VAGRANT_CWD"):
        env.pop(name, None)
    done = subprocess.run(
        [vagrant, "validate"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    output = (done.stdout + done.stderr).strip()
    print(f"vagrant validate ({provider}): {output}")
    assert done.returncode == 0, f"vagrant validate ({provider}) failed:\n{output}"
    assert "Vagrantfile validated successfully" in output
    assert "error" not in output.lower(), output
    assert not (REPO / ".vagrant").exists(), "vagrant validate left .vagrant/ in the repo"


@pytest.mark.usefixtures("libvirt_plugin")
def test_vagrant_validate_libvirt(vagrant: str, tmp_path: Path) -> None:
    _validate(vagrant, tmp_path, "libvirt")


def test_vagrant_validate_virtualbox(vagrant: str, tmp_path: Path) -> None:
    # VirtualBox must look usable for vagrant to validate its block; its provider only
    # asks `VBoxManage --version` before validation, so a stub answers that (nothing
    # else is called: there is no machine). A real VirtualBox is never involved.
    stub_dir = tmp_path / "bin"
    stub_dir.mkdir()
    stub = stub_dir / "VBoxManage"
    stub.write_text(
        '#!/bin/sh\n[ "$1" = --version ] && { echo 7.0.6r155176; exit 0; }\n'
        'echo "VBoxManage stub: unexpected call $*" >&2; exit 1\n'
    )
    stub.chmod(0o755)
    _validate(vagrant, tmp_path, "virtualbox", path_prefix=str(stub_dir))


def _readme_setup_command() -> str:
    """The setup command the README documents, e.g. `./cxlssd setup`."""
    commands = re.findall(r"\./cxlssd\s+setup\b", README.read_text())
    assert commands, "README.md documents no `./cxlssd setup` command"
    return "./cxlssd setup"


def _ruby_code(text: str) -> str:
    """The Vagrantfile without its comments (so documentation cannot satisfy a check)."""
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def test_provisioner_uses_the_readme_setup_entry_point() -> None:
    setup = _readme_setup_command()
    code = _ruby_code(VAGRANTFILE.read_text())

    synced = re.search(r'synced_folder\s+"\."\s*,\s*"([^"]+)"', code)
    assert synced, "the Vagrantfile does not sync the project folder ('.') into the VM"
    project_dir = synced.group(1)

    provisioners = re.findall(r"\.vm\.provision\b(.*?)(?=\n\S|\n  \S|\Z)", code, re.S)
    assert len(provisioners) == 1, f"expected exactly one provisioner, found {len(provisioners)}"
    provisioner = provisioners[0]
    assert re.search(r'type:\s*"shell"|"shell"', provisioner), "the provisioner is not a shell one"
    inline = re.search(r'inline:\s*"([^"]*)"', provisioner)
    assert inline, "the shell provisioner has no inline script"
    script = inline.group(1)
    # The script changes into the synced folder, then runs the README's entry point.
    assert re.search(rf"\bcd\s+{re.escape(project_dir)}\s*&&\s*{re.escape(setup)}\s*$", script), (
        f"provisioner script {script!r} does not run `cd {project_dir} && {setup}`"
    )


def test_vagrantfile_has_no_second_installation_path() -> None:
    code = _ruby_code(VAGRANTFILE.read_text())
    for installer in ("apt-get", "apt ", "dpkg", "pip ", "pip3", "curl", "wget"):
        assert installer not in code, f"the Vagrantfile installs things itself ({installer!r})"
