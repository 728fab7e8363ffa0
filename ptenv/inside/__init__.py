"""What runs inside a sandbox: the fork server, the supervisor, the model's interpreter and what
they share. Everything in this folder, and nothing outside it, is mounted into a sandbox (locally
read-only; on Prime shipped in the container's start command), so it imports only the standard
library, torch and itself."""

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent

# Paths relative to the folder that holds `ptenv/`, as they sit in a sandbox's /opt/ptenv.
FILES = ("ptenv/__init__.py", *sorted(f"ptenv/inside/{p.name}" for p in _PACKAGE.glob("*.py")))
SOURCE_ROOT = _PACKAGE.parents[1]
