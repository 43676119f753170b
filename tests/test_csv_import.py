"""CSV import: headers, metadata, duplicates, bad rows, encodings, the 400s, the plan limit."""

from __future__ import annotations

from typing import Any

from tests.harness.contacts import add_contact, create_list
from tests.harness.service import Account, Service


async def upload(account: Account, list_id: str, content: str | bytes) -> Any:
    return await account.client.post(
        f"/v1/contacts/{list_id}/upload", files={"file": ("contacts.csv", content, "text/csv")}
    )


async def imported(account: Account, content: str | bytes) -> tuple[dict[str, Any], list[Any]]:
    """Upload into a new list: the import result and the list's contacts."""
    contact_list = await create_list(account)
    response = await upload(account, contact_list["id"], content)
    assert response.status_code == 200, response.text
    read = await account.client.get(f"/v1/contacts/{contact_list['id']}", params={"limit": 200})
    result: dict[str, Any] = response.json()
    return result, read.json()["contacts"]


async def test_columns_become_name_and_metadata(service: Service) -> None:
    account = await service.account()
    result, contacts = await imported(
        account,
        "Name,EMAIL,Company,Plan\nAnn Lee,Ann@Example.com,Acme,gold\nBob,bob@example.com,,\n",
    )
    assert result == {"imported": 2, "skipped": 0, "errors": []}
    assert [(c["email"], c["name"], c["metadata"]) for c in contacts] == [
        ("ann@example.com", "Ann Lee", {"Company": "Acme", "Plan": "gold"}),
        ("bob@example.com", "Bob", None),
    ]


async def test_bom_quotes_and_crlf(service: Service) -> None:
    account = await service.account()
    content = (
        '\ufeffemail,name,note\r\n"ann@example.com","Lee, Ann","said ""hi""\r\nthen left"\r\n'
        "bob@example.com,Bob,plain\r\n"
    ).encode()
    result, contacts = await imported(account, content)
    assert result == {"imported": 2, "skipped": 0, "errors": []}
    assert contacts[0]["email"] == "ann@example.com"
    assert contacts[0]["name"] == "Lee, Ann"
    assert contacts[0]["metadata"] == {"note": 'said "hi"\r\nthen left'}
    assert contacts[1]["metadata"] == {"note": "plain"}


async def test_duplicates_and_missing_emails_are_skipped(service: Service) -> None:
    account = await service.account()
    contact_list = await create_list(account)
    await add_contact(account, contact_list["id"], "old@example.com")
    content = (
        "email,name\n"
        "ann@example.com,Ann\n"
        "ANN@example.com,Ann again\n"  # the same address, differently spelled
        ",No email\n"
        "old@example.com,Already there\n"
        "\n"  # blank lines are ignored, not counted
        "bob@example.com,Bob\n"
    )
    response = await upload(account, contact_list["id"], content)
    assert response.status_code == 200
    assert response.json() == {"imported": 2, "skipped": 3, "errors": []}
    read = (await account.client.get(f"/v1/contacts/{contact_list['id']}")).json()
    assert read["contact_count"] == 3
    assert [c["name"] for c in read["contacts"]] == [None, "Ann", "Bob"]
    # Importing the same file again adds nothing.
    again = await upload(account, contact_list["id"], content)
    assert again.json() == {"imported": 0, "skipped": 5, "errors": []}


async def test_invalid_rows_are_reported_with_their_row_number(service: Service) -> None:
    account = await service.account()
    content = (
        "email,name\n"
        "ann@example.com,Ann\n"  # row 2
        "not-an-email,Nobody\n"  # row 3
        "bob@example.com,Bob,extra\n"  # row 4: more fields than the header
        "carol@,Carol\n"  # row 5
        "dan@example.com\n"  # row 6: a missing trailing field is fine
    )
    result, contacts = await imported(account, content)
    assert result["imported"] == 2
    assert result["skipped"] == 0
    assert result["errors"] == [
        "row 3: invalid email address 'not-an-email'",
        "row 4: 3 fields, but the header has 2",
        "row 5: invalid email address 'carol@'",
    ]
    assert [c["email"] for c in contacts] == ["ann@example.com", "dan@example.com"]


async def test_unusable_files_are_400(service: Service) -> None:
    account = await service.account()
    contact_list = await create_list(account)
    for content, code in (
        (b"", "empty_csv"),
        (b"\xef\xbb\xbf", "empty_csv"),
        (b"\n\n", "empty_csv"),
        (b"email,name\n", "no_data_rows"),
        (b"email,name\r\n\r\n", "no_data_rows"),
        (b"name,phone\nAnn,123\n", "no_email_column"),
        (b"e-mail\nann@example.com\n", "no_email_column"),
        (b"email\n\xff\xfe\x00a\n", "invalid_csv"),
    ):
        response = await upload(account, contact_list["id"], content)
        assert response.status_code == 400, content
        assert response.json()["code"] == code, content
    no_file = await account.client.post(
        f"/v1/contacts/{contact_list['id']}/upload", files={"other": ("c.csv", "email\na@b.co\n")}
    )
    assert no_file.status_code == 400
    read = (await account.client.get(f"/v1/contacts/{contact_list['id']}")).json()
    assert read["contact_count"] == 0


async def test_rows_over_the_plan_limit_are_reported(service: Service) -> None:
    account = await service.account()  # free: 1,000 contacts per list
    contact_list = await create_list(account)
    await add_contact(account, contact_list["id"], "first@example.com")
    rows = "".join(f"user{i}@example.com\n" for i in range(1_002))
    response = await upload(account, contact_list["id"], "email\n" + rows)
    assert response.status_code == 200
    result = response.json()
    assert result["imported"] == 999
    assert result["skipped"] == 0
    assert len(result["errors"]) == 3
    assert result["errors"][0].startswith("row 1001: ")
    assert "limit" in result["errors"][0]
    assert [e.split(":")[0] for e in result["errors"]] == ["row 1001", "row 1002", "row 1003"]
    read = (await account.client.get(f"/v1/contacts/{contact_list['id']}")).json()
    assert read["contact_count"] == 1_000


async def test_a_large_file_is_imported_in_chunks(service: Service) -> None:
    account = await service.account("pro")
    rows = "".join(f"user{i}@example.com,User {i},{i % 7}\n" for i in range(5_000))
    contact_list = await create_list(account)
    response = await upload(account, contact_list["id"], "email,name,group\n" + rows + rows[:200])
    assert response.status_code == 200
    assert response.json()["imported"] == 5_000
    assert response.json()["skipped"] == rows[:200].count("\n")
    last = await account.client.get(
        f"/v1/contacts/{contact_list['id']}", params={"page": 24, "limit": 200}
    )
    assert last.json()["contacts"][-1]["email"] == "user4999@example.com"
    assert last.json()["contacts"][-1]["metadata"] == {"group": str(4999 % 7)}
