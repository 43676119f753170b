"""An upgrade from an earlier release keeps its queued mail (issue 29).

Each release named in tests/releases.txt is built from the repository's own history
(`git archive`), run as `postroom serve` on a fresh database with the same dependencies as
this checkout (the earlier release's pins are a subset of ours), and given mail to send while
the recipients' server refuses it for now, so it stays queued. The release is stopped and the
current code started on the same database and key file. Asserted: the API key the earlier
release made still works, and every queued email is delivered exactly once, DKIM-signed with
the key the domain got under the earlier release (the DNS still publishes only that one).
"""

from __future__ import annotations

import atexit
import functools
import io
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

import httpx
import pytest
import trio

from tests.harness.cluster import (
    SENDER,
    Cluster,
    Node,
    arrivals,
    node_env,
    prepare_account,
    until_arrived,
)
from tests.harness.dns_server import DnsServer
from tests.harness.sending import dkim_verifies
from tests.harness.service import REPO
from tests.harness.smtp_sink import SmtpSink

RELEASES = Path(__file__).with_name("releases.txt")
EMAILS = 20
DOMAIN = "upgrade.example"


def _releases() -> list[str]:
    lines = RELEASES.read_text().splitlines()
    return [line.split()[0] for line in lines if line.strip() and not line.startswith("#")]


@functools.cache
def _built(commit: str) -> Path:
    """The release's source tree, from `git archive` (once per test process)."""
    archived = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", commit], capture_output=True
    )
    if archived.returncode != 0:
        pytest.skip(f"release {commit[:7]} is not in this repository's history (shallow clone?)")
    tree = Path(tempfile.mkdtemp(prefix=f"postroom-{commit[:7]}-"))
    atexit.register(shutil.rmtree, tree, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(archived.stdout)) as archive:
        archive.extractall(tree, filter="data")
    return tree


async def _until_all(client: httpx.AsyncClient, ids: list[str], status: str) -> None:
    """Wait until every email of `ids` has `status`."""
    with trio.fail_after(30):
        while True:
            found = {(await client.get(f"/v1/emails/{i}")).json()["status"] for i in ids}
            if found == {status}:
                return
            await trio.sleep(0.2)


@pytest.mark.empty_database  # the earlier release makes the schema as it was
@pytest.mark.parametrize("release", _releases())
async def test_mail_queued_by_an_earlier_release_is_delivered_once_after_upgrade(
    release: str,
    database_url: str,
    tmp_path: Path,
    dns_server: DnsServer,
    smtp_sink: SmtpSink,
) -> None:
    source = await trio.to_thread.run_sync(_built, release)
    env = node_env(
        database_url, tmp_path, dns_nameserver=dns_server.nameserver, delivery_port=smtp_sink.port
    )
    earlier = Node({**env, "PYTHONPATH": str(source)}, tmp_path, workers=None)
    current = Node(env, tmp_path)
    start = trio.to_thread.run_sync
    recipients = [f"reader{i}@{DOMAIN}" for i in range(EMAILS)]
    for address in recipients:  # refused for now: the mail stays queued
        smtp_sink.reply_for(address, 451, "4.2.0 try again later")
    try:
        await start(earlier.start)
        key = await prepare_account(Cluster(database_url, [earlier]), dns_server, [DOMAIN], None)
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=earlier.url, headers=headers, timeout=30) as client:
            sent = []
            for address in recipients:
                body = {
                    "from_": {"email": SENDER},
                    "to": [{"email": address}],
                    "subject": "Before the upgrade",
                    "text": "Hello.",
                }
                response = await client.post("/v1/emails/", json=body)
                assert response.status_code == 202, response.text
                sent.append(response.json())
            ids = [email["id"] for email in sent]
            await _until_all(client, ids, "deferred")
        await start(earlier.stop)
        assert smtp_sink.messages == []

        for address in recipients:
            smtp_sink.reply_for(address, 250, "2.1.5 OK")
        await start(current.start)
        async with httpx.AsyncClient(base_url=current.url, headers=headers, timeout=30) as client:
            # The deferred mail is due in a minute; the operator's queue action sends it now.
            retried = await client.post(
                "/v1/queue/actions", json={"q": f"destination:{DOMAIN}", "action": "retry_now"}
            )
            assert retried.status_code == 200, retried.text
            assert retried.json()["emails"] == EMAILS
            wanted = {email["message_id"] for email in sent}
            await until_arrived(smtp_sink, wanted, timeout=30)
            await _until_all(client, ids, "delivered")
    finally:
        await start(earlier.stop)
        await start(current.stop)

    delivered = [mid for mid, _ in arrivals(smtp_sink)]
    assert sorted(delivered) == sorted(wanted)  # each once
    for message in smtp_sink.messages:  # in a thread: the DNS server answers on this one
        assert await start(dkim_verifies, message.data, dns_server)
