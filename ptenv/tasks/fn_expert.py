"""Function families of the expert tier (ptenv/tasks/functions.py)."""

FAMILIES = []
