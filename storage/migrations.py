"""Schema migrations: numbered SQL files in `storage/schema/`, applied in order.

All pending files run in one transaction and each is recorded in `schema_migrations`, so
applying is idempotent and a half-applied file never remains. On PostgreSQL an advisory lock keeps two
nodes starting at once from applying the same file twice.
"""

from __future__ import annotations

from importlib import resources

from storage.tx import Tx

_MIGRATION_LOCK = 7_201_1  # arbitrary, fixed: identifies Postroom's migration lock


def available() -> list[tuple[int, str]]:
    """Every migration shipped with the package: (version, SQL text), in order."""
    # Through importlib.resources, so the files are found inside a zip (the shiv build) too.
    folder = resources.files("storage") / "schema"
    return sorted(
        (int(entry.name.split("_", 1)[0]), entry.read_text(encoding="utf-8"))
        for entry in folder.iterdir()
        if entry.name.endswith(".sql")
    )


def _statements(sql: str) -> list[str]:
    lines = [line for line in sql.splitlines() if not line.lstrip().startswith("--")]
    return [statement.strip() for statement in "\n".join(lines).split(";") if statement.strip()]


def apply_pending(tx: Tx) -> list[int]:
    """Apply every migration not yet applied; the versions applied now."""
    if tx.dialect == "postgresql":
        tx.execute(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK})")
    tx.execute("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY)")
    done = {row["version"] for row in tx.all("SELECT version FROM schema_migrations")}
    applied = []
    for version, sql in available():
        if version in done:
            continue
        for statement in _statements(sql):
            tx.execute(statement)
        tx.execute("INSERT INTO schema_migrations (version) VALUES (:v)", {"v": version})
        applied.append(version)
    return applied
