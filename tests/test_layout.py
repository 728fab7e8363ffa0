"""The package's layout is its trust boundary: ptenv/inside is exactly what a sandbox sees, so it
may import only the standard library, torch and itself."""

import ast
import sys
from pathlib import Path

from ptenv import inside

INSIDE = Path(inside.__file__).parent
ALLOWED = set(sys.stdlib_module_names) | {"torch"}


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: use absolute imports"
            names.add(node.module)
    return names


def test_inside_imports_only_the_standard_library_torch_and_itself():
    files = sorted(INSIDE.glob("*.py"))
    assert len(files) > 10
    for path in files:
        for name in imported_modules(path):
            ok = name.split(".")[0] in ALLOWED or name == "ptenv.inside" or name.startswith("ptenv.inside.")
            assert ok, f"ptenv/inside/{path.name} imports {name}"


def test_the_mounted_files_are_the_inside_folder():
    assert inside.FILES == ("ptenv/__init__.py", *(f"ptenv/inside/{p.name}" for p in sorted(INSIDE.glob("*.py"))))
    assert (inside.SOURCE_ROOT / "ptenv" / "__init__.py").read_text().strip() == ""
