// The MCP conformance suite's fixture server on the TypeScript SDK (@modelcontextprotocol/sdk),
// for bench/conformance.py, which copies this file beside the SDK it installs in bench/.cache/
// and runs it with PORT set: `node conformance_server.mjs`.
//
// The tools, resources and prompts the suite's server scenarios call by name, as its
// SERVER_REQUIREMENTS.md gives them (the handshake wire, 2025-11-25, with sessions and an
// event store), served as the SDK's own examples serve: createMcpExpressApp on 127.0.0.1,
// whose DNS-rebinding protection checks the Host header alone (bench/conformance_server.py's
// Python SDK checks Host and Origin).

import { randomUUID } from "node:crypto";
import * as z from "zod/v4";
import { createMcpExpressApp } from "@modelcontextprotocol/sdk/server/express.js";
import { McpServer, ResourceTemplate } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { isInitializeRequest } from "@modelcontextprotocol/sdk/types.js";
import { InMemoryEventStore } from "@modelcontextprotocol/sdk/examples/shared/inMemoryEventStore.js";

const PNG =
  "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
const WAV = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA=";
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const text = (value) => ({ content: [{ type: "text", text: value }] });

function fixture() {
  const server = new McpServer(
    { name: "mcp-conformance-test-server", version: "1.0.0" },
    {
      capabilities: {
        tools: { listChanged: true },
        resources: { subscribe: true, listChanged: true },
        prompts: { listChanged: true },
        logging: {},
        completions: {},
      },
    },
  );
  const log = (extra, data) =>
    server.server
      .sendLoggingMessage({ level: "info", logger: "conformance", data }, extra.sessionId)
      .catch(() => {});

  server.registerTool("test_simple_text", { description: "Simple text" }, async () =>
    text("This is a simple text response for testing."),
  );
  server.registerTool("test_image_content", { description: "Image content" }, async () => ({
    content: [{ type: "image", data: PNG, mimeType: "image/png" }],
  }));
  server.registerTool("test_audio_content", { description: "Audio content" }, async () => ({
    content: [{ type: "audio", data: WAV, mimeType: "audio/wav" }],
  }));
  server.registerTool("test_embedded_resource", { description: "Embedded resource" }, async () => ({
    content: [
      {
        type: "resource",
        resource: {
          uri: "test://embedded-resource",
          mimeType: "text/plain",
          text: "This is an embedded resource content.",
        },
      },
    ],
  }));
  server.registerTool("test_multiple_content_types", { description: "Mixed content" }, async () => ({
    content: [
      { type: "text", text: "Multiple content types test:" },
      { type: "image", data: PNG, mimeType: "image/png" },
      {
        type: "resource",
        resource: {
          uri: "test://mixed-content-resource",
          mimeType: "application/json",
          text: JSON.stringify({ test: "data", value: 123 }),
        },
      },
    ],
  }));
  server.registerTool("test_tool_with_logging", { description: "Logs thrice" }, async (extra) => {
    await log(extra, "Tool execution started");
    await sleep(50);
    await log(extra, "Tool processing data");
    await sleep(50);
    await log(extra, "Tool execution completed");
    return text("Tool with logging executed successfully");
  });
  server.registerTool("test_tool_with_progress", { description: "Reports progress" }, async (extra) => {
    const token = extra._meta?.progressToken;
    for (const progress of [0, 50, 100]) {
      if (token !== undefined) {
        await extra.sendNotification({
          method: "notifications/progress",
          params: { progressToken: token, progress, total: 100, message: `Step ${progress}` },
        });
      }
      if (progress < 100) await sleep(50);
    }
    return text(String(token ?? "no progress token"));
  });
  server.registerTool("test_error_handling", { description: "Always fails" }, async () => {
    throw new Error("This tool intentionally returns an error for testing");
  });
  server.registerTool(
    "test_sampling",
    { description: "Samples the client's model", inputSchema: { prompt: z.string() } },
    async ({ prompt }) => {
      const result = await server.server.createMessage({
        messages: [{ role: "user", content: { type: "text", text: prompt } }],
        maxTokens: 100,
      });
      return text(`LLM response: ${result.content.type === "text" ? result.content.text : ""}`);
    },
  );
  server.registerTool(
    "test_elicitation",
    { description: "Asks the user", inputSchema: { message: z.string() } },
    async ({ message }) => {
      const result = await server.server.elicitInput({
        message,
        requestedSchema: {
          type: "object",
          properties: { response: { type: "string", description: "User's response" } },
          required: ["response"],
        },
      });
      return text(`User response: action=${result.action}, content=${JSON.stringify(result.content ?? {})}`);
    },
  );
  server.registerTool("test_elicitation_sep1034_defaults", { description: "SEP-1034" }, async () => {
    const result = await server.server.elicitInput({
      message: "Please provide user information",
      requestedSchema: {
        type: "object",
        properties: {
          name: { type: "string", default: "John Doe" },
          age: { type: "integer", default: 30 },
          score: { type: "number", default: 95.5 },
          status: { type: "string", enum: ["active", "inactive", "pending"], default: "active" },
          verified: { type: "boolean", default: true },
        },
      },
    });
    return text(`Elicitation result: action=${result.action}`);
  });
  server.registerTool("test_elicitation_sep1330_enums", { description: "SEP-1330" }, async () => {
    const titled = (options) => options.map(([value, title]) => ({ const: value, title }));
    const result = await server.server.elicitInput({
      message: "Please select values",
      requestedSchema: {
        type: "object",
        properties: {
          untitledSingle: { type: "string", enum: ["option1", "option2", "option3"] },
          titledSingle: {
            type: "string",
            oneOf: titled([["value1", "First"], ["value2", "Second"], ["value3", "Third"]]),
          },
          legacyEnum: {
            type: "string",
            enum: ["opt1", "opt2", "opt3"],
            enumNames: ["Option One", "Option Two", "Option Three"],
          },
          untitledMulti: {
            type: "array",
            items: { type: "string", enum: ["option1", "option2", "option3"] },
          },
          titledMulti: {
            type: "array",
            items: { anyOf: titled([["value1", "First"], ["value2", "Second"], ["value3", "Third"]]) },
          },
        },
      },
    });
    return text(`Elicitation completed: action=${result.action}`);
  });
  server.registerTool("test_reconnection", { description: "Closes its stream mid-call" }, async (extra) => {
    await log(extra, "Before disconnect");
    extra.closeSSEStream?.();
    await sleep(200);
    await log(extra, "After reconnect");
    return text("Reconnection test completed");
  });

  const resource = (name, uri, description, mimeType, read) =>
    server.registerResource(name, uri, { description, mimeType }, async (url) => ({
      contents: [{ uri: url.href, mimeType, ...read() }],
    }));
  resource("Static Text Resource", "test://static-text", "A static text resource", "text/plain", () => ({
    text: "This is the content of the static text resource.",
  }));
  resource("Static Binary Resource", "test://static-binary", "A static image", "image/png", () => ({
    blob: PNG,
  }));
  resource("Watched Resource", "test://watched-resource", "A subscribable resource", "text/plain", () => ({
    text: "Watched resource content",
  }));
  server.registerResource(
    "Resource Template",
    new ResourceTemplate("test://template/{id}/data", { list: undefined }),
    { description: "A resource template with parameter substitution", mimeType: "application/json" },
    async (url, { id }) => ({
      contents: [
        {
          uri: url.href,
          mimeType: "application/json",
          text: JSON.stringify({ id, templateTest: true, data: `Data for ID: ${id}` }),
        },
      ],
    }),
  );

  const user = (content) => ({ role: "user", content });
  server.registerPrompt("test_simple_prompt", { description: "A simple prompt" }, async () => ({
    messages: [user({ type: "text", text: "This is a simple prompt for testing." })],
  }));
  server.registerPrompt(
    "test_prompt_with_arguments",
    {
      description: "A prompt with required arguments",
      argsSchema: { arg1: z.string().describe("First test argument"), arg2: z.string().describe("Second test argument") },
    },
    async ({ arg1, arg2 }) => ({
      messages: [user({ type: "text", text: `Prompt with arguments: arg1='${arg1}', arg2='${arg2}'` })],
    }),
  );
  server.registerPrompt(
    "test_prompt_with_embedded_resource",
    { description: "A prompt with an embedded resource", argsSchema: { resourceUri: z.string() } },
    async ({ resourceUri }) => ({
      messages: [
        user({
          type: "resource",
          resource: { uri: resourceUri, mimeType: "text/plain", text: "Embedded resource content for testing." },
        }),
        user({ type: "text", text: "Please process the embedded resource above." }),
      ],
    }),
  );
  server.registerPrompt("test_prompt_with_image", { description: "A prompt with an image" }, async () => ({
    messages: [
      user({ type: "image", data: PNG, mimeType: "image/png" }),
      user({ type: "text", text: "Please analyze the image above." }),
    ],
  }));

  const low = server.server;
  const schemas = import("@modelcontextprotocol/sdk/types.js");
  return schemas.then((types) => {
    low.setRequestHandler(types.SetLevelRequestSchema, async () => ({}));
    low.setRequestHandler(types.SubscribeRequestSchema, async () => ({}));
    low.setRequestHandler(types.UnsubscribeRequestSchema, async () => ({}));
    low.setRequestHandler(types.CompleteRequestSchema, async () => ({
      completion: { values: [], total: 0, hasMore: false },
    }));
    return server;
  });
}

