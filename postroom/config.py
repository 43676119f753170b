"""Settings: environment variables `POSTROOM_*`, or a TOML file given with `--config`.

The file uses the same names in lower case without the prefix; the environment wins over the
file. Every value is checked at start-up, and a bad one stops the service with one line that
names the setting and says what is expected (`SettingsError`).
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from engine.platform.settings import Caps

PREFIX = "POSTROOM_"

DEFAULTS: dict[str, str] = {
    "database_url": "sqlite:///./postroom-data/postroom.db",
    "api_listen": "127.0.0.1:8080",
    "submission_listen": "127.0.0.1:2587",
    "inbound_listen": "127.0.0.1:2525",
    "smtp_host": "localhost",
    # The port the relay is reached at, told with each SMTP credential; empty: the port of
    # submission_listen (a container maps 587 to its 2587 and says 587).
    "smtp_port": "",
    "public_url": "http://127.0.0.1:8080",
    "dns_servers": "",
    # on: the resolvers validate DNSSEC, their AD bit is trusted and DANE enforced
    # (engine/delivery/dane.py), as Postfix's smtp_dns_support_level = dnssec.
    "dnssec": "off",
    # The addresses the service's mail leaves from, which domains' SPF records must authorise
    # (engine/domains/spf.py); empty: those of smtp_host.
    "sending_addresses": "",
    # A name whose SPF record lists those addresses, for owners to `include:`; empty: they are
    # told to add `a:<smtp_host>` (or the sending addresses themselves, when set).
    "spf_include": "",
    "delivery_port": "25",
    "mta_sts_port": "443",  # for tests: where MTA-STS policies are fetched (as delivery_port)
    "tls_cert": "",
    "tls_key": "",
    "extra_ca_file": "",
    "secret_key": "",
    "secret_key_file": "",  # beside the SQLite database, else ./postroom-data/secret.key
    # Where a stop during a database outage saves the delivery outcomes the database did not
    # take (engine/delivery/kept_journal.py); empty: beside the SQLite database, else
    # ./postroom-data/spool.
    "spool_dir": "",
    "system_from": "",
    "domain_transfers": "on",
    "allow_private_targets": "off",
    "log_format": "json",
    "metrics_token": "",
    "sandbox": "off",  # on: new workspaces start in sandbox mode (engine/sandbox)
    # Seconds a clean stop (SIGTERM) lets SMTP transactions under way finish; below the
    # systemd unit's TimeoutStopSec (deploy/postroom.service).
    "drain_seconds": "30",
    # Operator-wide caps on destination policies (engine/delivery/policies.py); empty: none.
    "delivery_max_connections": "20",
    "delivery_max_per_connection": "",
    "delivery_max_per_minute": "",
    "delivery_max_per_hour": "",
    "delivery_max_per_day": "",
    # Recipients delivered in 30 days before a domain's complaint rate pauses or stops its
    # mail (engine/platform/settings.py `ComplaintLimits`).
    "complaint_min_deliveries": "1000",
}


class SettingsError(Exception):
    """Raised when a setting is missing or malformed; the message names the setting."""


Address = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Settings:
    database_url: str
    api_listen: Address
    submission_listen: Address
    inbound_listen: Address
    smtp_host: str
    smtp_port: int
    public_url: str
    dns_servers: list[Address] | None
    delivery_port: int
    mta_sts_port: int
    tls_cert: Path | None
    tls_key: Path | None
    extra_ca_file: Path | None
    secret_key: str | None
    secret_key_file: Path  # the master key when secret_key is not set
    spool_dir: Path  # outcomes a stop during an outage could not write, for the next start
    system_from: str
    domain_transfers: bool
    allow_private_targets: bool
    log_format: str
    metrics_token: str | None  # bearer token /metrics needs; None: open
    sandbox: bool = False  # new workspaces start in sandbox mode: mail captured, not delivered
    delivery_caps: Caps = field(default_factory=Caps)  # operator-wide caps on policies
    drain_seconds: float = 30.0  # a clean stop's bound on the transactions under way
    sending_addresses: tuple[str, ...] = ()  # empty: the addresses of smtp_host
    spf_include: str | None = None  # the SPF record owners include, when the operator has one
    complaint_min_deliveries: int = 1000  # before a complaint rate counts
    dnssec: bool = False  # trust the resolvers' AD bit: DANE on the way out


def _fail(name: str, expected: str, value: str) -> SettingsError:
    return SettingsError(f"{PREFIX}{name.upper()}: expected {expected}, got {value!r}")


def _port(name: str, text: str, value: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise _fail(name, "a port number 0-65535", value)
    return int(text)


def parse_address(name: str, value: str) -> Address:
    """`host:port` or `[v6]:port` as a pair."""
    host, sep, port = value.strip().rpartition(":")
    if not sep or not host:
        raise _fail(name, "host:port", value)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, _port(name, port, value)


def _count(name: str, value: str) -> int:
    if not value.strip().isdigit() or int(value) < 1:
        raise _fail(name, "a whole number of at least 1", value)
    return int(value)


def _flag(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("on", "true", "1", "yes"):
        return True
    if lowered in ("off", "false", "0", "no"):
        return False
    raise _fail(name, "on or off", value)


def _file(name: str, value: str) -> Path | None:
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_file():
        raise SettingsError(f"{PREFIX}{name.upper()}: no readable file at {value!r}")
    return path


def _sending_addresses(value: str) -> tuple[str, ...]:
    addresses = []
    for item in value.split(","):
        if not item.strip():
            continue
        try:
            addresses.append(str(ipaddress.ip_address(item.strip())))
        except ValueError:
            raise _fail(
                "sending_addresses", "a comma list of IPv4 and IPv6 addresses", value
            ) from None
    return tuple(addresses)


def _spf_include(value: str) -> str | None:
    name = value.strip().rstrip(".").lower()
    if not name:
        return None
    if not re.fullmatch(r"([a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?\.)+[a-z0-9-]{2,63}", name):
        raise _fail("spf_include", "a domain name such as _spf.mail.example.com", value)
    return name


def _database_url(value: str) -> str:
    if not value.startswith(("sqlite:///", "postgresql://", "postgres://")):
        raise _fail("database_url", "sqlite:///PATH or postgresql://USER@HOST/DB", value)
    return value


def _public_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise _fail("public_url", "an http:// or https:// URL", value)
    return value.rstrip("/")


def _smtp_host(value: str) -> str:
    if not value or any(c.isspace() for c in value) or "/" in value:
        raise _fail("smtp_host", "a host name", value)
    return value


def _data_dir(database_url: str) -> Path:
    """The node's own files' default home: beside the SQLite database, else ./postroom-data."""
    if database_url.startswith("sqlite:///"):
        return Path(database_url.removeprefix("sqlite:///")).expanduser().parent
    return Path("postroom-data")


def _secret_key_file(value: str, database_url: str) -> Path:
    return Path(value).expanduser() if value else _data_dir(database_url) / "secret.key"


def _spool_dir(value: str, database_url: str) -> Path:
    return Path(value).expanduser() if value else _data_dir(database_url) / "spool"


def _log_format(value: str) -> str:
    if value.strip().lower() not in ("json", "text"):
        raise _fail("log_format", "json or text", value)
    return value.strip().lower()


def _metrics_token(value: str) -> str | None:
    if not value:
        return None
    # Sent in a header, so visible ASCII only; long enough not to be guessed. Never echoed.
    if len(value) < 16 or not all("!" <= c <= "~" for c in value):
        raise SettingsError(
            f"{PREFIX}METRICS_TOKEN: expected 16 or more visible ASCII characters, no spaces"
        )
    return value


def _cap(name: str, value: str, *, required: bool = False) -> int | None:
    if not value.strip() and not required:
        return None
    if not value.strip().isdigit() or not 1 <= int(value) <= 1_000_000_000:
        raise _fail(
            name, "a whole number from 1" + ("" if required else ", or empty for none"), value
        )
    return int(value)


def _seconds(name: str, value: str, most: float) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= most:
        raise _fail(name, f"a number of seconds from 0 to {most:.0f}", value)
    return seconds


def _delivery_caps(raw: dict[str, str]) -> Caps:
    connections = _cap("delivery_max_connections", raw["delivery_max_connections"], required=True)
    assert connections is not None
    return Caps(
        max_connections=connections,
        messages_per_connection=_cap(
            "delivery_max_per_connection", raw["delivery_max_per_connection"]
        ),
        per_minute=_cap("delivery_max_per_minute", raw["delivery_max_per_minute"]),
        per_hour=_cap("delivery_max_per_hour", raw["delivery_max_per_hour"]),
        per_day=_cap("delivery_max_per_day", raw["delivery_max_per_day"]),
    )


def _raw_values(environ: Mapping[str, str], file: Path | None) -> dict[str, str]:
    values = dict(DEFAULTS)
    if file is not None:
        try:
            loaded: dict[str, Any] = tomllib.loads(file.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise SettingsError(f"--config {file}: {exc}") from None
        for key, value in loaded.items():
            if key not in DEFAULTS:
                raise SettingsError(f"--config {file}: unknown setting {key!r}")
            values[key] = ",".join(value) if isinstance(value, list) else str(value)
            if isinstance(value, bool):
                values[key] = "on" if value else "off"
    for key in DEFAULTS:
        if PREFIX + key.upper() in environ:
            values[key] = environ[PREFIX + key.upper()]
    return values


def load(environ: Mapping[str, str] | None = None, file: Path | None = None) -> Settings:
    """Settings from the environment (and an optional TOML file); SettingsError if bad."""
    raw = _raw_values(os.environ if environ is None else environ, file)
    dns_servers = [
        parse_address("dns_servers", item) for item in raw["dns_servers"].split(",") if item.strip()
    ]
    tls_cert, tls_key = _file("tls_cert", raw["tls_cert"]), _file("tls_key", raw["tls_key"])
    if (tls_cert is None) != (tls_key is None):
        raise SettingsError("POSTROOM_TLS_CERT and POSTROOM_TLS_KEY must be set together")
    smtp_host = _smtp_host(raw["smtp_host"])
    submission_listen = parse_address("submission_listen", raw["submission_listen"])
    smtp_port = raw["smtp_port"]
    return Settings(
        database_url=_database_url(raw["database_url"]),
        api_listen=parse_address("api_listen", raw["api_listen"]),
        submission_listen=submission_listen,
        inbound_listen=parse_address("inbound_listen", raw["inbound_listen"]),
        smtp_host=smtp_host,
        smtp_port=_port("smtp_port", smtp_port, smtp_port) if smtp_port else submission_listen[1],
        public_url=_public_url(raw["public_url"]),
        dns_servers=dns_servers or None,
        delivery_port=_port("delivery_port", raw["delivery_port"], raw["delivery_port"]),
        mta_sts_port=_port("mta_sts_port", raw["mta_sts_port"], raw["mta_sts_port"]),
        tls_cert=tls_cert,
        tls_key=tls_key,
        extra_ca_file=_file("extra_ca_file", raw["extra_ca_file"]),
        secret_key=raw["secret_key"] or None,
        secret_key_file=_secret_key_file(raw["secret_key_file"], raw["database_url"]),
        spool_dir=_spool_dir(raw["spool_dir"], raw["database_url"]),
        system_from=raw["system_from"] or f"postroom@{smtp_host}",
        domain_transfers=_flag("domain_transfers", raw["domain_transfers"]),
        allow_private_targets=_flag("allow_private_targets", raw["allow_private_targets"]),
        log_format=_log_format(raw["log_format"]),
        metrics_token=_metrics_token(raw["metrics_token"]),
        sandbox=_flag("sandbox", raw["sandbox"]),
        dnssec=_flag("dnssec", raw["dnssec"]),
        delivery_caps=_delivery_caps(raw),
        drain_seconds=_seconds("drain_seconds", raw["drain_seconds"], 600),
        sending_addresses=_sending_addresses(raw["sending_addresses"]),
        spf_include=_spf_include(raw["spf_include"]),
        complaint_min_deliveries=_count(
            "complaint_min_deliveries", raw["complaint_min_deliveries"]
        ),
    )
