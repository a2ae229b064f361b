"""Reading an OpenAI-compatible chat-completions stream: events, the output bound, chunks.

``SSEParser`` cuts ``text/event-stream`` bytes into events, ``Deltas`` turns each event's
content and reasoning deltas into ``Chunk``s and stops at ``OutputBound``: a little past the
request's ``max_tokens`` (reasoning counts too), judged by deltas, ``usage`` and characters,
with everything else the server sends bounded in bytes. No I/O here: ``openai_http`` reads
the stream and acts on what these decide.
"""

from __future__ import annotations

import contextlib
import re
import time
from dataclasses import dataclass, field
from typing import Any

from cosmos_reason_ros.core.types import Chunk, FinishReason
from cosmos_reason_ros.engines.base import output_token_limit

_EOL = re.compile(rb"\r\n|\r|\n")
# Answers average ~4 characters per token (English), ~3 (JSON, code); only text made of
# nothing but the longest whitespace or punctuation tokens averages more than 32, so a
# server batching many tokens into one delta is still judged by characters / 32.
_MAX_CHARS_PER_TOKEN = 32
# Everything else a server sends (SSE framing, the JSON around each delta, usage, one line
# that never ends) is bounded in bytes: vLLM's event for one token is ~250-400 bytes.
_MAX_BYTES_PER_TOKEN = 4096
_BYTES_SLACK = 64 * 1024
_FINISH = {
    "stop": FinishReason.STOP, "eos": FinishReason.STOP, "tool_calls": FinishReason.STOP,
    "function_call": FinishReason.STOP, "length": FinishReason.LENGTH,
    "abort": FinishReason.CANCELLED, "cancelled": FinishReason.CANCELLED,
}


# --- server-sent events -----------------------------------------------------------------------


class SSEParser:
    r"""Incremental ``text/event-stream`` parser: feed bytes in any split, get event data.

    Lines may end in ``\n``, ``\r\n`` or ``\r`` and may be cut anywhere (also inside a
    UTF-8 sequence); several ``data:`` lines of one event are joined with ``\n``; comments
    (``:``) and other fields are ignored.
    """

    def __init__(self) -> None:
        """Start with an empty buffer."""
        self._partial: list[bytes] = []  # the current line, not yet ended
        self._data: list[str] = []
        self._pending_cr = False

    def feed(self, raw: bytes) -> list[str]:
        """Add bytes; return the data of every event completed by them, in order."""
        if self._pending_cr and raw.startswith(b"\n"):
            raw = raw[1:]  # the \n of a \r\n split across two reads
        self._pending_cr = False
        events: list[str] = []
        start = 0
        # Only the new bytes are scanned (a C-level search), so a long line that arrives in
        # many reads costs linear time, not a rescan of everything buffered per read.
        for end in _EOL.finditer(raw):
            if end.group() == b"\r" and end.end() == len(raw):
                self._pending_cr = True
            line = raw[start : end.start()]
            if self._partial:
                line = b"".join((*self._partial, line))
                self._partial = []
            self._line(line.decode("utf-8", errors="replace"), events)
            start = end.end()
        if start < len(raw):
            self._partial.append(raw[start:])
        return events

    def _line(self, line: str, events: list[str]) -> None:
        if not line:
            if self._data:
                events.append("\n".join(self._data))
                self._data = []
            return
        if line.startswith(":"):
            return
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)


