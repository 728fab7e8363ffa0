"""Where the model's tool arguments enter the host: each is checked before anything is built from
it, and a bad one becomes an error message the model reads (never an exception that ends the
rollout, which would be scored as a harness failure).

A tool argument is whatever JSON the model wrote: any type, any text (NUL bytes, lone surrogates
from `\\ud800` escapes), any length.
"""

MAX_CHARS = 64 * 1024  # one cell or one command


def problem(name: str, value: object, shell: bool) -> str | None:
    """Why `value` cannot be run as the `name` argument of a tool, or None when it can."""
    if not isinstance(value, str):
        return f"Error: `{name}` must be a string, got {json_type(value)}."
    if len(value) > MAX_CHARS:
        return f"Error: `{name}` is {len(value):,} characters long; the limit is {MAX_CHARS:,}."
    if shell and "\0" in value:
        return f"Error: `{name}` contains a NUL byte, which no shell command can hold."
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"Error: `{name}` is not valid text: a lone surrogate at index {e.start} (\\u{ord(value[e.start]):04x})."
    return None


def json_type(value: object) -> str:
    names = {type(None): "null", bool: "a boolean", int: "a number", float: "a number", list: "an array", dict: "an object"}
    return names.get(type(value), type(value).__name__)
