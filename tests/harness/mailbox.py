"""Reading the mail the SMTP sink received: the first message to an address by subject, and
a message's plain-text body."""

from __future__ import annotations

import email
import email.policy

import trio

from tests.harness.smtp_sink import ReceivedMessage, SmtpSink


def text_of(received: ReceivedMessage) -> str:
    parsed = email.message_from_bytes(received.data, policy=email.policy.default)
    part = parsed.get_body(preferencelist=("plain",))
    assert part is not None
    content: str = part.get_content()
    return content


async def mail_to(sink: SmtpSink, address: str, subject_part: str) -> ReceivedMessage:
    """The first message to `address` whose subject mentions `subject_part`."""
    with trio.fail_after(15):
        while True:
            for received in await sink.wait_for_messages(1):
                parsed = email.message_from_bytes(received.data, policy=email.policy.default)
                if address in received.rcpt_to and subject_part in str(parsed["Subject"]):
                    return received
            await trio.sleep(0.05)
