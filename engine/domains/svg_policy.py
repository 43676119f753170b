"""What an uploaded BIMI logo may contain: the SVG Tiny PS profile as plain data, and its check.

Source of the lists: the BIMI group's SVG Tiny Portable/Secure profile (draft-svg-tiny-ps-abrotman
and its RELAX NG schema, https://bimigroup.org/resources/SVG_PS-latest.rnc.txt), which keeps the
static drawing part of SVG Tiny 1.2 (https://www.w3.org/TR/SVGTiny12/) and drops scripting,
animation, media, links and every external reference. Beyond the profile, `<style>` and `style=`
are accepted because design tools emit them; their CSS is held to the same rule as the rest.

Rules: anything not listed is refused (an allow-list, so an unknown way to run code is refused
too); the only reference allowed is to a `#fragment` of the same document. Sans-I/O: `check`
parses with defusedxml (no DOCTYPE, hence no entities) and raises InvalidRequest, `unsafe_svg`
naming the first offending thing or `not_svg` when the bytes are no SVG document.
"""

from __future__ import annotations

import re
from typing import Any

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import DefusedXMLParser, ParseError

from engine.platform.errors import InvalidRequest

SVG_NS = "http://www.w3.org/2000/svg"
# Attributes in these namespaces are listed by their usual prefix ("xlink:href", "xml:lang").
PREFIXES = {"http://www.w3.org/1999/xlink": "xlink", "http://www.w3.org/XML/1998/namespace": "xml"}

# SVG Tiny 1.2 core and conditional attributes, on every listed element. Left out: xml:base
# (it changes what a #fragment resolves against), the RDFa and the interactivity attributes.
CORE_ATTRIBUTES = frozenset(
    {"id", "xml:id", "xml:lang", "xml:space", "class", "style", "systemLanguage"}
)

# SVG Tiny 1.2 presentation attributes, on every listed element (pointer-events left out).
PRESENTATION_ATTRIBUTES = frozenset(
    {
        "buffered-rendering", "color", "color-rendering", "direction", "display",
        "display-align", "fill", "fill-opacity", "fill-rule", "font-family", "font-size",
        "font-style", "font-variant", "font-weight", "image-rendering", "line-increment",
        "opacity", "shape-rendering", "solid-color", "solid-opacity", "stop-color",
        "stop-opacity", "stroke", "stroke-dasharray", "stroke-dashoffset", "stroke-linecap",
        "stroke-linejoin", "stroke-miterlimit", "stroke-opacity", "stroke-width", "text-align",
        "text-anchor", "text-rendering", "unicode-bidi", "vector-effect", "viewport-fill",
        "viewport-fill-opacity", "visibility",
    }
)  # fmt: skip

# The profile's elements (SVG namespace only) and the attributes of their own.
ELEMENTS: dict[str, frozenset[str]] = {
    "svg": frozenset(
        {
            "version",
            "baseProfile",
            "width",
            "height",
            "viewBox",
            "preserveAspectRatio",
            "zoomAndPan",
        }
    ),
    "g": frozenset({"transform"}),
    "defs": frozenset(),
    "title": frozenset(),
    "desc": frozenset(),
    "use": frozenset({"x", "y", "transform", "href", "xlink:href"}),
    "path": frozenset({"d", "pathLength", "transform"}),
    "rect": frozenset({"x", "y", "width", "height", "rx", "ry", "transform"}),
    "circle": frozenset({"cx", "cy", "r", "transform"}),
    "ellipse": frozenset({"cx", "cy", "rx", "ry", "transform"}),
    "line": frozenset({"x1", "y1", "x2", "y2", "transform"}),
    "polyline": frozenset({"points", "transform"}),
    "polygon": frozenset({"points", "transform"}),
    "linearGradient": frozenset({"x1", "y1", "x2", "y2", "gradientUnits"}),
    "radialGradient": frozenset({"cx", "cy", "r", "gradientUnits"}),
    "stop": frozenset({"offset"}),
    "solidColor": frozenset(),
    "text": frozenset({"x", "y", "rotate", "editable", "transform"}),
    "tspan": frozenset(),
    "textArea": frozenset({"x", "y", "width", "height", "editable", "transform"}),
    "tbreak": frozenset(),
    "style": frozenset({"type"}),  # not in the profile: see the module header
}

