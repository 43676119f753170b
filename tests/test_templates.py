"""Templates: plan gates and limits, CRUD, variables extracted on create and update, duplicate."""

from __future__ import annotations

import email
import email.policy
from email.message import EmailMessage

from storage.tx import Tx
from tests.harness.contacts import MISSING
from tests.harness.dns_server import DnsServer
from tests.harness.sending import SENDER, ready_account, route_mail
from tests.harness.service import Service
from tests.harness.smtp_sink import SmtpSink
from tests.harness.templates import create_template

TEMPLATE_FIELDS = {
    "id",
    "name",
    "subject",
    "html_body",
    "text_body",
    "blocks_json",
    "variables",
    "created_at",
    "updated_at",
}


async def test_create_extracts_variables_from_the_bodies(service: Service) -> None:
    account = await service.account("starter")
    created = await create_template(
        account,
        subject="Hi {{first_name}}",
        html_body="<p>{{ first_name }}, your code is {{code}}. {{code}} again.</p>",
        text_body="Code {{code}} from {{Company Name}}",
        blocks_json={"blocks": [{"type": "text"}]},
    )
    assert set(created) == TEMPLATE_FIELDS
    assert created["variables"] == ["Company Name", "code", "first_name"]
    assert created["blocks_json"] == {"blocks": [{"type": "text"}]}
    # The variables are the bodies': a client's own list is refused, never taken.
    given = {"name": "Mine", "text_body": "{{code}}", "variables": ["ignored"]}
    refused = await account.client.post("/v1/templates/", json=given)
    assert refused.status_code == 422
    assert refused.json()["errors"][0]["loc"] == ["body", "variables"]
    assert created["created_at"] == created["updated_at"]
    read = await account.client.get(f"/v1/templates/{created['id']}")
    assert read.status_code == 200
    assert read.json() == created
    bare = await create_template(account, name="Bare")
    assert bare["subject"] == bare["html_body"] == bare["text_body"] == ""
    assert bare["variables"] == [] and bare["blocks_json"] is None


async def test_update_changes_only_supplied_fields_and_re_extracts(service: Service) -> None:
    account = await service.account("starter")
    created = await create_template(account, subject="S", html_body="{{a}}", text_body="{{b}}")
    response = await account.client.patch(
        f"/v1/templates/{created['id']}", json={"html_body": "{{c}} and {{ d }}"}
    )
    assert response.status_code == 200
    updated = response.json()
    assert updated["variables"] == ["b", "c", "d"]
    assert updated["subject"] == "S" and updated["text_body"] == "{{b}}"
    assert updated["created_at"] == created["created_at"]
    assert updated["updated_at"] > created["updated_at"]
    cleared = await account.client.patch(
        f"/v1/templates/{created['id']}", json={"text_body": "", "blocks_json": None}
    )
    assert cleared.json()["variables"] == ["c", "d"]
    for invalid in ({"name": ""}, {"name": None}, {"subject": None}, {"blocks_json": [1]}):
        refused = await account.client.patch(f"/v1/templates/{created['id']}", json=invalid)
        assert refused.status_code == 422, invalid


async def test_a_subject_saved_before_its_rule_leaves_the_rest_editable(service: Service) -> None:
    """A template saved before subjects were refused the unsubscribe link can still be
    renamed or have its bodies edited; only a new subject is checked."""
    account = await service.account("starter")
    created = await create_template(account, name="Old", subject="S", text_body="Hi")
    legacy = "Leave: {{ unsubscribe_url }}"

    def saved_before_the_rule(tx: Tx) -> None:
        tx.execute(
            "UPDATE templates SET subject = :subject WHERE id = :id",
            {"subject": legacy, "id": created["id"]},
        )

    await service.running.runtime.db.write(saved_before_the_rule)
    path = f"/v1/templates/{created['id']}"
    renamed = await account.client.patch(path, json={"name": "Renamed", "text_body": "Hello"})
    assert renamed.status_code == 200, renamed.text
    assert renamed.json()["subject"] == legacy and renamed.json()["name"] == "Renamed"
    refused = await account.client.patch(path, json={"subject": "Bye {{unsubscribe_url}}"})
    assert refused.status_code == 422 and refused.json()["errors"][0]["loc"] == ["body", "subject"]
    fixed = await account.client.patch(path, json={"subject": "Leave"})
    assert fixed.status_code == 200 and fixed.json()["subject"] == "Leave"


