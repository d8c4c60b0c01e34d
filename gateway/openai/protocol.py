"""OpenAI wire types: Chat Completions, Completions, Responses, Models, Embeddings (msgspec Structs),
and vLLM's LoRA adapter admin bodies.

Fields follow the upstream API reference's order (as the official SDK's generated types list
them); each type links its page. Our extensions, which vLLM's users already send through
``extra_body``, sit after a ``# -- extensions`` line. Upstream fields we accept but do not act
on are declared where a client setting them deserves an answer (``functions``, ``audio``,
``suffix``: refused by the handler, not silently ignored); the rest (``metadata``, ``store``,
``user``, ``service_tier``, ...) are accepted and ignored, as msgspec skips unknown fields.

Response-side optional fields use ``UNSET`` so they are left out of the JSON rather than sent as
null where upstream leaves them out (``tool_calls``, ``usage`` on chunks without
``include_usage``, our ``reasoning_content``).

The file is long because it is one API surface in three endpoints; splitting it would scatter
the shared pieces (usage, logprobs, tools).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Struct, UnsetType

# -- shared -----------------------------------------------------------------------------------------


class StreamOptions(Struct, kw_only=True):
    include_usage: bool | None = None
    # -- extensions (vLLM)
    continuous_usage_stats: bool | None = None


class FunctionDefinition(Struct, kw_only=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(Struct, kw_only=True):
    """https://platform.openai.com/docs/api-reference/chat/create#chat-create-tools"""

    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(Struct):
    name: str


class NamedToolChoice(Struct, kw_only=True):
    type: Literal["function"] = "function"
    function: NamedFunction


class JsonSchemaFormat(Struct, kw_only=True):
    name: str = "response"
    description: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None


class ResponseFormat(Struct, kw_only=True):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(Struct, kw_only=True, forbid_unknown_fields=True):
    """vLLM's ``structured_outputs`` extension: exactly one of these."""

    json: dict[str, Any] | str | None = None
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None


class PromptTokensDetails(Struct, kw_only=True):
    cached_tokens: int = 0


class CompletionTokensDetails(Struct, kw_only=True):
    reasoning_tokens: int = 0


class Usage(Struct, kw_only=True):
    """https://platform.openai.com/docs/api-reference/chat/object#chat/object-usage"""

    completion_tokens: int
    prompt_tokens: int
    total_tokens: int
    completion_tokens_details: CompletionTokensDetails | None = None
    prompt_tokens_details: PromptTokensDetails | None = None


class TopLogprob(Struct):
    token: str
    bytes: list[int] | None
    logprob: float


class TokenLogprob(Struct):
    """https://platform.openai.com/docs/api-reference/chat/object#chat/object-choices-logprobs"""

    token: str
    bytes: list[int] | None
    logprob: float
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(Struct, kw_only=True):
    content: list[TokenLogprob] | None = None
    refusal: list[TokenLogprob] | None = None


# -- chat completions: request ------------------------------------------------------------------------


class TextPart(Struct, tag_field="type", tag="text"):
    text: str


class ImageURL(Struct, kw_only=True):
    url: str  # a data: URL, or http(s):// / file:// where the server allows them
    detail: str | None = None  # auto / low / high: accepted, not acted on (the model's processor sizes images)


class ImageURLPart(Struct, tag_field="type", tag="image_url"):
    image_url: ImageURL | str  # the bare string is vLLM's shorthand


# -- extensions (vLLM): a video part, https://docs.vllm.ai/en/latest/features/multimodal_inputs.html


class VideoURL(Struct, kw_only=True):
    url: str  # an animated GIF / WebP / PNG (data: URL or file), or vLLM's data:video/jpeg;base64,<frame>,...


class VideoURLPart(Struct, tag_field="type", tag="video_url"):
    video_url: VideoURL | str


class InputAudioPart(Struct, tag_field="type", tag="input_audio"):
    input_audio: dict[str, Any]


class FilePart(Struct, tag_field="type", tag="file"):
    file: dict[str, Any]


class RefusalPart(Struct, tag_field="type", tag="refusal"):
    refusal: str


ContentPart = TextPart | ImageURLPart | VideoURLPart | InputAudioPart | FilePart | RefusalPart


class FunctionCall(Struct):
    name: str
    arguments: str


