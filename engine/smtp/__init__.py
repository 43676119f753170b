"""SMTP for the engine's delivery client and the relay's servers, sans-I/O where it can be.

`replies` (the reply type and catalogue), `grammar` (framing and syntax), `client` (the
client state machine) and `errors` are pure; `session` is the thin Trio driver of the
client. The relay keeps only its listeners and per-connection server driver.
"""

from engine.smtp.client import NEED_DATA, ClientState, NeedData, SmtpClient
from engine.smtp.errors import PermanentFailure, ProtocolError, SmtpError, TransientFailure
from engine.smtp.replies import SmtpReply
from engine.smtp.session import SmtpSession, TransferResult, connect

__all__ = [
    "NEED_DATA",
    "ClientState",
    "NeedData",
    "PermanentFailure",
    "ProtocolError",
    "SmtpClient",
    "SmtpError",
    "SmtpReply",
    "SmtpSession",
    "TransferResult",
    "TransientFailure",
    "connect",
]