async def test_list_is_most_recently_updated_first(service: Service) -> None:
    account = await service.account("starter")
    first = await create_template(account, name="First")
    second = await create_template(account, name="Second")
    listed = await account.client.get("/v1/templates/")
    assert [t["id"] for t in listed.json()] == [second["id"], first["id"]]
    await account.client.patch(f"/v1/templates/{first['id']}", json={"subject": "New"})
    listed = await account.client.get("/v1/templates/")
    assert [t["id"] for t in listed.json()] == [first["id"], second["id"]]


async def test_duplicate_and_delete(service: Service) -> None:
    account = await service.account("starter")
    original = await create_template(account, html_body="{{x}}", blocks_json={"k": 1})
    response = await account.client.post(f"/v1/templates/{original['id']}/duplicate")
    assert response.status_code == 201
    copy = response.json()
    assert copy["name"] == "Welcome (copy)"
    assert copy["id"] != original["id"]
    assert copy["created_at"] > original["created_at"]
    assert copy["updated_at"] == copy["created_at"]
    for key in ("subject", "html_body", "text_body", "blocks_json", "variables"):
        assert copy[key] == original[key]

    deleted = await account.client.delete(f"/v1/templates/{original['id']}")
    assert deleted.status_code == 204 and deleted.content == b""
    for response in (
        await account.client.get(f"/v1/templates/{original['id']}"),
        await account.client.patch(f"/v1/templates/{original['id']}", json={"name": "x"}),
        await account.client.delete(f"/v1/templates/{original['id']}"),
        await account.client.post(f"/v1/templates/{original['id']}/duplicate"),
        await account.client.get(f"/v1/templates/{MISSING}"),
        await account.client.get("/v1/templates/not-a-uuid"),
    ):
        assert response.status_code == 404
        assert response.json()["code"] == "not_found"
    assert [t["id"] for t in (await account.client.get("/v1/templates/")).json()] == [copy["id"]]


async def test_free_plan_gets_403_plan_feature(service: Service) -> None:
    account = await service.account("free")
    for method, path in (
        ("GET", "/v1/templates/"),
        ("POST", "/v1/templates/"),
        ("GET", f"/v1/templates/{MISSING}"),
        ("DELETE", f"/v1/templates/{MISSING}"),
        ("POST", f"/v1/templates/{MISSING}/duplicate"),
    ):
        json = {"name": "x"} if method == "POST" else None
        response = await account.client.request(method, path, json=json)
        assert response.status_code == 403, path
        assert response.json()["code"] == "plan_feature"


async def test_plan_template_limit_is_403(service: Service) -> None:
    account = await service.account("starter")  # 20 templates
    created = [await create_template(account, name=f"T{i}") for i in range(20)]
    for response in (
        await account.client.post("/v1/templates/", json={"name": "One more"}),
        await account.client.post(f"/v1/templates/{created[0]['id']}/duplicate"),
    ):
        assert response.status_code == 403
        assert response.json()["code"] == "plan_limit"
    assert len((await account.client.get("/v1/templates/")).json()) == 20


async def test_invalid_bodies_are_422_and_other_workspaces_404(service: Service) -> None:
    account = await service.account("starter")
    for invalid in ({}, {"name": ""}, {"name": "x", "subject": 5}, {"name": "x", "blocks_json": 1}):
        response = await account.client.post("/v1/templates/", json=invalid)
        assert response.status_code == 422, invalid
        assert response.json()["code"] == "validation_error"
    template = await create_template(account)
    stranger = await service.account("pro")
    assert (await stranger.client.get(f"/v1/templates/{template['id']}")).status_code == 404
    assert (await stranger.client.get("/v1/templates/")).json() == []