class ToolCall(Struct, kw_only=True):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class SystemMessage(Struct, tag_field="role", tag="system", kw_only=True):
    content: str | list[ContentPart]
    name: str | None = None


class DeveloperMessage(Struct, tag_field="role", tag="developer", kw_only=True):
    content: str | list[ContentPart]
    name: str | None = None


class UserMessage(Struct, tag_field="role", tag="user", kw_only=True):
    content: str | list[ContentPart]
    name: str | None = None


class AssistantMessage(Struct, tag_field="role", tag="assistant", kw_only=True):
    content: str | list[ContentPart] | None = None
    refusal: str | None = None
    name: str | None = None
    audio: dict[str, Any] | None = None
    tool_calls: list[ToolCall] | None = None
    function_call: FunctionCall | None = None
    # -- extensions: the reasoning of an earlier turn, sent back (DeepSeek, vLLM, llama.cpp)
    reasoning_content: str | None = None
    reasoning: str | None = None


class ToolMessage(Struct, tag_field="role", tag="tool", kw_only=True):
    content: str | list[ContentPart]
    tool_call_id: str


class FunctionMessage(Struct, tag_field="role", tag="function", kw_only=True):
    content: str | None
    name: str


ChatMessage = SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage | FunctionMessage


class ChatCompletionRequest(Struct, kw_only=True):
    """https://platform.openai.com/docs/api-reference/chat/create"""

    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1)]  # the API refuses an empty conversation
    model: str
    audio: dict[str, Any] | None = None
    frequency_penalty: float | None = None
    function_call: Any = None
    functions: list[dict[str, Any]] | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = None
    max_completion_tokens: int | None = None
    max_tokens: int | None = None
    metadata: dict[str, str] | None = None
    modalities: list[str] | None = None
    n: int | None = None
    parallel_tool_calls: bool | None = None
    prediction: dict[str, Any] | None = None
    presence_penalty: float | None = None
    reasoning_effort: str | None = None
    response_format: ResponseFormat | None = None
    seed: int | None = None
    service_tier: str | None = None
    stop: str | list[str] | None = None
    store: bool | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    tools: list[ChatTool] | None = None
    top_logprobs: int | None = None
    top_p: float | None = None
    user: str | None = None
    # -- extensions (vLLM's names)
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    structured_outputs: StructuredOutputs | None = None
    max_reasoning_tokens: int | None = None  # ours: the reasoning span's token budget
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    documents: list[dict[str, Any]] | None = None


# -- chat completions: response ---------------------------------------------------------------------


class ChoiceToolCallFunction(Struct):
    name: str
    arguments: str


class ChoiceToolCall(Struct, kw_only=True):
    id: str
    type: Literal["function"] = "function"
    function: ChoiceToolCallFunction


class ChatCompletionMessage(Struct, kw_only=True):
    """https://platform.openai.com/docs/api-reference/chat/object#chat/object-choices-message"""

    content: str | None
    refusal: str | None = None
    role: Literal["assistant"] = "assistant"
    tool_calls: list[ChoiceToolCall] | UnsetType = UNSET
    # -- extensions
    reasoning_content: str | UnsetType = UNSET
    reasoning: str | UnsetType = UNSET


class ChatChoice(Struct, kw_only=True):
    finish_reason: str | None
    index: int
    logprobs: ChoiceLogprobs | None
    message: ChatCompletionMessage
    # -- extensions: the stop string or stop token id that ended the choice (vLLM)
    stop_reason: str | int | None = None


class ChatCompletion(Struct, kw_only=True):
    """https://platform.openai.com/docs/api-reference/chat/object"""

    id: str
    choices: list[ChatChoice]
    created: int
    model: str
    object: Literal["chat.completion"] = "chat.completion"
    system_fingerprint: str | None = None
    usage: Usage


class DeltaToolCallFunction(Struct, kw_only=True):
    name: str | UnsetType = UNSET
    arguments: str


class DeltaToolCall(Struct, kw_only=True):
    index: int
    id: str | UnsetType = UNSET
    type: Literal["function"] | UnsetType = UNSET
    function: DeltaToolCallFunction


class ChoiceDelta(Struct, kw_only=True):
    role: Literal["assistant"] | UnsetType = UNSET  # first, as the API sends it
    content: str | UnsetType = UNSET
    tool_calls: list[DeltaToolCall] | UnsetType = UNSET
    # -- extensions
    reasoning_content: str | UnsetType = UNSET
    reasoning: str | UnsetType = UNSET


