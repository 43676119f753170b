"""postroom-client: a thin client for the Postroom API over httpx, sync and async.

    from postroom_client import Postroom
    with Postroom("https://mail.example.com", api_key="pr_...") as postroom:
        sent = postroom.send_email({"from_": {"email": "hi@example.com"}, "to": [...], ...})

Errors are raised as `PostroomError` carrying the API's error body (`code`, `detail`).
"""

from postroom_client.client import AsyncPostroom, Postroom, PostroomError

__all__ = ["AsyncPostroom", "Postroom", "PostroomError"]
