"""The single-file build: `scripts/build` makes a .pyz that serves with a bare Python 3.11.

The file is built once (about 15 s with pip's cache warm) and started by the interpreter
underneath the virtualenv, in isolated mode and away from the checkout, so it can only work
if it carries every dependency and the schema files inside it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx
import pytest

from postroom import config
from tests.harness.service import REPO, free_port


def _bare_python() -> str:
    # The interpreter the venv was made from: it has none of the venv's packages.
    return getattr(sys, "_base_executable", sys.executable)


def test_built_file_serves_with_only_python(tmp_path: Path) -> None:
    pyz = tmp_path / "postroom.pyz"
    subprocess.run([str(REPO / "scripts" / "build"), str(pyz)], check=True, timeout=300)
    with zipfile.ZipFile(pyz) as bundle:
        names = bundle.namelist()
    assert any(name.endswith("storage/schema/0001_initial.sql") for name in names)
    assert any(name.endswith("api/static/docs/swagger-ui-bundle.js") for name in names)
    assert any(name.endswith("console/templates/console/base.html") for name in names)

    port = free_port()
    env = {
        "PATH": "/usr/bin:/bin",
        "SHIV_ROOT": str(tmp_path / "shiv"),  # where shiv unpacks its site-packages
        "POSTROOM_DATABASE_URL": f"sqlite:///{tmp_path / 'data' / 'postroom.db'}",
        "POSTROOM_API_LISTEN": f"127.0.0.1:{port}",
        "POSTROOM_SUBMISSION_LISTEN": f"127.0.0.1:{free_port()}",
        "POSTROOM_INBOUND_LISTEN": f"127.0.0.1:{free_port()}",
    }
    (tmp_path / "data").mkdir()
    server = subprocess.Popen(
        [_bare_python(), "-I", str(pyz), "serve"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        status = None
        deadline = time.monotonic() + 60
        # One client for every try: `httpx.get` loads the CA store each time (26 ms of CPU).
        with httpx.Client(verify=False, timeout=2) as client:
            while status != 200 and time.monotonic() < deadline and server.poll() is None:
                try:
                    status = client.get(f"http://127.0.0.1:{port}/healthz").status_code
                except httpx.TransportError:
                    time.sleep(0.1)
        assert status == 200, "the built file did not answer /healthz"
        # The console's first-run page and its pinned htmx come from the file too.
        first_run = httpx.get(f"http://127.0.0.1:{port}/setup", timeout=5)
        assert first_run.status_code == 200 and "Welcome to Postroom" in first_run.text
        htmx = httpx.get(f"http://127.0.0.1:{port}/assets/htmx-2.0.11.min.js", timeout=5)
        assert htmx.status_code == 200 and len(htmx.content) > 10_000
        server.terminate()
        assert server.wait(timeout=30) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        assert server.stdout is not None
        server.stdout.close()


def test_example_config_is_accepted_as_it_ships() -> None:
    settings = config.load({}, REPO / "deploy" / "postroom.toml")
    assert settings.database_url == "sqlite:////var/lib/postroom/postroom.db"
    assert settings.inbound_listen == ("0.0.0.0", 25)


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed: the unit was not checked")
    unit = tmp_path / "postroom.service"
    shutil.copy(REPO / "deploy" / "postroom.service", unit)
    checked = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    # ExecStart names /usr/bin/python3.11; a machine without it would only warn about that.
    problems = [
        line for line in checked.stderr.splitlines() if "python3.11" not in line and line.strip()
    ]
    assert problems == [], checked.stderr