@dataclass
class OutputBound:
    """What a request allows a server to send, and how much of it has arrived."""

    max_tokens: int
    deltas: int = 0  # content or reasoning deltas passed on (vLLM: at least a token each)
    chars: int = 0  # their characters
    usage_tokens: int = 0  # the largest usage.completion_tokens seen
    limit: int = field(init=False)  # tokens
    max_chars: int = field(init=False)
    max_bytes: int = field(init=False)

    def __post_init__(self) -> None:
        """Derive the limits once."""
        self.limit = output_token_limit(self.max_tokens)
        self.max_chars = self.limit * _MAX_CHARS_PER_TOKEN
        self.max_bytes = _BYTES_SLACK + self.limit * _MAX_BYTES_PER_TOKEN

    def tokens(self) -> int:
        """Return a lower bound on the output tokens read so far."""
        return max(self.deltas, self.usage_tokens, -(-self.chars // _MAX_CHARS_PER_TOKEN))


class Deltas:
    """Turns the stream's events into ``Chunk``s, within the request's output bound."""

    def __init__(self, max_tokens: int, inline: bool) -> None:
        self.bound = OutputBound(max_tokens)
        self.inline = inline  # reasoning re-wrapped in <think> tags inside the text
        self.in_reasoning = False
        self.delivered = False  # any text or reasoning passed on
        self.finish: FinishReason | None = None
        self.usage: dict[str, Any] | None = None
        self.overran = ""  # what passed the bound; "" while within it
        self.last_event = time.monotonic()

    @property
    def started(self) -> bool:
        """Whether the first token arrived (nothing may be retried from then on)."""
        return self.delivered or self.finish is not None

    def add(self, event: Any, t0: float) -> list[Chunk]:
        """Return the chunks of one event; sets ``overran`` when it passes the bound."""
        self.last_event = now = time.monotonic()
        bound, out = self.bound, []
        if not isinstance(event, dict):
            return out
        if isinstance(event.get("usage"), dict):
            self.usage = event["usage"]
            with contextlib.suppress(TypeError, ValueError):
                bound.usage_tokens = max(bound.usage_tokens,
                                         int(self.usage.get("completion_tokens") or 0))
            if bound.usage_tokens > bound.limit:
                self.overran = f"usage.completion_tokens={bound.usage_tokens}"
                return out
        for choice in event.get("choices") or ():
            delta = choice.get("delta") or {}
            reasoning = str(delta.get("reasoning") or delta.get("reasoning_content") or "")
            content = str(delta.get("content") or "")
            if reasoning or content:
                # Reasoning and answer share the request's max_tokens.
                if bound.deltas >= bound.limit:
                    self.overran = f"more than {bound.limit} deltas"
                    return out
                room = bound.max_chars - bound.chars
                if len(reasoning) + len(content) > room:
                    reasoning, content = reasoning[:room], content[: room - len(reasoning)]
                    self.overran = f"more than {bound.max_chars} characters"
                if reasoning or content:
                    bound.deltas += 1
                    bound.chars += len(reasoning) + len(content)
            text, reasoning_delta = content, ""
            if reasoning:
                if self.inline:
                    text = ("" if self.in_reasoning else "<think>\n") + reasoning + text
                else:
                    reasoning_delta = reasoning
                self.in_reasoning = True
            if content and self.in_reasoning and not reasoning:
                if self.inline:
                    text = "\n</think>\n\n" + text
                self.in_reasoning = False
            if text or reasoning_delta:
                self.delivered = True
                out.append(Chunk(text_delta=text, reasoning_delta=reasoning_delta,
                                 output_tokens=bound.deltas, elapsed_s=now - t0))
            if self.overran:
                return out
            if choice.get("finish_reason"):
                self.finish = _FINISH.get(str(choice["finish_reason"]), FinishReason.ERROR)
        return out

    def final(self, t0: float) -> Chunk:
        """Return the last chunk: finish reason and the server's token counts."""
        assert self.finish is not None
        usage = self.usage or {}
        details = usage.get("prompt_tokens_details") or {}

        def count(value: Any) -> int | None:
            return int(value) if isinstance(value, (int, float)) else None

        return Chunk(finish_reason=self.finish,
                     output_tokens=count(usage.get("completion_tokens")) or self.bound.deltas,
                     prompt_tokens=count(usage.get("prompt_tokens")),
                     cached_prompt_tokens=count(details.get("cached_tokens")),
                     elapsed_s=time.monotonic() - t0)