const app = createMcpExpressApp({ host: "127.0.0.1" });
const sessions = new Map();
const refuse = (res, status, code, message) =>
  res.status(status).json({ jsonrpc: "2.0", error: { code, message }, id: null });

app.post("/mcp", async (req, res) => {
  const id = req.headers["mcp-session-id"];
  const known = id ? sessions.get(id) : undefined;
  if (known) return known.handleRequest(req, res, req.body);
  if (id) return refuse(res, 404, -32001, "Session not found");
  if (!isInitializeRequest(req.body)) return refuse(res, 400, -32000, "Bad Request: No valid session ID provided");
  const transport = new StreamableHTTPServerTransport({
    sessionIdGenerator: () => randomUUID(),
    eventStore: new InMemoryEventStore(),
    retryInterval: 100,
    onsessioninitialized: (sessionId) => sessions.set(sessionId, transport),
  });
  transport.onclose = () => transport.sessionId && sessions.delete(transport.sessionId);
  await (await fixture()).connect(transport);
  await transport.handleRequest(req, res, req.body);
});
const bySession = async (req, res) => {
  const transport = sessions.get(req.headers["mcp-session-id"]);
  if (!transport) return refuse(res, 400, -32000, "Invalid or missing session ID");
  await transport.handleRequest(req, res);
};
app.get("/mcp", bySession);
app.delete("/mcp", bySession);
app.listen(Number(process.env.PORT), "127.0.0.1");
