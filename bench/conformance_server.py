"""The MCP conformance suite's fixture server, written here on the MCP Python SDK (``mcp``).

    python bench/conformance_server.py --port N

The suite's server scenarios call tools, prompts and resources by fixed names
(``test_simple_text``, ``test://static-text``, ``test_prompt_with_arguments``…) and expect
fixed answers, as its ``SERVER_REQUIREMENTS.md`` lists them; the suite's npm package ships no
server of its own. This is that server, from the requirements, on the SDK's
``MCPServer`` over streamable HTTP on ``/mcp``, with an event store (streams open with a
priming event and can be resumed), on 127.0.0.1 only: the SDK's own DNS-rebinding
protection stays on (``Host`` and ``Origin`` must be the loopback). It speaks both wires the
suite tests: the 2025-11-25 handshake with sessions and 2026-07-28, stateless. Used by
bench/conformance.py.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
from typing import Annotated, Any

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.prompts.base import Prompt, UserMessage
from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp.shared.exceptions import MCPError
from mcp_types import (
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    AudioContent,
    CallToolResult,
    ClientCapabilities,
    Completion,
    CreateMessageRequest,
    CreateMessageRequestParams,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    EmbeddedResource,
    EmptyResult,
    ImageContent,
    InputRequest,
    InputRequiredResult,
    JSONRPCMessage,
    ListRootsRequest,
    MissingRequiredClientCapabilityErrorData,
    SamplingCapability,
    SamplingMessage,
    SetLevelRequestParams,
    SubscribeRequestParams,
    TextContent,
    TextResourceContents,
    UnsubscribeRequestParams,
)
from pydantic import BaseModel, Field

# A 1x1 PNG and a WAV with two bytes of samples: the smallest answers of their kind.
PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5E"
    "rkJggg=="
)
WAV = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="


class MemoryEventStore(EventStore):
    """Every event kept in memory and replayable after its id."""

    def __init__(self) -> None:
        self.events: list[tuple[EventId, StreamId, JSONRPCMessage | None]] = []

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        event_id = str(len(self.events) + 1)
        self.events.append((event_id, stream_id, message))
        return event_id

    async def replay_events_after(
        self, last_event_id: EventId, send_callback: EventCallback
    ) -> StreamId | None:
        ids = [event_id for event_id, _, _ in self.events]
        if last_event_id not in ids:
            return None
        stream = self.events[ids.index(last_event_id)][1]
        for event_id, stream_id, message in self.events[ids.index(last_event_id) + 1 :]:
            if stream_id == stream and message is not None:
                await send_callback(EventMessage(message, event_id))
        return stream


class UserResponse(BaseModel):
    response: str = Field(description="User's response")


class Defaults(BaseModel):
    """SEP-1034: a default for every primitive type."""

    name: str = Field(default="John Doe", description="User name")
    age: int = Field(default=30, description="User age")
    score: float = Field(default=95.5, description="User score")
    status: str = Field(
        default="active",
        description="User status",
        json_schema_extra={"enum": ["active", "inactive", "pending"]},
    )
    verified: bool = Field(default=True, description="Verification status")


def _titled(options: dict[str, str]) -> list[dict[str, str]]:
    return [{"const": value, "title": title} for value, title in options.items()]


class Enums(BaseModel):
    """SEP-1330: the five ways a schema can offer choices (field names as the suite's)."""

    untitledSingle: str = Field(
        description="Simple enum without titles",
        json_schema_extra={"enum": ["option1", "option2", "option3"]},
    )
    titledSingle: str = Field(
        description="Enum with titled options (oneOf)",
        json_schema_extra={
            "oneOf": _titled({"value1": "First Option", "value2": "Second Option"})
            + _titled({"value3": "Third Option"})
        },
    )
    legacyEnum: str = Field(
        description="Legacy enum with enumNames",
        json_schema_extra={
            "enum": ["opt1", "opt2", "opt3"],
            "enumNames": ["Option One", "Option Two", "Option Three"],
        },
    )
    untitledMulti: list[str] = Field(
        description="Multi-select without titles",
        json_schema_extra={"items": {"type": "string", "enum": ["option1", "option2", "option3"]}},
    )
    titledMulti: list[str] = Field(
        description="Multi-select with titled options",
        json_schema_extra={
            "items": {
                "anyOf": _titled(
                    {"value1": "First Choice", "value2": "Second Choice", "value3": "Third Choice"}
                )
            }
        },
    )


def _outcome(result: Any) -> str:
    content = result.data.model_dump_json() if result.action == "accept" else "{}"
    return f"action={result.action}, content={content}"


def conformance_server() -> MCPServer:
    server = MCPServer("mcp-conformance-test-server", version="1.0.0")
    subscribed: set[str] = set()

    @server.tool(description="Tests simple text content response")
    def test_simple_text() -> str:
        return "This is a simple text response for testing."

    @server.tool(description="Tests image content response")
    def test_image_content() -> list[ImageContent]:
        return [ImageContent(type="image", data=PNG, mime_type="image/png")]

    @server.tool(description="Tests audio content response")
    def test_audio_content() -> list[AudioContent]:
        return [AudioContent(type="audio", data=WAV, mime_type="audio/wav")]

    @server.tool(description="Tests embedded resource content response")
    def test_embedded_resource() -> list[EmbeddedResource]:
        return [
            EmbeddedResource(
                type="resource",
                resource=TextResourceContents(
                    uri="test://embedded-resource",
                    mime_type="text/plain",
                    text="This is an embedded resource content.",
                ),
            )
        ]

    @server.tool(description="Tests response with multiple content types (text, image, resource)")
    def test_multiple_content_types() -> list[TextContent | ImageContent | EmbeddedResource]:
        return [
            TextContent(type="text", text="Multiple content types test:"),
            ImageContent(type="image", data=PNG, mime_type="image/png"),
            EmbeddedResource(
                type="resource",
                resource=TextResourceContents(
                    uri="test://mixed-content-resource",
                    mime_type="application/json",
                    text=json.dumps({"test": "data", "value": 123}, separators=(",", ":")),
                ),
            ),
        ]

    @server.tool(description="Tests tool that emits log messages during execution")
    async def test_tool_with_logging(ctx: Context) -> str:
        await ctx.info("Tool execution started")
        await asyncio.sleep(0.05)
        await ctx.info("Tool processing data")
        await asyncio.sleep(0.05)
        await ctx.info("Tool execution completed")
        return "Tool with logging executed successfully"

    @server.tool(description="Tests tool that reports progress notifications")
    async def test_tool_with_progress(ctx: Context) -> str:
        for step in (0, 50, 100):
            await ctx.report_progress(progress=step, total=100, message=f"Step {step} of 100")
            if step < 100:
                await asyncio.sleep(0.05)
        return "Tool with progress executed successfully"

    @server.tool(description="Tests error response handling")
    def test_error_handling() -> str:
        raise RuntimeError("This tool intentionally returns an error for testing")

    @server.tool(description="Tests server-initiated sampling (LLM completion request)")
    async def test_sampling(prompt: str, ctx: Context) -> str:
        result = await ctx.session.create_message(
            messages=[SamplingMessage(role="user", content=TextContent(type="text", text=prompt))],
            max_tokens=100,
        )
        text = result.content.text if result.content.type == "text" else "No response"
        return f"LLM response: {text}"

    @server.tool(description="Tests server-initiated elicitation (user input request)")
    async def test_elicitation(message: str, ctx: Context) -> str:
        return f"User response: {_outcome(await ctx.elicit(message=message, schema=UserResponse))}"

    @server.tool(description="Tests elicitation with default values for all primitive types")
    async def test_elicitation_sep1034_defaults(ctx: Context) -> str:
        result = await ctx.elicit(message="Please provide user information", schema=Defaults)
        return f"Elicitation result: {_outcome(result)}"

    @server.tool(description="Tests elicitation with enum schema variations (SEP-1330)")
    async def test_elicitation_sep1330_enums(ctx: Context) -> str:
        result = await ctx.elicit(message="Please select values", schema=Enums)
        return f"Elicitation completed: {_outcome(result)}"

    @server.tool(description="Tests SSE polling by closing the stream mid-call (SEP-1699)")
    async def test_reconnection(ctx: Context) -> str:
        await ctx.info("Before disconnect")
        await ctx.close_sse_stream()
        await asyncio.sleep(0.2)
        await ctx.info("After reconnect")
        return "Reconnection test completed"

    @server.resource(
        "test://static-text",
        name="Static Text Resource",
        description="A static text resource for testing",
        mime_type="text/plain",
    )
    def static_text() -> str:
        return "This is the content of the static text resource."

    @server.resource(
        "test://static-binary",
        name="Static Binary Resource",
        description="A static binary resource (image) for testing",
        mime_type="image/png",
    )
    def static_binary() -> bytes:
        return base64.b64decode(PNG)

    @server.resource(
        "test://template/{id}/data",
        name="Resource Template",
        description="A resource template with parameter substitution",
        mime_type="application/json",
    )
    def template(id: str) -> str:
        return json.dumps(
            {"id": id, "templateTest": True, "data": f"Data for ID: {id}"}, separators=(",", ":")
        )

    @server.resource(
        "test://watched-resource",
        name="Watched Resource",
        description="A resource that can be subscribed to",
        mime_type="text/plain",
    )
    def watched() -> str:
        return "Watched resource content"

    @server.prompt(description="A simple prompt without arguments")
    def test_simple_prompt() -> list[UserMessage]:
        return [UserMessage("This is a simple prompt for testing.")]

    @server.prompt(description="A prompt with required arguments")
    def test_prompt_with_arguments(arg1: str, arg2: str) -> list[UserMessage]:
        return [UserMessage(f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'")]

    @server.prompt(description="A prompt that includes an embedded resource")
    def test_prompt_with_embedded_resource(resourceUri: str) -> list[UserMessage]:
        resource = TextResourceContents(
            uri=resourceUri, mime_type="text/plain", text="Embedded resource content for testing."
        )
        return [
            UserMessage(EmbeddedResource(type="resource", resource=resource)),
            UserMessage("Please process the embedded resource above."),
        ]

    @server.prompt(description="A prompt that includes image content")
    def test_prompt_with_image() -> list[UserMessage]:
        return [
            UserMessage(ImageContent(type="image", data=PNG, mime_type="image/png")),
            UserMessage("Please analyze the image above."),
        ]

    @server.completion()
    async def complete(ref: Any, argument: Any, context: Any) -> Completion:
        return Completion(values=[], total=0, has_more=False)

    async def set_level(ctx: Any, params: SetLevelRequestParams) -> EmptyResult:
        return EmptyResult()

    async def subscribe(ctx: Any, params: SubscribeRequestParams) -> EmptyResult:
        subscribed.add(str(params.uri))
        return EmptyResult()

    async def unsubscribe(ctx: Any, params: UnsubscribeRequestParams) -> EmptyResult:
        subscribed.discard(str(params.uri))
        return EmptyResult()

    _input_required_tools(server)
    _stateless_tools(server)
    # MCPServer has no decorator for these three.
    lowlevel = server._lowlevel_server
    lowlevel.add_request_handler("logging/setLevel", SetLevelRequestParams, set_level)
    lowlevel.add_request_handler("resources/subscribe", SubscribeRequestParams, subscribe)
    lowlevel.add_request_handler("resources/unsubscribe", UnsubscribeRequestParams, unsubscribe)
    return server


def _ask_name(message: str = "What is your name?") -> ElicitRequest:
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    return ElicitRequest(params=ElicitRequestFormParams(message=message, requested_schema=schema))


def _ask(field: str, message: str) -> ElicitRequest:
    schema = {"type": "object", "properties": {field: {"type": "string"}}, "required": [field]}
    return ElicitRequest(params=ElicitRequestFormParams(message=message, requested_schema=schema))


def _sample(text: str) -> CreateMessageRequest:
    message = SamplingMessage(role="user", content=TextContent(type="text", text=text))
    return CreateMessageRequest(
        params=CreateMessageRequestParams(messages=[message], max_tokens=100)
    )


def _text(text: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)])


def _needs(requests: dict[str, InputRequest], state: str | None = None) -> InputRequiredResult:
    return InputRequiredResult(input_requests=requests, request_state=state)


def _answered(ctx: Context, *keys: str) -> dict[str, Any] | None:
    """The answers to ``keys`` when the client sent every one of them, else ``None``."""
    responses = ctx.input_responses or {}
    if not all(key in responses for key in keys):
        return None
    return {key: responses[key] for key in keys}


def _accepted(response: Any, field: str) -> str:
    content = getattr(response, "content", None) or {}
    return str(content.get(field, "")) if isinstance(content, dict) else ""


def _input_required_tools(server: MCPServer) -> None:
    """SEP-2322's multi-round-trip tools (2026-07-28): each answers ``input_required`` with
    the requests the suite expects, then completes once the client retries with answers. The
    SDK seals every ``requestState`` and rejects a tampered one before the tool runs."""

    @server.tool(description="One elicitation round, then a greeting")
    async def test_input_required_result_elicitation(
        ctx: Context,
    ) -> CallToolResult | InputRequiredResult:
        answers = _answered(ctx, "user_name")
        if answers is None or not isinstance(answers["user_name"], ElicitResult):
            return _needs({"user_name": _ask_name()})
        return _text(f"Hello, {_accepted(answers['user_name'], 'name')}!")

    @server.tool(description="One sampling round")
    async def test_input_required_result_sampling(
        ctx: Context,
    ) -> CallToolResult | InputRequiredResult:
        answers = _answered(ctx, "capital")
        if answers is None:
            return _needs({"capital": _sample("What is the capital of France?")})
        content = getattr(answers["capital"], "content", None)
        return _text(f"LLM response: {getattr(content, 'text', '')}")

    @server.tool(description="One roots/list round")
    async def test_input_required_result_list_roots(
        ctx: Context,
    ) -> CallToolResult | InputRequiredResult:
        answers = _answered(ctx, "roots")
        if answers is None:
            return _needs({"roots": ListRootsRequest()})
        roots = getattr(answers["roots"], "roots", [])
        return _text(f"Roots: {', '.join(str(root.uri) for root in roots)}")

    @server.tool(description="One round whose requestState the server checks on the retry")
    async def test_input_required_result_request_state(
        ctx: Context,
    ) -> CallToolResult | InputRequiredResult:
        if ctx.request_state != "round-1" or _answered(ctx, "confirm") is None:
            return _needs({"confirm": _ask("ok", "Confirm?")}, "round-1")
        return _text("state-ok")

    @server.tool(description="Elicitation, sampling and roots/list in one round")
    async def test_input_required_result_multiple_inputs(
        ctx: Context,
    ) -> CallToolResult | InputRequiredResult:
        requests: dict[str, InputRequest] = {
            "user_name": _ask_name(),
            "summary": _sample("Summarise the request."),
            "roots": ListRootsRequest(),
        }
        if ctx.request_state != "all-three" or _answered(ctx, *requests) is None:
            return _needs(requests, "all-three")
        return _text("All inputs received")

    @server.tool(description="Two rounds of elicitation, each with its own requestState")
    async def test_input_required_result_multi_round(
        ctx: Context,
    ) -> CallToolResult | InputRequiredResult:
        state = ctx.request_state
        if state is None:
            return _needs({"user_name": _ask_name()}, "round-1")
        if state == "round-1":
            answers = _answered(ctx, "user_name")
            if answers is None:
                return _needs({"user_name": _ask_name()}, "round-1")
            name = _accepted(answers["user_name"], "name")
            return _needs({"color": _ask("color", "Favourite colour?")}, f"round-2:{name}")
        answers = _answered(ctx, "color")
        if answers is None or not state.startswith("round-2:"):
            return _needs({"color": _ask("color", "Favourite colour?")}, state)
        color = _accepted(answers["color"], "color")
        return _text(f"Name: {state.removeprefix('round-2:')}, colour: {color}")

    @server.tool(description="A round whose sealed requestState must come back unaltered")
    async def test_input_required_result_tampered_state(
        ctx: Context,
    ) -> CallToolResult | InputRequiredResult:
        if ctx.request_state != "sealed" or _answered(ctx, "confirm") is None:
            return _needs({"confirm": _ask("ok", "Confirm?")}, "sealed")
        return _text("state-ok")

    @server.tool(description="Asks only for what the client declared it can answer")
    async def test_input_required_result_capabilities(
        ctx: Context,
    ) -> CallToolResult | InputRequiredResult:
        capabilities = ctx.client_capabilities
        requests: dict[str, InputRequest] = {}
        if capabilities is not None and capabilities.sampling is not None:
            requests["summary"] = _sample("Summarise the request.")
        if capabilities is not None and capabilities.elicitation is not None:
            requests["user_name"] = _ask_name()
        if capabilities is not None and capabilities.roots is not None:
            requests["roots"] = ListRootsRequest()
        if not requests or _answered(ctx, *requests) is not None:
            return _text("Done")
        return _needs(requests)

    @server.prompt(description="A prompt that needs one elicitation round")
    async def test_input_required_result_prompt(
        ctx: Context,
    ) -> list[UserMessage] | InputRequiredResult:
        answers = _answered(ctx, "user_context")
        if answers is None:
            return _needs({"user_context": _ask("context", "What context should the prompt use?")})
        return [UserMessage(f"Context: {_accepted(answers['user_context'], 'context')}")]


# SEP-2106's schema, as the suite's json-schema-2020-12 scenario compares it.
SCHEMA_2020_12: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "$anchor": "addressDef",
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {
        "name": {"type": "string"},
        "address": {"$ref": "#/$defs/address"},
        "contactMethod": {"type": "string", "enum": ["phone", "email"]},
        "phone": {"type": "string"},
        "email": {"type": "string"},
    },
    "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
    "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
    "then": {"required": ["phone"]},
    "else": {"required": ["email"]},
    "additionalProperties": False,
}


