"""The request fields of Anthropic's Messages routes, declared once (README.md's "Anthropic Messages" table lists
them; tests/unit/test_api_docs.py checks both ways), and those refused: Anthropic's features this server cannot
honour are a 400 naming the field when their value asks for something, as on the OpenAI routes (``fields``).
"""
from __future__ import annotations

from gh200rt.serve.fields import ABSENT, EMPTY

REFUSED = {
    "container": (ABSENT, "code-execution containers are not provided by this server; leave 'container' out"),
    "mcp_servers": (EMPTY, "this server connects to no MCP servers; run the tools on the client and send them as "
                           "'tools'"),
    "context_management": (ABSENT, "this server does not edit the context (no clearing of old tool results or "
                                   "thinking); send the messages to keep and leave 'context_management' out"),
    "inference_geo": (ABSENT, "this server runs where it is started; leave 'inference_geo' out"),
    "speed": (("standard",), "this server has one speed; leave 'speed' out or \"standard\""),
    "diagnostics": (ABSENT, "prompt-cache diagnostics are not reported by this server; leave 'diagnostics' out"),
    "user_profile_id": (ABSENT, "this server has no user profiles (the API key is its only identity); leave "
                                "'user_profile_id' out"),
    "workspace_id": (ABSENT, "this server has no workspaces (the API key is its only identity); leave 'workspace_id' "
                             "out"),
    "service_tier": (("auto", "standard_only"), "this server has one service tier; leave 'service_tier' out, "
                                                "\"auto\" or \"standard_only\""),
}
COUNT_TOKENS_REFUSED = {name: REFUSED[name] for name in ("speed", "user_profile_id", "workspace_id", "mcp_servers")}

# What shapes the prompt: both routes read these.
PROMPT = ("model", "system", "messages", "tools", "tool_choice", "thinking", "cache_control", "output_config")
GENERATION = ("max_tokens", "stop_sequences", "temperature", "top_p", "top_k", "metadata", "stream")
MESSAGES = (*PROMPT, *GENERATION, *REFUSED)
COUNT_TOKENS = (*PROMPT, *COUNT_TOKENS_REFUSED)

# The keys a content block of each type may hold; other block types are refused with the reason given.
BLOCK_KEYS = {
    "text": ("type", "text", "cache_control", "citations"),
    "tool_use": ("type", "id", "name", "input", "cache_control"),
    "tool_result": ("type", "tool_use_id", "content", "is_error", "cache_control"),
    "thinking": ("type", "thinking", "signature"),
}
USER_BLOCKS = ("text", "tool_result")
ASSISTANT_BLOCKS = ("text", "tool_use", "thinking")
UNREADABLE_BLOCKS = {
    "image": "images are not supported by this server (text-only models); send text",
    "document": "documents are not read by this server (text-only models, no PDF reader); send their text",
    "search_result": "search results with citations are not supported by this server; send their text",
    "redacted_thinking": "this server never redacts thinking, so it cannot read a redacted block; leave it out",
    "container_upload": "code-execution containers are not provided by this server",
}

TOOL_KEYS = ("name", "description", "input_schema", "type", "cache_control", "strict")
TOOL_REFUSED = {
    "input_examples": (EMPTY, "input examples are not shown to the chat template; put them in the 'description'"),
    "defer_loading": ((False,), "every tool is shown to the chat template (no tool search); leave 'defer_loading' "
                                "out or false"),
    "allowed_callers": ((["direct"],), "tools are called by the model only (no code execution); leave "
                                       "'allowed_callers' out or [\"direct\"]"),
    "eager_input_streaming": ((False,), "a tool's input is streamed once it is complete and checked, not as "
                                        "generated; leave 'eager_input_streaming' out or false"),
}
TOOL_CHOICE_KEYS = {"auto": ("type", "disable_parallel_tool_use"), "any": ("type", "disable_parallel_tool_use"),
                    "tool": ("type", "name", "disable_parallel_tool_use"), "none": ("type",)}