class ChunkChoice(Struct, kw_only=True):
    delta: ChoiceDelta
    index: int
    finish_reason: str | None = None
    logprobs: ChoiceLogprobs | None = None
    # -- extensions
    stop_reason: str | int | None | UnsetType = UNSET


class ChatCompletionChunk(Struct, kw_only=True):
    """https://platform.openai.com/docs/api-reference/chat-streaming/streaming"""

    id: str
    choices: list[ChunkChoice]
    created: int
    model: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    system_fingerprint: str | None = None
    usage: Usage | None | UnsetType = UNSET


# -- completions ----------------------------------------------------------------------------------


class CompletionRequest(Struct, kw_only=True):
    """https://platform.openai.com/docs/api-reference/completions/create

    ``prompt`` is a string, a list of strings, a list of token ids, or a list of those lists."""

    model: str
    prompt: str | list[str | int | list[int]]
    best_of: int | None = None
    echo: bool | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: int | None = None
    max_tokens: int | None = 16
    n: int | None = None
    presence_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    suffix: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    # -- extensions (vLLM's names)
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    stop_token_ids: list[int] | None = None
    structured_outputs: StructuredOutputs | None = None
    include_stop_str_in_output: bool | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    add_special_tokens: bool | None = None


class CompletionLogprobs(Struct, kw_only=True):
    """The legacy shape: parallel lists, one entry per token."""

    text_offset: list[int]
    token_logprobs: list[float | None]
    tokens: list[str]
    top_logprobs: list[dict[str, float] | None]


class CompletionChoice(Struct, kw_only=True):
    finish_reason: str | None
    index: int
    logprobs: CompletionLogprobs | None
    text: str
    # -- extensions
    stop_reason: str | int | None | UnsetType = UNSET


class Completion(Struct, kw_only=True):
    """https://platform.openai.com/docs/api-reference/completions/object (also each stream chunk)"""

    id: str
    choices: list[CompletionChoice]
    created: int
    model: str
    object: Literal["text_completion"] = "text_completion"
    system_fingerprint: str | None = None
    usage: Usage | None | UnsetType = UNSET


# -- models ---------------------------------------------------------------------------------------


class Model(Struct, kw_only=True):
    """https://platform.openai.com/docs/api-reference/models/object"""

    id: str
    created: int
    object: Literal["model"] = "model"
    owned_by: str
    # -- extensions: adapters name their base model (vLLM's root / parent), and the context length
    root: str | UnsetType = UNSET
    parent: str | None | UnsetType = UNSET
    max_model_len: int | UnsetType = UNSET