COMMON_ATTRIBUTES = CORE_ATTRIBUTES | PRESENTATION_ATTRIBUTES

# Attributes holding a reference: only "#fragment" (same document) is allowed.
REFERENCE_ATTRIBUTES = frozenset({"href", "xlink:href"})

# Attributes a browser reads as CSS, where url() and other functions can reach out.
CSS_ATTRIBUTES = PRESENTATION_ATTRIBUTES | {"style", "transform"}

# Why some well-known elements are refused (any namespace); the rest are simply not listed.
_ANIMATION = "animation can rewrite any attribute, e.g. an href into javascript:"
REFUSED_ELEMENTS = {
    "script": "scripts must never run in a logo",
    "handler": "scripts must never run in a logo",
    "listener": "scripts must never run in a logo",
    "foreignObject": "it embeds HTML",
    "image": "it shows a raster or outside picture, neither of which SVG Tiny PS allows",
    "a": "links are not part of SVG Tiny PS",
    "animate": _ANIMATION,
    "animateColor": _ANIMATION,
    "animateMotion": _ANIMATION,
    "animateTransform": _ANIMATION,
    "set": _ANIMATION,
    "discard": _ANIMATION,
}

# CSS functions allowed in style sheets, style attributes and presentation values (colours
# and transforms); url() is allowed only as url(#fragment), matched by _LOCAL_URL.
CSS_FUNCTIONS = frozenset(
    {"rgb", "rgba", "hsl", "hsla", "matrix", "translate", "scale", "rotate", "skewx", "skewy"}
)

_CSS_COMMENT = re.compile(r"/\*.*?(?:\*/|\Z)", re.DOTALL)
_AT_RULE = re.compile(r"@[\w-]*")
_LOCAL_URL = re.compile(r"""url\(\s*(?:#[^\s'"()]*|'#[^'"()]*'|"#[^'"()]*")\s*\)""", re.IGNORECASE)
_FUNCTION = re.compile(r"([\w-]+)\s*\(")
_SHOWN_CHARS = 60
_UTF8 = "the logo must be UTF-8 SVG text"


def _unsafe(detail: str) -> InvalidRequest:
    return InvalidRequest(detail, code="unsafe_svg")


def _not_svg(detail: str) -> InvalidRequest:
    return InvalidRequest(detail, code="not_svg")


def _clip(text: str) -> str:
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "…"


def _split(name: str) -> tuple[str, str]:
    """`{namespace}local` as parsed (namespace "" when there is none) -> (namespace, local)."""
    if name.startswith("{"):
        namespace, _, local = name[1:].partition("}")
        return namespace, local
    return "", name


def _element_name(tag: str) -> str:
    """The element's name in ELEMENTS; InvalidRequest when the profile does not allow it."""
    namespace, local = _split(tag)
    shown = f"<{local}>" if namespace == SVG_NS else f"<{local}> in namespace {namespace or 'none'}"
    reason = REFUSED_ELEMENTS.get(local)
    if reason is None and namespace != SVG_NS:
        reason = "only SVG elements are allowed"
    if reason is None and local not in ELEMENTS:
        reason = "it is not part of SVG Tiny PS"
    if reason is not None:
        raise _unsafe(f"element {shown} is not allowed: {reason}")
    return local


def _attribute_name(name: str) -> str:
    namespace, local = _split(name)
    if not namespace:
        return local
    prefix = PREFIXES.get(namespace)
    return f"{prefix}:{local}" if prefix else f"{local} (namespace {namespace})"


