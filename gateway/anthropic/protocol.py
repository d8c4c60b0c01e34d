"""Anthropic Messages wire types (msgspec Structs): request, response, stream events, count_tokens.

Fields follow https://docs.claude.com/en/api/messages (request) and the response example's
order; blocks and events are unions tagged by ``type``. Roles are plain strings here: Claude
Code sends ``ctx`` / ``msg`` / ``system`` roles besides user and assistant (vLLM #44000), and the
handler decides what they mean instead of refusing the whole request at decode time.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import UNSET, Meta, Struct, UnsetType

# -- request blocks ---------------------------------------------------------------------------------


class TextBlockParam(Struct, tag_field="type", tag="text", kw_only=True):
    text: str
    cache_control: dict[str, Any] | None = None
    citations: list[Any] | None = None


class Base64ImageSource(Struct, tag_field="type", tag="base64", kw_only=True):
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str


class URLImageSource(Struct, tag_field="type", tag="url", kw_only=True):
    url: str


class FileImageSource(Struct, tag_field="type", tag="file", kw_only=True):
    """The Files API (beta): refused, this server stores no files."""

    file_id: str


class ImageBlockParam(Struct, tag_field="type", tag="image", kw_only=True):
    """https://docs.claude.com/en/docs/build-with-claude/vision"""

    source: Base64ImageSource | URLImageSource | FileImageSource
    cache_control: dict[str, Any] | None = None


class DocumentBlockParam(Struct, tag_field="type", tag="document", kw_only=True):
    source: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class ToolUseBlockParam(Struct, tag_field="type", tag="tool_use", kw_only=True):
    id: str
    name: str
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class ToolResultBlockParam(Struct, tag_field="type", tag="tool_result", kw_only=True):
    tool_use_id: str
    content: str | list[TextBlockParam | ImageBlockParam | DocumentBlockParam] | None = None
    is_error: bool | None = None
    cache_control: dict[str, Any] | None = None


class ThinkingBlockParam(Struct, tag_field="type", tag="thinking", kw_only=True):
    thinking: str
    signature: str | None = None


class RedactedThinkingBlockParam(Struct, tag_field="type", tag="redacted_thinking", kw_only=True):
    data: str


ContentBlockParam = (TextBlockParam | ImageBlockParam | DocumentBlockParam | ToolUseBlockParam | ToolResultBlockParam
                     | ThinkingBlockParam | RedactedThinkingBlockParam)


class MessageParam(Struct, kw_only=True):
    # The API's two roles; decoding stays lenient (agent clients send others, which convert maps or refuses)
    role: Annotated[str, Meta(extra_json_schema={"enum": ["user", "assistant"]})]
    content: str | list[ContentBlockParam]


Messages = Annotated[list[MessageParam], Meta(min_length=1)]  # the API refuses an empty conversation


class Tool(Struct, kw_only=True):
    """https://docs.claude.com/en/api/messages#body-tools. Server tools carry a versioned ``type``."""

    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None
    cache_control: dict[str, Any] | None = None


class ToolChoiceAuto(Struct, tag_field="type", tag="auto", kw_only=True):
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAny(Struct, tag_field="type", tag="any", kw_only=True):
    disable_parallel_tool_use: bool | None = None


class ToolChoiceTool(Struct, tag_field="type", tag="tool", kw_only=True):
    name: str
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNone(Struct, tag_field="type", tag="none", kw_only=True):
    pass


ToolChoice = ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone


class ThinkingEnabled(Struct, tag_field="type", tag="enabled", kw_only=True):
    budget_tokens: int | None = None


class ThinkingDisabled(Struct, tag_field="type", tag="disabled", kw_only=True):
    pass


class ThinkingAdaptive(Struct, tag_field="type", tag="adaptive", kw_only=True):
    pass


ThinkingConfig = ThinkingEnabled | ThinkingDisabled | ThinkingAdaptive


