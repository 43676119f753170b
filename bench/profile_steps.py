"""CPU milliseconds per email for each step, from py-spy profiles of `bench/accept.py`.

`python bench/profile_steps.py DIR [RATE]` reads what `bench/accept.py --profile DIR` wrote
(DIR/<engine>-<mode>.txt, py-spy's collapsed stacks of every thread of every process of the
service, sampled RATE times a second, default 100; DIR/<engine>-<mode>.emails, how many
emails were accepted meanwhile) and prints, per profile, where the service's CPU went. A sample belongs to the delivery path when a
frame of engine/delivery/ is on its stack, to the accept path when the API is; within a
path, the innermost frame that names a step decides the step.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

# (step, file fragments naming it), in the order a stack's innermost frame is tested.
STEPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("compose (MIME)", ("engine/mail/compose.py", "engine/mail/mime_writer.py", "email/")),
    (
        "DKIM",
        ("engine/mail/dkim.py", "dkim/", "cryptography/", "engine/mail/dkim_canon.py"),
    ),
    ("tracking links", ("engine/sending/tracking.py",)),
    ("SMTP client", ("engine/smtp/", "trio/_ssl.py", "ssl.py")),
    ("database", ("storage/", "sqlite3", "psycopg")),
    ("DNS", ("dns/", "engine/platform/dns.py")),
    ("delivery logic", ("engine/delivery/",)),
    ("API and HTTP", ("api/", "quart", "hypercorn", "h11", "pydantic", "engine/sending/")),
    ("trio scheduling and I/O", ("trio/",)),
)


def _frames(stack: str) -> list[str]:
    return stack.split(";")


def _path(frames: list[str]) -> str:
    if any("engine/delivery/" in frame for frame in frames):
        return "delivery"
    if any(
        part in frame for frame in frames for part in ("api/", "quart", "engine/sending/", "relay/")
    ):
        return "accept"
    return "other"


def _step(frames: list[str]) -> str:
    for frame in reversed(frames):
        for step, parts in STEPS:
            if any(part in frame for part in parts):
                return step
    return "other"


def breakdown(profile: Path) -> Counter[tuple[str, str]]:
    """Samples per (path, step)."""
    counts: Counter[tuple[str, str]] = Counter()
    for line in profile.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = _frames(stack)
        counts[(_path(frames), _step(frames))] += int(count)
    return counts


def main() -> None:
    folder = Path(sys.argv[1])
    rate = float(sys.argv[2]) if len(sys.argv) > 2 else 100.0
    for profile in sorted(folder.glob("*.txt")):
        emails = int((profile.with_suffix(".emails")).read_text())
        counts = breakdown(profile)
        total = sum(counts.values())
        print(f"{profile.stem}: {emails} emails, {total / rate:.1f} s of CPU sampled")
        print(f"  {'path':<9} {'step':<26} {'ms/email':>9}")
        for (path, step), samples in sorted(counts.items(), key=lambda item: -item[1]):
            per_email = samples / rate * 1000 / max(emails, 1)
            if per_email >= 0.005:
                print(f"  {path:<9} {step:<26} {per_email:>9.3f}")
        for path in ("delivery", "accept", "other"):
            samples = sum(n for (p, _), n in counts.items() if p == path)
            print(f"  {path:<9} {'(all)':<26} {samples / rate * 1000 / max(emails, 1):>9.3f}")


if __name__ == "__main__":
    main()
