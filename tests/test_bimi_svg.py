"""BIMI logos cannot carry script: the SVG Tiny PS allow-list, what it refuses and names, and the
headers of the public logo (issue 14 §3 and §7).

The large table drives `engine.svg_policy.check` directly; a representative set of attacks,
a realistic logo and a Hypothesis fuzz go through the running service's API.
"""

from __future__ import annotations

from dataclasses import dataclass
from xml.sax.saxutils import escape, quoteattr

import httpx
import pytest
import trio
from hypothesis import strategies as st

from engine.domains import svg_policy
from engine.platform.errors import InvalidRequest
from tests.harness.bimi import LOGO as MINIMAL_LOGO
from tests.harness.fuzz import run_examples
from tests.harness.service import Account, Service

NS = 'xmlns="http://www.w3.org/2000/svg"'
XLINK = 'xmlns:xlink="http://www.w3.org/1999/xlink"'
XHTML = "http://www.w3.org/1999/xhtml"

# A Tiny-PS logo as a designer would hand it over: gradients, a #fragment <use> in both
# spellings, a title, style attributes and a style sheet.
VALID_LOGO = b"""<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink"
     version="1.2" baseProfile="tiny-ps" viewBox="0 0 512 512" width="512" height="512">
  <title>Example Co</title>
  <desc>The Example Co mark: a sun over a wave.</desc>
  <style type="text/css"><![CDATA[
    .ink { fill: #0f172a; stroke: none }  /* the wave */
    .halo { stroke: rgba(255, 255, 255, 0.6); stroke-width: 6 }
  ]]></style>
  <defs>
    <linearGradient id="sky" x1="0" y1="0" x2="0" y2="512" gradientUnits="userSpaceOnUse">
      <stop offset="0" stop-color="#1e3a8a"/>
      <stop offset="1" stop-color="#60a5fa"/>
    </linearGradient>
    <radialGradient id="sun" cx="256" cy="200" r="120" gradientUnits="userSpaceOnUse">
      <stop offset="0" style="stop-color:#fde68a"/>
      <stop offset="1" style="stop-color:#f59e0b;stop-opacity:0.9"/>
    </radialGradient>
    <path id="wave" d="M0 360C128 320 384 400 512 360L512 512L0 512Z"/>
  </defs>
  <rect width="512" height="512" fill="url(#sky)"/>
  <circle class="halo" cx="256" cy="200" r="120" style="fill:url('#sun')"/>
  <use href="#wave" class="ink"/>
  <use xlink:href="#wave" transform="translate(0 40)" style="fill:#0f172a;fill-opacity:0.5"/>
  <text x="256" y="480" font-family="Helvetica, Arial, sans-serif" font-size="40"
        text-anchor="middle" fill="#ffffff">Example &amp; Co</text>
</svg>
"""


def _svg(body: str, *declarations: str) -> bytes:
    return f"<svg {' '.join((NS, *declarations))}>{body}</svg>".encode()


# Character references inside an entity: the file never spells "<script" as such.
DTD_ENTITY_SCRIPT = (
    b'<!DOCTYPE svg [<!ENTITY logo "&#x3C;script&#x3E;alert(document.cookie)'
    b'&#x3C;/script&#x3E;">]>' + _svg("&logo;")
)