def _css_problem(css: str) -> str | None:
    """What in a piece of CSS (a style sheet, a style attribute, a presentation value) could
    reach outside the document, or None. Escapes are refused since they can spell `url(`."""
    if "\\" in css:
        return "a CSS escape (\\), which can disguise a reference"
    css = _CSS_COMMENT.sub(" ", css)
    at_rule = _AT_RULE.search(css)
    if at_rule:
        return f"the at-rule {at_rule.group()}, which can load from elsewhere"
    css = _LOCAL_URL.sub(" ", css)
    for function in _FUNCTION.finditer(css):
        name = function.group(1).lower()
        if name == "url":
            reference = css[function.start() :].partition(")")[0] + ")"
            return f"{_clip(reference)}, but only url(#fragment) references are allowed"
        if name not in CSS_FUNCTIONS:
            return f"the function {name}(), which is not allowed"
    return None


def _check_attribute(element: str, raw_name: str, value: str) -> None:
    name = _attribute_name(raw_name)
    where = f"attribute {name} on <{element}>"
    if _split(raw_name)[1].lower().startswith("on"):
        raise _unsafe(f"{where} is not allowed: event handlers run scripts")
    if name not in COMMON_ATTRIBUTES and name not in ELEMENTS[element]:
        raise _unsafe(f"{where} is not allowed: it is not part of SVG Tiny PS")
    if name in REFERENCE_ATTRIBUTES and not value.startswith("#"):
        raise _unsafe(
            f'{where} refers outside the document ("{_clip(value)}"): '
            "only #fragment references are allowed"
        )
    problem = _css_problem(value) if name in CSS_ATTRIBUTES else None
    if problem is not None:
        raise _unsafe(f"{where} holds {problem}")


class _Checker:
    """The parser's target: checks each piece as the parser meets it, raising at the first fault."""

    def __init__(self) -> None:
        self._open: list[str] = []
        self._css: list[str] = []  # the text inside <style>, checked at its end

    def xml_declaration(self, version: str, encoding: str | None, standalone: int) -> None:
        # A browser decodes by the declaration: another encoding would show it other text.
        if encoding is not None and encoding.lower() != "utf-8":
            raise _not_svg(f"{_UTF8}, not declared as {_clip(encoding)}")

    def pi(self, target: str, data: str) -> None:
        raise _unsafe(
            f"the processing instruction <?{_clip(target)}?> is not allowed: "
            "it can load a style sheet from elsewhere"
        )

    def start(self, tag: str, attrib: dict[str, str]) -> None:
        if not self._open and tag != f"{{{SVG_NS}}}svg":
            namespace, local = _split(tag)
            raise _not_svg(
                f'the root element must be <svg xmlns="{SVG_NS}">, not <{_clip(local)}> '
                f"(namespace {_clip(namespace) or 'none'})"
            )
        element = _element_name(tag)
        for name, value in attrib.items():
            _check_attribute(element, name, value)
        self._open.append(element)

    def data(self, text: str) -> None:
        if "style" in self._open:
            self._css.append(text)

    def end(self, tag: str) -> None:
        if self._open.pop() == "style":
            problem = _css_problem("".join(self._css))
            if problem is not None:
                raise _unsafe(f"<style> holds {problem}")


def check(content: bytes) -> str:
    """The SVG document as text when the profile allows it; InvalidRequest (400) naming what
    it refuses otherwise."""
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        raise _not_svg(_UTF8) from None
    checker = _Checker()
    parser: Any = DefusedXMLParser(
        target=checker, encoding="utf-8", forbid_dtd=True, forbid_entities=True
    )
    parser.parser.XmlDeclHandler = checker.xml_declaration
    try:
        parser.feed(content)
        parser.close()
    except DefusedXmlException:
        raise _unsafe(
            "a DOCTYPE is not allowed: its entities can build markup, such as a script, "
            "that is not in the file as written"
        ) from None
    except ParseError as error:
        raise _not_svg(f"the logo is not well-formed XML: {error}") from None
    return text
