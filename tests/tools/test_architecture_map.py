"""docs/architecture.md's subpackage table against the code: the "imports today (of ours)" column names
exactly the subpackages each one imports (at module level or inside a function), and the layer
numbers are those of the import-layer contract in pyproject.toml.

The map said `weight_sync` imports nothing of ours, and left `actor` out of the controller's imports
and `models` out of the launcher's; nothing compared it with the code.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "services" / "omnirl"
ROW = re.compile(r"^\| `(\w+)` \| (\d) \| .* \| ([^|]+) \|$")


def map_rows() -> dict[str, tuple[int, set[str]]]:
    """Subpackage → (layer, the subpackages its row says it imports), from the map's table."""
    text = (REPO / "docs" / "architecture.md").read_text()
    table = text.split("### Subpackages of `services/omnirl/`", 1)[1].split("\n\n", 2)[1]
    rows = {}
    for line in table.splitlines():
        match = ROW.match(line)
        if match:
            column = re.sub(r"\([^)]*\)", "", match[3])  # "reward (`base` only)" → "reward"
            named = {word.strip() for word in column.split(",")} - {"nothing", ""}
            rows[match[1]] = int(match[2]), named
    return rows


def imported_subpackages(package: str) -> set[str]:
    """Every `omnirl.<sub>` another subpackage's module imports, absolute or relative, at any depth."""
    found = set()
    for path in (PACKAGE / package).rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level:
                base = parts[: len(parts) - node.level]
                names = [".".join(("omnirl", *base, *([node.module] if node.module else [])))]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            found |= {name.split(".")[1] for name in names if name.startswith("omnirl.") and name.count(".") >= 1}
    return found - {package}


def test_the_maps_imports_column_is_what_each_subpackage_imports():
    rows = map_rows()
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert set(rows) == packages, "a subpackage without a row in the map, or a row without a subpackage"
    wrong = {name: {"map": sorted(named), "code": sorted(imported_subpackages(name))}
             for name, (_, named) in rows.items() if named != imported_subpackages(name)}
    assert not wrong, f"docs/architecture.md's 'imports today' column differs from the code: {wrong}"


def test_the_maps_layer_numbers_are_the_import_contracts():
    # read by hand: tomllib needs Python 3.11, we support 3.10; the layers contract is the one `layers = [...]`
    block = re.search(r'containers = \["omnirl"\]\nlayers = \[(.*?)\]', (REPO / "pyproject.toml").read_text(), re.S)
    layers = re.findall(r'"([^"]+)"', block[1])
    contract = {name.strip(): number for number, layer in enumerate(layers, 1) for name in layer.split("|")}
    assert {name: layer for name, (layer, _) in map_rows().items()} == {
        name: contract[name] for name in map_rows()}