# (what, document, what the detail must name)
UNSAFE = [
    ("script", _svg("<script>alert(1)</script>"), "<script>"),
    (
        "script_in_svg_namespace_under_a_prefix",
        _svg("<s:script>alert(1)</s:script>", 'xmlns:s="http://www.w3.org/2000/svg"'),
        "<script>",
    ),
    (
        "script_in_xhtml_namespace",
        _svg("<h:script>alert(1)</h:script>", f'xmlns:h="{XHTML}"'),
        f"<script> in namespace {XHTML}",
    ),
    ("script_in_no_namespace", _svg('<script xmlns="">alert(1)</script>'), "<script>"),
    ("script_built_from_a_dtd_entity", DTD_ENTITY_SCRIPT, "DOCTYPE"),
    (
        "doctype_without_entities",
        b'<!DOCTYPE svg PUBLIC "-//W3C//DTD SVG 1.1//EN" '
        b'"http://www.w3.org/Graphics/SVG/1.1/DTD/svg11.dtd">' + _svg(""),
        "DOCTYPE",
    ),
    ("handler", _svg('<handler type="application/ecmascript">alert(1)</handler>'), "<handler>"),
    ("foreign_object", _svg("<foreignObject><p>hi</p></foreignObject>"), "<foreignObject>"),
    (
        "iframe_in_xhtml_namespace",
        _svg(f'<iframe xmlns="{XHTML}" src="https://evil.example/"/>'),
        f"<iframe> in namespace {XHTML}",
    ),
    ("link", _svg('<a href="javascript:alert(1)"><rect/></a>'), "<a>"),
    (
        "animation_setting_an_href",
        _svg('<set attributeName="href" to="javascript:alert(1)"/>'),
        "<set>",
    ),
    ("animation", _svg('<animate attributeName="x" to="1"/>'), "<animate>"),
    (
        "external_image",
        _svg('<image xlink:href="https://evil.example/p.png" width="9" height="9"/>', XLINK),
        "<image>",
    ),
    ("data_uri_image", _svg('<image href="data:image/png;base64,iVBORw0KGgo="/>'), "<image>"),
    ("element_outside_the_profile", _svg("<filter/>"), "<filter>"),
    (
        "editor_element",
        _svg(
            "<sodipodi:namedview/>",
            'xmlns:sodipodi="http://sodipodi.sourceforge.net/DTD/sodipodi-0.dtd"',
        ),
        "<namedview> in namespace",
    ),
    (
        "external_use_href",
        _svg('<use href="https://evil.example/x.svg#a"/>'),
        'href on <use> refers outside the document ("https://evil.example/x.svg#a")',
    ),
    (
        "external_use_xlink_href",
        _svg('<use xlink:href="//evil.example/x.svg#a"/>', XLINK),
        "xlink:href on <use>",
    ),
    ("javascript_use_href", _svg('<use href="javascript:alert(1)"/>'), "href on <use>"),
    ("use_href_with_leading_space", _svg('<use href=" https://evil.example/"/>'), "href"),
    ("href_outside_use", _svg('<rect href="#a"/>'), "href on <rect>"),
    ("event_handler", _svg("", 'onload="alert(1)"'), "onload on <svg>"),
    ("event_handler_in_capitals", _svg('<rect ONCLICK="alert(1)"/>'), "ONCLICK on <rect>"),
    (
        "event_handler_in_svg_namespace",
        _svg('<rect s:onmouseover="alert(1)"/>', 'xmlns:s="http://www.w3.org/2000/svg"'),
        "onmouseover",
    ),
    ("xml_base", _svg('<use xml:base="https://evil.example/" href="#a"/>'), "xml:base"),
    ("attribute_outside_the_profile", _svg('<rect data-name="x"/>'), "data-name on <rect>"),
    (
        "style_import",
        _svg("<style>@import url(https://evil.example/x.css);</style>"),
        "@import",
    ),
    (
        "style_import_without_url",
        _svg('<style>@import "https://evil.example/";</style>'),
        "@import",
    ),
    ("style_font_face", _svg("<style>@font-face{src:url(x.woff)}</style>"), "@font-face"),
    (
        "style_sheet_external_url",
        _svg("<style>rect{fill:url(https://evil.example/p.svg#g)}</style>"),
        "url(https://evil.example/p.svg#g)",
    ),
    (
        "style_sheet_in_cdata",
        _svg("<style><![CDATA[rect{fill:url( 'https://evil.example/' )}]]></style>"),
        "url(",
    ),
    (
        "style_sheet_css_escape",
        _svg(r"<style>rect{background:u\72l(https://evil.example/)}</style>"),
        "CSS escape",
    ),
    (
        "style_sheet_image_set",
        _svg("<style>rect{background:image-set('https://evil.example/p.png' 1x)}</style>"),
        "image-set()",
    ),
    (
        "style_sheet_split_by_a_child",
        _svg("<style>rect{fill:u<desc/>rl(https://evil.example/)}</style>"),
        "url(https://evil.example/)",
    ),
    (
        "style_attribute_external_url",
        _svg('<rect style="fill:url(https://evil.example/p.svg#g)"/>'),
        "style on <rect>",
    ),
    (
        "presentation_attribute_external_url",
        _svg('<rect fill="url(https://evil.example/p.svg#g)"/>'),
        "fill on <rect>",
    ),
    ("expression", _svg('<rect style="width:expression(alert(1))"/>'), "expression()"),
    (
        "xml_stylesheet_instruction",
        b'<?xml-stylesheet href="https://evil.example/x.css"?>' + _svg(""),
        "xml-stylesheet",
    ),
]

NOT_SVG = [
    ("html", b"<html>not an svg</html>", "root element"),
    ("svg_without_namespace", b'<svg><rect width="1"/></svg>', "root element"),
    ("svg_in_xhtml_namespace", f'<svg xmlns="{XHTML}"/>'.encode(), "root element"),
    ("malformed", _svg("<rect>"), "not well-formed"),
    ("control_character", _svg("<title>\x01</title>"), "not well-formed"),
    ("undefined_entity", _svg("&nbsp;"), "not well-formed"),
    ("empty", b"", "not well-formed"),
    (
        "declared_in_another_encoding",
        b'<?xml version="1.0" encoding="ISO-8859-1"?>' + _svg(""),
        "UTF-8",
    ),
]

