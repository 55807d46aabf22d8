"""Streaming one chat choice that may call tools: content goes out as it is generated; text that may be a
tool call (all of it for ``required`` and named choices, from the parser's ``call_start`` for ``auto``) is
held back and sent, once the choice finished, as one ``tool_calls`` delta with complete arguments."""
from __future__ import annotations

from gh200rt.serve.tools import ToolRequest, auto_parser, split_tool_calls, tool_call_dicts


class ToolStream:
    def __init__(self, tools: ToolRequest):
        self.tools = tools
        self.parser = auto_parser(tools) if tools.choice == "auto" else None
        self.text = ""
        self.sent = 0                     # characters of ``text`` already sent as content

    def feed(self, delta: str) -> str:
        """The content that can be sent now."""
        self.text += delta
        if self.parser is None:
            return ""
        start = self.parser.call_start(self.text)
        safe = len(self.text) if start is None else start
        out = self.text[self.sent:safe] if safe > self.sent else ""
        self.sent = max(self.sent, safe)
        return out

    def finish(self, finish_reason: str | None) -> tuple[dict, str | None]:
        """The last delta of the choice and its finish_reason."""
        calls = split_tool_calls(self.tools, self.text)[1] if finish_reason == "stop" else []
        if calls:
            return {"tool_calls": tool_call_dicts(calls, with_index=True)}, "tool_calls"
        rest = self.text[self.sent:]
        self.sent = len(self.text)
        return ({"content": rest} if rest else {}), finish_reason