async def test_changes_are_in_the_activity_log(service: Service) -> None:
    account = await service.account("starter")
    template = await create_template(account)
    await account.client.patch(f"/v1/templates/{template['id']}", json={"name": "Hello"})
    await account.client.post(f"/v1/templates/{template['id']}/duplicate")
    await account.client.delete(f"/v1/templates/{template['id']}")
    items = (await account.client.get("/v1/audit-log", params={"category": "Send"})).json()["items"]
    assert [(i["action"], i["target_name"]) for i in items] == [
        ("template.deleted", "Hello"),
        ("template.duplicated", "Hello (copy)"),
        ("template.updated", "Hello"),
        ("template.created", "Welcome"),
    ]
    assert {i["target_type"] for i in items} == {"Template"}


async def test_an_email_can_be_sent_from_a_template(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "customer.example")
    template = await create_template(
        account,
        subject="Order {{order}} shipped",
        html_body="<p>Hi {{name}}, order {{order}} is on its way.</p>",
        text_body="Hi {{name}}, order {{order}} is on its way.{{missing}}",
    )
    body = {
        "from_": {"email": SENDER},
        "to": [{"email": "ann@customer.example"}],
        "template_id": template["id"],
        "variables": {"name": "Ann <3", "order": 1042},
    }
    validated = await account.client.post("/v1/emails/validate", json=body)
    assert validated.json()["valid"] is True
    sent = await account.client.post("/v1/emails/", json=body)
    assert sent.status_code == 202, sent.text
    [received] = await smtp_sink.wait_for_messages(1)
    message = email.message_from_bytes(received.data, policy=email.policy.default)
    assert isinstance(message, EmailMessage)
    assert message["Subject"] == "Order 1042 shipped"
    plain = message.get_body(preferencelist=("plain",))
    html = message.get_body(preferencelist=("html",))
    assert plain is not None and html is not None
    assert plain.get_content().strip() == "Hi Ann <3, order 1042 is on its way."
    assert "<p>Hi Ann &lt;3, order 1042 is on its way.</p>" in html.get_content()

    # What the body gives itself wins over the template.
    own = await account.client.post(
        "/v1/emails/", json={**body, "subject": "My own subject", "text": "Mine"}
    )
    detail = (await account.client.get(f"/v1/emails/{own.json()['id']}")).json()
    assert detail["subject"] == "My own subject"
    assert detail["text"] == "Mine"
    assert detail["html"] == "<p>Hi Ann &lt;3, order 1042 is on its way.</p>"


async def test_sending_from_an_unknown_or_gated_template_is_refused(
    service: Service, dns_server: DnsServer
) -> None:
    account = await ready_account(service, dns_server)
    body = {
        "from_": {"email": SENDER},
        "to": [{"email": "ann@customer.example"}],
        "template_id": MISSING,
    }
    unknown = await account.client.post("/v1/emails/", json=body)
    assert unknown.status_code == 404
    batch = await account.client.post("/v1/emails/batch", json=[body])
    assert batch.status_code == 202
    assert batch.json()[0]["status"] == "error"
    assert batch.json()[0]["rejection_reason"] == "template not found"
    no_subject = await account.client.post(
        "/v1/emails/", json={k: v for k, v in body.items() if k != "template_id"}
    )
    assert no_subject.status_code == 422
    assert no_subject.json()["errors"][0]["loc"] == ["body", "subject"]
    free = await service.account("free")  # the template is refused before the sender
    gated = await free.client.post("/v1/emails/", json=body)
    assert gated.status_code == 403
    assert gated.json()["code"] == "plan_feature"


async def test_unauthenticated_is_401(service: Service) -> None:
    client = service.client()
    for method, path in (
        ("GET", "/v1/templates/"),
        ("POST", "/v1/templates/"),
        ("GET", f"/v1/templates/{MISSING}"),
        ("PATCH", f"/v1/templates/{MISSING}"),
        ("DELETE", f"/v1/templates/{MISSING}"),
        ("POST", f"/v1/templates/{MISSING}/duplicate"),
        ("GET", "/v1/broadcasts/"),
    ):
        response = await client.request(method, path)
        assert response.status_code == 401, path
        assert response.json()["code"] == "unauthorized"