ACCEPTED = [
    ("realistic_logo", VALID_LOGO),
    ("minimal_logo", MINIMAL_LOGO),
    ("byte_order_mark", b"\xef\xbb\xbf" + _svg("<title>x</title>")),
    ("local_urls", _svg('<rect fill="url(#g)" style="stroke:url( &quot;#h&quot; )"/>')),
    ("comments_and_text", _svg("<!-- made by hand --><text>a &lt; b</text>")),
    ("transform_functions", _svg('<g transform="matrix(1 0 0 1 0 0) rotate(45)"/>')),
    ("parentheses_outside_css", _svg('<g id="Layer_1_(copy)"><desc>@ (c) 2025</desc></g>')),
]


@pytest.mark.parametrize(("document", "named"), [c[1:] for c in UNSAFE], ids=[c[0] for c in UNSAFE])
def test_policy_refuses_unsafe_construct_naming_it(document: bytes, named: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        svg_policy.check(document)
    assert refused.value.code == "unsafe_svg"
    assert named in refused.value.detail


@pytest.mark.parametrize(
    ("document", "named"), [c[1:] for c in NOT_SVG], ids=[c[0] for c in NOT_SVG]
)
def test_policy_refuses_what_is_no_svg_document_as_not_svg(document: bytes, named: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        svg_policy.check(document)
    assert refused.value.code == "not_svg"
    assert named in refused.value.detail


@pytest.mark.parametrize("document", [c[1] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_policy_accepts_tiny_ps_documents(document: bytes) -> None:
    svg_policy.check(document)


async def _pro_domain(service: Service) -> tuple[Account, str]:
    account = await service.account("pro")
    created = await account.client.post("/v1/domains/", json={"name": "brand.example"})
    assert created.status_code == 201, created.text
    domain_id: str = created.json()["id"]
    return account, domain_id


async def _upload(account: Account, domain_id: str, content: bytes) -> httpx.Response:
    return await account.client.post(
        f"/v1/domains/{domain_id}/bimi/logo",
        files={"file": ("logo.svg", content, "image/svg+xml")},
    )


API_ATTACKS = {
    case[0]: case[1:]
    for case in UNSAFE
    if case[0]
    in {
        "script_in_svg_namespace_under_a_prefix",
        "script_in_xhtml_namespace",
        "script_built_from_a_dtd_entity",
        "external_use_href",
        "style_import",
        "external_image",
    }
}


@pytest.mark.parametrize(("document", "named"), API_ATTACKS.values(), ids=API_ATTACKS.keys())
async def test_upload_of_attack_is_refused_as_unsafe_svg_naming_it(
    service: Service, document: bytes, named: str
) -> None:
    account, domain_id = await _pro_domain(service)
    response = await _upload(account, domain_id, document)
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "unsafe_svg" and named in body["detail"], body
    logo = await service.client().get(f"/v1/bimi/{domain_id}/logo.svg")
    assert logo.status_code == 404  # nothing was stored


async def test_tiny_ps_logo_is_accepted_and_served_byte_identical_with_security_headers(
    service: Service,
) -> None:
    account, domain_id = await _pro_domain(service)
    uploaded = await _upload(account, domain_id, VALID_LOGO)
    assert uploaded.status_code == 200, uploaded.text
    assert uploaded.json()["size"] == len(VALID_LOGO)

    logo = await service.client().get(f"/v1/bimi/{domain_id}/logo.svg")
    assert logo.status_code == 200 and logo.content == VALID_LOGO
    assert logo.headers["content-type"] == "image/svg+xml"
    assert (
        logo.headers["content-security-policy"]
        == "default-src 'none'; style-src 'unsafe-inline'; sandbox"
    )
    assert logo.headers["x-content-type-options"] == "nosniff"
    assert logo.headers["cache-control"] == "public, max-age=86400"
    assert logo.headers["access-control-allow-origin"] == "*"


# The fuzz: documents built from a mix of allowed and refused names, with random text that
# may hold characters XML cannot carry. Each knows what the answer must be.

FUZZ_ROOT = (
    f'<svg {NS} {XLINK} xmlns:s="http://www.w3.org/2000/svg" xmlns:h="{XHTML}" '
    'version="1.2" baseProfile="tiny-ps">'
)
ALLOWED_ELEMENTS = ["g", "defs", "title", "desc", "rect", "circle", "path", "text", "tspan"]
REFUSED_ELEMENTS = [
    "script", "s:script", "h:script", "h:iframe", "foreignObject", "image", "a", "set",
    "animate", "filter",
]  # fmt: skip
ALLOWED_ATTRIBUTES = ["id", "class", "fill", "stroke", "opacity", "stroke-width", "visibility"]
SAFE_VALUES = ["logo", "#0f172a", "none", "0.5", "2", "url(#sky)", "rgb(1, 2, 3)", "hidden"]
REFUSED_ATTRIBUTES = ["onload", "onclick", "s:onmouseover", "xml:base", "xlink:href", "data-x"]
REFUSED_STYLES = [
    "fill:url(https://evil.example/p.svg#a)",
    r"background:u\72l(https://evil.example/)",
    "fill:image-set('https://evil.example/p.png' 1x)",
]


@dataclass(frozen=True)
class Element:
    """A generated element, and whether it holds something the profile refuses."""

    xml: str
    refused: bool


@dataclass(frozen=True)
class Document:
    """A generated upload, and what the answer to it must be."""

    xml: str
    refused: bool  # something the profile refuses: 400 unsafe_svg
    malformed: bool  # a character XML 1.0 cannot carry: 400, whichever fault is met first


def _xml_chars_only(text: str) -> bool:
    return all(
        c in "\t\n\r" or "\x20" <= c <= "\ud7ff" or "\ue000" <= c <= "\ufffd" or c >= "\U00010000"
        for c in text
    )


_xml_text = st.text(st.characters(exclude_categories=("Cc", "Cs", "Cn")), max_size=16)
_allowed_attribute = st.tuples(
    st.sampled_from(ALLOWED_ATTRIBUTES), st.sampled_from(SAFE_VALUES), st.just(False)
)
_any_attribute = st.one_of(
    _allowed_attribute,
    st.tuples(st.sampled_from(REFUSED_ATTRIBUTES), _xml_text, st.just(True)),
    st.tuples(st.just("style"), st.sampled_from(REFUSED_STYLES), st.just(True)),
)
_allowed_name = st.tuples(st.sampled_from(ALLOWED_ELEMENTS), st.just(False))
_any_name = st.one_of(_allowed_name, st.tuples(st.sampled_from(REFUSED_ELEMENTS), st.just(True)))


def _element(
    name: tuple[str, bool],
    attributes: list[tuple[str, str, bool]],
    text: str,
    children: list[Element],
) -> Element:
    tag, refused = name
    markup = "".join(f" {n}={quoteattr(v)}" for n, v, _ in attributes)
    body = escape(text) + "".join(child.xml for child in children)
    return Element(
        f"<{tag}{markup}>{body}</{tag}>",
        refused or any(r for _, _, r in attributes) or any(c.refused for c in children),
    )


def _trees(hostile: bool) -> st.SearchStrategy[Element]:
    """Element trees; only a hostile one draws refused names."""
    names = _any_name if hostile else _allowed_name
    attributes = st.lists(
        _any_attribute if hostile else _allowed_attribute,
        max_size=3,
        unique_by=lambda attribute: attribute[0],
    )

    def elements(children: st.SearchStrategy[list[Element]]) -> st.SearchStrategy[Element]:
        return st.builds(_element, names, attributes, _xml_text, children)

    return st.recursive(
        elements(st.just([])), lambda inner: elements(st.lists(inner, max_size=3)), max_leaves=8
    )


def _document(doctype: bool, noise: str, children: list[Element]) -> Document:
    prologue = '<!DOCTYPE svg [<!ENTITY e "x">]>' if doctype else ""
    return Document(
        prologue + FUZZ_ROOT + escape(noise) + "".join(c.xml for c in children) + "</svg>",
        refused=doctype or any(c.refused for c in children),
        malformed=not _xml_chars_only(noise),
    )


# Half the documents are hostile; any may carry noise text with characters XML cannot carry.
_documents = st.booleans().flatmap(
    lambda hostile: st.builds(
        _document,
        st.booleans() if hostile else st.just(False),
        st.text(max_size=6),
        st.lists(_trees(hostile), max_size=4),
    )
)


async def test_fuzzed_uploads_get_the_answer_their_content_calls_for_and_never_a_5xx(
    service: Service,
) -> None:
    account, domain_id = await _pro_domain(service)
    public = service.client()

    def upload_is_answered_as_its_content_calls_for(document: Document) -> None:
        content = document.xml.encode()
        response = trio.from_thread.run(_upload, account, domain_id, content)
        if document.malformed or document.refused:
            assert response.status_code == 400, (response.status_code, document)
            body = response.json()
            assert set(body) == {"code", "detail"} and body["detail"], body
            if not document.malformed:
                assert body["code"] == "unsafe_svg", body
        else:
            assert response.status_code == 200, (response.text, document)
            served = trio.from_thread.run(public.get, f"/v1/bimi/{domain_id}/logo.svg")
            assert served.content == content

    await run_examples(_documents, upload_is_answered_as_its_content_calls_for, max_examples=50)
    assert (await service.client().get("/healthz")).status_code == 200