class MessagesRequest(Struct, kw_only=True):
    """https://docs.claude.com/en/api/messages"""

    model: str
    messages: Messages
    max_tokens: int
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    system: str | list[TextBlockParam] | None = None
    temperature: float | None = None
    thinking: ThinkingConfig | None = None
    tool_choice: ToolChoice | None = None
    tools: list[Tool] | None = None
    top_k: int | None = None
    top_p: float | None = None
    # -- extensions (vLLM's names)
    min_p: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class CountTokensRequest(Struct, kw_only=True):
    """https://docs.claude.com/en/api/messages-count-tokens"""

    model: str
    messages: Messages
    system: str | list[TextBlockParam] | None = None
    thinking: ThinkingConfig | None = None
    tool_choice: ToolChoice | None = None
    tools: list[Tool] | None = None
    # -- extensions
    chat_template_kwargs: dict[str, Any] | None = None


class CountTokensResponse(Struct, kw_only=True):
    input_tokens: int


# -- response -------------------------------------------------------------------------------------


class TextBlock(Struct, tag_field="type", tag="text", kw_only=True):
    text: str


class ThinkingBlock(Struct, tag_field="type", tag="thinking", kw_only=True):
    thinking: str
    signature: str


class ToolUseBlock(Struct, tag_field="type", tag="tool_use", kw_only=True):
    id: str
    name: str
    input: dict[str, Any]


ContentBlock = TextBlock | ThinkingBlock | ToolUseBlock


class Usage(Struct, kw_only=True):
    input_tokens: int
    cache_creation_input_tokens: int | None = 0
    cache_read_input_tokens: int | None = 0
    output_tokens: int


class Message(Struct, tag_field="type", tag="message", kw_only=True):
    """https://docs.claude.com/en/api/messages#response-id (``type`` comes first, as in the docs' example)"""

    id: str
    role: Literal["assistant"] = "assistant"
    content: list[ContentBlock]
    model: str
    stop_reason: str | None = None
    stop_sequence: str | None = None
    usage: Usage


# -- stream events (https://docs.claude.com/en/docs/build-with-claude/streaming) --------------------


class TextDelta(Struct, tag_field="type", tag="text_delta"):
    text: str


class ThinkingDelta(Struct, tag_field="type", tag="thinking_delta"):
    thinking: str


class SignatureDelta(Struct, tag_field="type", tag="signature_delta"):
    signature: str


class InputJSONDelta(Struct, tag_field="type", tag="input_json_delta"):
    partial_json: str


class MessageStartEvent(Struct, tag_field="type", tag="message_start"):
    message: Message


class ContentBlockStartEvent(Struct, tag_field="type", tag="content_block_start"):
    index: int
    content_block: ContentBlock


class ContentBlockDeltaEvent(Struct, tag_field="type", tag="content_block_delta"):
    index: int
    delta: TextDelta | ThinkingDelta | SignatureDelta | InputJSONDelta


class ContentBlockStopEvent(Struct, tag_field="type", tag="content_block_stop"):
    index: int


class MessageDeltaBody(Struct, kw_only=True):
    stop_reason: str | None
    stop_sequence: str | None = None


class MessageDeltaUsage(Struct, kw_only=True):
    output_tokens: int
    input_tokens: int | UnsetType = UNSET
    cache_read_input_tokens: int | UnsetType = UNSET


class MessageDeltaEvent(Struct, tag_field="type", tag="message_delta"):
    delta: MessageDeltaBody
    usage: MessageDeltaUsage


class MessageStopEvent(Struct, tag_field="type", tag="message_stop"):
    pass


class PingEvent(Struct, tag_field="type", tag="ping"):
    pass


class StreamError(Struct, kw_only=True):
    type: str
    message: str


class ErrorEvent(Struct, tag_field="type", tag="error"):
    error: StreamError


MessageStreamEvent = (MessageStartEvent | ContentBlockStartEvent | ContentBlockDeltaEvent | ContentBlockStopEvent
                      | MessageDeltaEvent | MessageStopEvent | PingEvent | ErrorEvent)

