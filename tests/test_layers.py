"""The layering rules of docs/architecture.md section 2, held against every import of the product.

Dependencies point one way: the front doors (`api`, `relay`, `mcp_door`, `console`) ->
`engine` -> `storage`; `postroom/` wires them together. Inside the engine, the platform
(`engine/platform/`: runtime, clock, errors, wake-ups, nodes, DNS, outbound HTTP...) is the
ground floor: it imports no feature, every feature may import it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("postroom", "engine", "api", "relay", "storage", "console", "mcp_door", "clients")

# (package, what it may not import); a prefix names a package and everything under it.
FORBIDDEN: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("storage", ("engine", "api", "relay", "console", "mcp_door", "postroom", "clients")),
    ("engine", ("api", "relay", "console", "mcp_door", "postroom", "clients")),
    ("api", ("relay", "console", "postroom")),
    ("relay", ("api", "console", "mcp_door", "postroom")),
    ("console", ("relay", "mcp_door", "postroom")),
    ("mcp_door", ("relay", "console", "postroom")),
)


def _imports(path: Path) -> list[str]:
    """The absolute modules `path` imports (relative imports stay inside their package)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(node.module)
            # `from engine import dns` imports the module engine.dns.
            found += [f"{node.module}.{alias.name}" for alias in node.names]
    return found


def _modules(package: str) -> dict[str, list[str]]:
    return {
        str(path.relative_to(ROOT)): _imports(path)
        for path in sorted((ROOT / package).rglob("*.py"))
    }


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_dependencies_point_one_way() -> None:
    wrong = [
        f"{path} imports {module}"
        for package, forbidden in FORBIDDEN
        for path, modules in _modules(package).items()
        for module in modules
        if any(_under(module, prefix) for prefix in forbidden)
    ]
    assert wrong == []


def test_the_platform_imports_no_feature() -> None:
    platform = _modules("engine/platform")
    assert platform, "engine/platform/ holds the ground floor"
    wrong = [
        f"{path} imports {module}"
        for path, modules in platform.items()
        for module in modules
        if _under(module, "engine") and not _under(module, "engine.platform") and module != "engine"
    ]
    assert wrong == []


def test_the_rules_see_a_feature_import() -> None:
    """The walk above reads real imports: a feature module's are found."""
    modules = _modules("engine/contacts")["engine/contacts/recovery.py"]
    assert "engine.platform.nodes" in modules and "engine.contacts.bulk_send" in modules


def test_delivery_webhooks_and_forwarding_do_not_import_the_sandbox() -> None:
    """The sandbox plugs into them (its egress, its capture of POSTs), given by
    postroom/service.py; it may import their types, never the other way round."""
    wrong = [
        f"{path} imports {module}"
        for package in ("engine/delivery", "engine/webhooks", "engine/forwarding")
        for path, modules in _modules(package).items()
        for module in modules
        if _under(module, "engine.sandbox")
    ]
    assert wrong == []
    assert "engine.delivery.egress" in _modules("engine/sandbox")["engine/sandbox/capture.py"]


def _room(module: str) -> str | None:
    """The engine package (or single module) `module` belongs to, e.g. `delivery`."""
    parts = module.split(".")
    if parts[0] != "engine" or len(parts) < 2:
        return None
    return parts[1]


def test_the_engines_features_stand_on_floors() -> None:
    """No two engine packages import each other, directly or round a loop: every arrow
    between them points down, so each has a floor (what farm-studio-like views draw)."""
    arrows: dict[str, set[str]] = {}
    for path, modules in _modules("engine").items():
        here = _room(".".join(Path(path).with_suffix("").parts))
        for module in modules:
            there = _room(module)
            exists = there is not None and (
                (ROOT / "engine" / there).is_dir() or (ROOT / "engine" / f"{there}.py").exists()
            )
            if here not in (None, "__init__") and exists and there != here:
                arrows.setdefault(here, set()).add(str(there))
    loops = []
    done: set[str] = set()

    def visit(room: str, path: list[str]) -> None:
        if room in path:
            loops.append(" -> ".join([*path[path.index(room) :], room]))
            return
        if room in done:
            return
        for there in sorted(arrows.get(room, ())):
            visit(there, [*path, room])
        done.add(room)

    for room in sorted(arrows):
        visit(room, [])
    assert loops == []
    assert "platform" in arrows["delivery"]  # the walk sees real arrows


def test_no_test_module_imports_another() -> None:
    """What tests share lives in tests/harness/: a test module importing another's private
    helpers runs that module's imports and fixtures, and couples tests that edit separately."""
    wrong = [
        f"{path} imports {module}"
        for path, modules in _modules("tests").items()
        for module in modules
        if module.startswith("tests.test_")
    ]
    assert wrong == []
