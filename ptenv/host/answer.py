"""Where a function task's answer is: the one rule, stated in the system prompt and applied on both
verifiers lines and on every transport. The answer is the last fenced Python code block of the
model's final message that defines the function (`def <name>(`); code run in the session does not
count, so a model that never calls a tool can still answer."""

import re

MAX_ANSWER_CHARS = 64 * 1024  # one request's argument on Prime is at most 128 KiB, base64 included
# The final message is searched only up to this size: the search is linear, and at this size it
# costs at most about 20 ms (bench/bench_replies.py: hostile final messages), off the event loop.
MAX_MESSAGE_CHARS = 256 * 1024
# Linear in the text: the blanks after the opener are matched once and never given back (a second
# `[ \t]*` beside the first would try every split of a run of them), and the search resumes past
# each block's closer.
FENCE = re.compile(r"```[ \t]*+(?:(?:python3?|py)[ \t]*+)?\r?\n(.*?)```", re.DOTALL | re.IGNORECASE)


class MessageTooLong(ValueError):
    """A final message past MAX_MESSAGE_CHARS: it is not searched."""


def function_source(message, name: str) -> str | None:
    """The answer's source in a final message (its text, or a list of content parts), or None.
    MessageTooLong for a message past MAX_MESSAGE_CHARS."""
    text = message_text(message)
    if len(text) > MAX_MESSAGE_CHARS:
        raise MessageTooLong(f"the final message has {len(text):,} characters; at most {MAX_MESSAGE_CHARS:,} are searched")
    for block in reversed(FENCE.findall(text)):
        if re.search(rf"^[ \t]*(?:async[ \t]+)?def[ \t]+{re.escape(name)}[ \t]*\(", block, re.MULTILINE):
            return block
    return None


def message_text(content) -> str:
    """A message's text: a string, or the text parts of an OpenAI-style content list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part.get("text", "") for part in content if isinstance(part, dict)
                         and isinstance(part.get("text"), str))
    return ""


def final_message(messages) -> str:
    """The text of the last assistant message of a completion (a list of chat messages)."""
    for message in reversed(messages if isinstance(messages, list) else []):
        role = message.get("role") if isinstance(message, dict) else getattr(message, "role", None)
        if role == "assistant":
            content = message.get("content") if isinstance(message, dict) else getattr(message, "content", None)
            return message_text(content)
    return ""
