"""Function families of the advanced tier (ptenv/tasks/functions.py)."""

FAMILIES = []
