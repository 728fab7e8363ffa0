"""Function families of the basic tier (ptenv/tasks/functions.py)."""

FAMILIES = []