class ModelList(Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[Model]


# -- responses: request ---------------------------------------------------------------------------


class InputContent(Struct, kw_only=True):
    """A content part of an input message: input_text, output_text (earlier answers), input_image,
    or kinds we refuse."""

    type: str
    text: str | None = None
    # input_image
    image_url: str | None = None
    file_id: str | None = None
    detail: str | None = None  # accepted, not acted on


class ReasoningContent(Struct, kw_only=True):
    type: str
    text: str


class InputItem(Struct, kw_only=True):
    """One ``input`` item. Upstream it is a union keyed by ``type``, but easy input messages leave
    ``type`` out, which a tagged union cannot express; so one permissive struct, checked by the
    handler (which names the offending ``input[i]`` field)."""

    type: str = "message"
    # message
    role: str | None = None
    content: str | list[InputContent] | None = None
    # function_call / function_call_output
    id: str | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | list[InputContent] | None = None
    # reasoning
    summary: list[ReasoningContent] | None = None
    encrypted_content: str | None = None
    status: str | None = None


class ResponseTool(Struct, kw_only=True):
    """https://platform.openai.com/docs/api-reference/responses/create#responses-create-tools (function tools)"""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ResponseToolChoiceFunction(Struct, kw_only=True):
    type: str
    name: str | None = None


class ReasoningConfig(Struct, kw_only=True):
    effort: str | None = None
    summary: str | None = None


class TextFormat(Struct, kw_only=True):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None  # json_schema: the schema's name, description, schema and strict
    description: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None


class TextConfig(Struct, kw_only=True):
    format: TextFormat | None = None
    verbosity: str | None = None


class ResponsesRequest(Struct, kw_only=True):
    """https://platform.openai.com/docs/api-reference/responses/create"""

    background: bool | None = None
    include: list[str] | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    metadata: dict[str, str] | None = None
    model: str
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = None
    reasoning: ReasoningConfig | None = None
    store: bool | None = None
    stream: bool | None = None
    temperature: float | None = None
    text: TextConfig | None = None
    tool_choice: Literal["none", "auto", "required"] | ResponseToolChoiceFunction | None = None
    tools: list[ResponseTool] | None = None
    top_logprobs: int | None = None
    top_p: float | None = None
    truncation: str | None = None
    user: str | None = None
    # -- extensions (vLLM's names)
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    structured_outputs: StructuredOutputs | None = None
    max_reasoning_tokens: int | None = None  # ours: the reasoning span's token budget


# -- responses: response and events ------------------------------------------------------------------


class OutputText(Struct, tag_field="type", tag="output_text", kw_only=True):
    annotations: list[Any] = msgspec.field(default_factory=list)
    text: str
    logprobs: list[Any] = msgspec.field(default_factory=list)


class ReasoningText(Struct, tag_field="type", tag="reasoning_text", kw_only=True):
    text: str


class OutputMessage(Struct, tag_field="type", tag="message", kw_only=True):
    """https://platform.openai.com/docs/api-reference/responses/object#responses/object-output"""

    id: str
    content: list[OutputText]
    role: Literal["assistant"] = "assistant"
    status: str


class FunctionToolCall(Struct, tag_field="type", tag="function_call", kw_only=True):
    arguments: str
    call_id: str
    name: str
    id: str
    status: str


class ReasoningItem(Struct, tag_field="type", tag="reasoning", kw_only=True):
    id: str
    summary: list[Any] = msgspec.field(default_factory=list)
    content: list[ReasoningText]
    encrypted_content: str | None = None
    status: str


OutputItem = OutputMessage | FunctionToolCall | ReasoningItem


class InputTokensDetails(Struct, kw_only=True):
    cached_tokens: int = 0


class OutputTokensDetails(Struct, kw_only=True):
    reasoning_tokens: int = 0


class ResponseUsage(Struct, kw_only=True):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(Struct, kw_only=True):
    reason: str


class ResponseErrorInfo(Struct, kw_only=True):
    code: str
    message: str


class Response(Struct, kw_only=True):
    """https://platform.openai.com/docs/api-reference/responses/object"""

    id: str
    created_at: int
    error: ResponseErrorInfo | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    model: str
    object: Literal["response"] = "response"
    output: list[OutputItem] = msgspec.field(default_factory=list)
    parallel_tool_calls: bool = True
    temperature: float | None = None
    tool_choice: Any = "auto"
    tools: list[Any] = msgspec.field(default_factory=list)
    top_p: float | None = None
    background: bool = False
    max_output_tokens: int | None = None
    previous_response_id: str | None = None
    reasoning: ReasoningConfig | None = None
    status: str
    text: TextConfig | None = None
    top_logprobs: int | None = None
    truncation: str = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None
    store: bool = False


# Streaming events (https://platform.openai.com/docs/api-reference/responses-streaming): each is
# sent as ``event: <type>`` plus its JSON, with a sequence_number counting from 0.


class ResponseCreatedEvent(Struct, tag_field="type", tag="response.created", kw_only=True):
    response: Response
    sequence_number: int


class ResponseInProgressEvent(Struct, tag_field="type", tag="response.in_progress", kw_only=True):
    response: Response
    sequence_number: int


class ResponseCompletedEvent(Struct, tag_field="type", tag="response.completed", kw_only=True):
    response: Response
    sequence_number: int


class ResponseIncompleteEvent(Struct, tag_field="type", tag="response.incomplete", kw_only=True):
    response: Response
    sequence_number: int


class ResponseFailedEvent(Struct, tag_field="type", tag="response.failed", kw_only=True):
    response: Response
    sequence_number: int


class OutputItemAddedEvent(Struct, tag_field="type", tag="response.output_item.added", kw_only=True):
    item: OutputItem
    output_index: int
    sequence_number: int


class OutputItemDoneEvent(Struct, tag_field="type", tag="response.output_item.done", kw_only=True):
    item: OutputItem
    output_index: int
    sequence_number: int


class ContentPartAddedEvent(Struct, tag_field="type", tag="response.content_part.added", kw_only=True):
    content_index: int
    item_id: str
    output_index: int
    part: OutputText | ReasoningText
    sequence_number: int


class ContentPartDoneEvent(Struct, tag_field="type", tag="response.content_part.done", kw_only=True):
    content_index: int
    item_id: str
    output_index: int
    part: OutputText | ReasoningText
    sequence_number: int


class OutputTextDeltaEvent(Struct, tag_field="type", tag="response.output_text.delta", kw_only=True):
    content_index: int
    delta: str
    item_id: str
    logprobs: list[Any] = msgspec.field(default_factory=list)
    output_index: int
    sequence_number: int


class OutputTextDoneEvent(Struct, tag_field="type", tag="response.output_text.done", kw_only=True):
    content_index: int
    item_id: str
    logprobs: list[Any] = msgspec.field(default_factory=list)
    output_index: int
    sequence_number: int
    text: str


class ReasoningTextDeltaEvent(Struct, tag_field="type", tag="response.reasoning_text.delta", kw_only=True):
    content_index: int
    delta: str
    item_id: str
    output_index: int
    sequence_number: int


class ReasoningTextDoneEvent(Struct, tag_field="type", tag="response.reasoning_text.done", kw_only=True):
    content_index: int
    item_id: str
    output_index: int
    sequence_number: int
    text: str


class FunctionCallArgumentsDeltaEvent(Struct, tag_field="type", tag="response.function_call_arguments.delta",
                                      kw_only=True):
    delta: str
    item_id: str
    output_index: int
    sequence_number: int


class FunctionCallArgumentsDoneEvent(Struct, tag_field="type", tag="response.function_call_arguments.done",
                                     kw_only=True):
    arguments: str
    item_id: str
    output_index: int
    sequence_number: int
    name: str | UnsetType = UNSET


class ResponseErrorEvent(Struct, tag_field="type", tag="error", kw_only=True):
    code: str | None
    message: str
    param: str | None
    sequence_number: int


ResponseStreamEvent = (ResponseCreatedEvent | ResponseInProgressEvent | ResponseCompletedEvent | ResponseIncompleteEvent
                       | ResponseFailedEvent | OutputItemAddedEvent | OutputItemDoneEvent | ContentPartAddedEvent
                       | ContentPartDoneEvent | OutputTextDeltaEvent | OutputTextDoneEvent | ReasoningTextDeltaEvent
                       | ReasoningTextDoneEvent | FunctionCallArgumentsDeltaEvent | FunctionCallArgumentsDoneEvent
                       | ResponseErrorEvent)


# -- embeddings ---------------------------------------------------------------------------------------


class EmbeddingRequest(Struct, kw_only=True):
    """https://platform.openai.com/docs/api-reference/embeddings/create"""

    input: str | list[str | int | list[int]]  # text, texts, token ids, or lists of token ids
    model: str
    dimensions: int | None = None  # keep the first `dimensions` components (renormalised)
    encoding_format: Literal["float", "base64"] = "float"
    user: str | None = None
    # -- extensions (vLLM)
    add_special_tokens: bool = True


class Embedding(Struct, kw_only=True):
    """https://platform.openai.com/docs/api-reference/embeddings/object"""

    embedding: list[float] | str  # base64: the float32 components, little-endian
    index: int
    object: Literal["embedding"] = "embedding"


class EmbeddingUsage(Struct, kw_only=True):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


# -- LoRA adapters at run time (vLLM's admin routes; no OpenAI counterpart) ----------------------------


class LoadLoRAAdapterRequest(Struct, kw_only=True):
    """vLLM's ``POST /v1/load_lora_adapter`` body; the answer is text/plain."""

    lora_name: str
    lora_path: str  # a PEFT folder on the server: adapter_config.json + adapter_model.safetensors
    # -- extensions
    model: str | None = None  # the base model, when the server has several (or ?model=)


class UnloadLoRAAdapterRequest(Struct, kw_only=True):
    """vLLM's ``POST /v1/unload_lora_adapter`` body; the answer is text/plain."""

    lora_name: str
    lora_int_id: int | None = None  # vLLM's; accepted and not needed (names are unique)
    # -- extensions
    model: str | None = None
