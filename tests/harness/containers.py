"""Podman for the container tests: a local Debian base, the image built from the Containerfile.

There is no image registry here, so the public base the Containerfile names
(`debian:bookworm-slim`) is stood in for by a Debian bookworm made with `debootstrap` and
`podman import`ed once per machine; the build points the Containerfile's `BASE` argument at it.
Podman runs as root with `runc` and host networking (crun fails on this machine's hybrid
cgroups, and setting RLIMIT_NOFILE is refused), configured by a containers.conf of our own.
Every step takes a file lock, so test processes build each image once, one at a time.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BASE_IMAGE = "localhost/postroom-test-base:bookworm"
POSTROOM_IMAGE = "localhost/postroom:test"
POSTGRES_IMAGE = "localhost/postroom-test-postgres:15"
_STATE = Path("/var/tmp/postroom-containers")
_CONF = """\
[containers]
default_ulimits = []
log_driver = "k8s-file"
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""


def _env() -> dict[str, str]:
    _STATE.mkdir(parents=True, exist_ok=True)
    conf = _STATE / "containers.conf"
    if not conf.exists() or conf.read_text() != _CONF:
        conf.write_text(_CONF)
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def podman(*args: str, timeout: float = 120, check: bool = True) -> str:
    """Run podman with the tests' configuration; its standard output."""
    done = subprocess.run(
        ["podman", *args], env=_env(), capture_output=True, text=True, timeout=timeout
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def logs(container: str) -> str:
    """What the container wrote; podman replays its standard error on its own."""
    done = subprocess.run(
        ["podman", "logs", container], env=_env(), capture_output=True, text=True, timeout=60
    )
    return done.stdout + done.stderr


# The project's own (a dev dependency): Debian's 1.0.3 ignores `profiles` and cannot put a
# service on the host's network (it adds a bridge network to every container).
COMPOSE = Path(sys.executable).parent / "podman-compose"


def compose(*args: str, cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    """Run podman-compose with the tests' podman configuration; its output."""
    done = subprocess.run(
        [str(COMPOSE), *args],
        cwd=cwd,
        env={**_env(), **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise RuntimeError(f"podman-compose {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout + done.stderr


def require_podman() -> None:
    """Skip, saying why, where the container tests cannot run."""
    if shutil.which("podman") is None:
        pytest.skip(
            "podman is not installed (apt-get install podman runc): container tests skipped"
        )
    if os.geteuid() != 0:
        pytest.skip("the container tests run podman as root (host networking, runc)")


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    _STATE.mkdir(parents=True, exist_ok=True)
    with open(_STATE / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _exists(image: str) -> bool:
    return subprocess.run(["podman", "image", "exists", image], env=_env()).returncode == 0


def base_image() -> str:
    """The local stand-in for debian:bookworm-slim, made once per machine."""
    with _locked("base"):
        if _exists(BASE_IMAGE):
            return BASE_IMAGE
        if shutil.which("debootstrap") is None:
            pytest.skip("debootstrap is not installed: no local Debian base for the image")
        with tempfile.TemporaryDirectory(dir="/var/tmp") as scratch:
            root = Path(scratch) / "rootfs"
            subprocess.run(
                ["debootstrap", "--variant=minbase", "bookworm", str(root)],
                check=True,
                capture_output=True,
                timeout=900,
            )
            # As the slim image: no package lists or downloaded packages left in the layer.
            subprocess.run(["chroot", str(root), "apt-get", "clean"], check=True, timeout=60)
            for lists in (root / "var/lib/apt/lists").glob("*_*"):
                lists.unlink()
            # The context closes tar's pipe (left open, it is a ResourceWarning, an error here).
            with subprocess.Popen(
                ["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE
            ) as tar:
                subprocess.run(
                    ["podman", "import", "-", BASE_IMAGE],
                    stdin=tar.stdout,
                    env=_env(),
                    check=True,
                    capture_output=True,
                    timeout=300,
                )
        return BASE_IMAGE


def build(tag: str, containerfile: Path, context: Path) -> str:
    """Build `containerfile` on the local base; layers are cached, so a rebuild is quick."""
    base = base_image()
    # Package downloads go through this machine's TLS-inspecting proxy: give the build the
    # CA bundle the host trusts (the Containerfile's PIP_CERT argument).
    ca_file = ssl.get_default_verify_paths().cafile or "/etc/ssl/certs/ca-certificates.crt"
    with _locked("build"):
        podman(
            "build",
            "--format",
            "docker",  # OCI images have no HEALTHCHECK: podman drops it from them
            "--network",
            "host",
            "--build-arg",
            f"BASE={base}",
            "--volume",
            f"{ca_file}:/etc/ssl/host-ca.crt:ro",
            "--build-arg",
            "PIP_CERT=/etc/ssl/host-ca.crt",
            "--tag",
            tag,
            "--file",
            str(containerfile),
            str(context),
            timeout=900,
        )
    return tag