def _stateless_tools(server: MCPServer) -> None:
    """The tools the 2026-07-28 scenarios look for besides the multi-round ones."""

    @server.tool(description="Needs the client's sampling capability")
    async def test_missing_capability(ctx: Context) -> str:
        capabilities = ctx.client_capabilities
        if capabilities is None or capabilities.sampling is None:
            required = ClientCapabilities(sampling=SamplingCapability())
            data = MissingRequiredClientCapabilityErrorData(required_capabilities=required)
            raise MCPError(
                code=MISSING_REQUIRED_CLIENT_CAPABILITY,
                message="This tool needs the client's sampling capability",
                data=data.model_dump(by_alias=True, mode="json", exclude_none=True),
            )
        return "sampling declared"

    @server.tool(
        name="json_schema_2020_12_tool", description="Tool with JSON Schema 2020-12 features"
    )
    def json_schema_tool() -> str:
        return "ok"

    # Listed with the suite's schema as it is, not one derived from the signature.
    tool = server._tool_manager.get_tool("json_schema_2020_12_tool")
    assert tool is not None
    tool.parameters = SCHEMA_2020_12

    changes = {"tools": 0, "prompts": 0}

    @server.tool(description="Adds a tool and notifies tools/list_changed")
    async def test_trigger_tool_change(ctx: Context) -> str:
        changes["tools"] += 1
        name = f"test_added_tool_{changes['tools']}"
        server.add_tool(lambda: "added", name=name, description="A tool added at run time")
        await ctx.notify_tools_changed()
        return "tool list changed"

    @server.tool(description="Adds a prompt and notifies prompts/list_changed")
    async def test_trigger_prompt_change(ctx: Context) -> str:
        changes["prompts"] += 1
        name = f"test_added_prompt_{changes['prompts']}"
        description = "A prompt added at run time"
        server.add_prompt(Prompt.from_function(lambda: "added", name=name, description=description))
        await ctx.notify_prompts_changed()
        return "prompt list changed"

    @server.tool(description="Mirrors its region argument into an Mcp-Param-Region header")
    def test_headers(
        region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})],
        query: str = "",
    ) -> str:
        return f"region={region}"


def app() -> Any:
    return conformance_server().streamable_http_app(
        event_store=MemoryEventStore(), retry_interval=100, host="127.0.0.1"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(app(), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
