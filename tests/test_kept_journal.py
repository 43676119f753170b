"""The spool of outcomes a stop during an outage could not write (engine/delivery/kept_journal.py):
what is saved is read back whole, one process holds a file at a time, and a file that cannot
be read or written is set aside instead of tried at every start. (The whole path, a node
stopped during an outage and the next one writing its outcomes: tests/test_database_outage.py.)
"""

from __future__ import annotations

import os
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

from engine.delivery.domain_queue import Kept, Outcomes
from engine.delivery.full_mailboxes import FullMailboxes
from engine.delivery.kept_journal import Journal
from storage.emails import Event, RecipientUpdate
from storage.incidents import Hit
from storage.suppressions import Suppression

NOW = datetime(2026, 11, 27, 21, 30, 5, 123456, tzinfo=UTC)


def _kept(node: str = "host/12/ab") -> Kept:
    mailboxes = FullMailboxes()
    mailboxes.note_full("ws_1", "em_2", "full@example.net", "deferred", 1, 1)
    mailboxes.note_delivered("ws_1", "ann@example.net")
    part = Outcomes(
        updates=[
            RecipientUpdate("em_1", "ann@example.net", "delivered", None, "250 2.0.0 OK"),
            RecipientUpdate(
                "em_2", "full@example.net", "deferred", NOW + timedelta(minutes=5), "452 4.2.2"
            ),
        ],
        events=[
            Event("ev_1", "em_1", "ws_1", "delivered", "ann@example.net", {"mx": "mx.e"}, NOW),
            Event("ev_2", "em_2", "ws_1", "deferred", "full@example.net", {"n": [1, 2]}, NOW),
        ],
        bounces=[("ws_1", Suppression("gone@example.net", "hard_bounce", NOW, "em_3"))],
        now=NOW,
        hits={("ws_1", "dom_1"): Hit("blocked", "sender.example", "550 5.7.1 blocked")},
        delivered={("ws_1", "dom_2")},
        mailboxes=mailboxes,
    )
    return Kept("example.net", part, node)


def _saved(journal: Journal, kept: list[Kept]) -> Path:
    """Save `kept` as a process that then ends would: the file left, unheld."""
    saved = journal.save(kept)
    os.close(saved.fd)
    return saved.path


def test_what_is_saved_is_read_back_whole(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "spool")
    kept = [_kept(), _kept("other/3/cd")]
    path = _saved(journal, kept)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert [p.name for p in journal.directory.iterdir()] == [path.name]  # nothing partial

    [adopted] = journal.adopt()
    assert adopted.kept == kept
    journal.done([adopted])
    assert list(journal.directory.iterdir()) == []


def test_one_process_holds_a_file_at_a_time(tmp_path: Path) -> None:
    first, second = Journal(tmp_path), Journal(tmp_path)
    saved = first.save([_kept()])
    assert second.adopt() == []  # its writer holds it from before it had its name
    os.close(saved.fd)  # the writer dies before the database answers: the next one's
    held = first.adopt()
    assert len(held) == 1
    assert second.adopt() == []  # locked by the first (another process's flock alike)
    os.close(held[0].fd)
    [again] = second.adopt()
    assert again.kept == [_kept()]
    second.done([again])


def test_an_unreadable_file_is_set_aside(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    (tmp_path / "kept-broken.json").write_text('{"version": 1, "kept": [{"key": ')
    (tmp_path / "kept-future.json").write_text('{"version": 99, "kept": []}')
    (tmp_path / "kept-list.json").write_text("[1, 2]")  # not even an object
    good = _saved(journal, [_kept()])

    adopted = journal.adopt()
    assert [each.path for each in adopted] == [good]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["kept-broken.unreadable", "kept-future.unreadable", "kept-list.unreadable", good.name]
    )
    journal.done(adopted)


def test_outcomes_the_database_refused_are_set_aside(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    path = _saved(journal, [_kept()])
    journal.refused(journal.adopt())
    assert [p.name for p in tmp_path.iterdir()] == [path.with_suffix(".unwritten").name]
    assert journal.adopt() == []  # never tried again at the next start


def test_no_spool_yet_adopts_nothing(tmp_path: Path) -> None:
    assert Journal(tmp_path / "never-made").adopt() == []
