// The TypeScript MCP SDK's client as bench/agents.py drives it: one task a line.
//
//     node bench/ts_client.mjs SDK_DIR     (SDK_DIR: the installed @modelcontextprotocol/sdk)
//
// Each line on stdin is a task, {"url", "task", "calls": [{"tool", "arguments"}]}; for each,
// a fresh `Client` over `StreamableHTTPClientTransport` with every default kept (its 60 s
// request timeout, its reconnection options) but the header that names the task for the
// tap: connect (initialize, notifications/initialized), tools/list once, as a host learns
// its tools, the task's calls in order, then DELETE (terminateSession) and close. A call
// that throws is the task's answer for that call ("error: …"), and the next call is still
// made, as an agent's loop goes on after a failed tool call. One line back per task:
// {"task", "outputs", "error", "seconds"}; "error" is set when the session could not be
// opened or the task stopped early.

import { pathToFileURL } from "node:url";
import { join } from "node:path";
import { createInterface } from "node:readline";

const sdk = process.argv[2];
const load = (path) => import(pathToFileURL(join(sdk, "dist", "esm", path)).href);
const { Client } = await load("client/index.js");
const { StreamableHTTPClientTransport } = await load("client/streamableHttp.js");

function describe(error) {
  const code = error?.code !== undefined ? ` ${error.code}` : "";
  const name = `${error?.constructor?.name ?? "Error"}${code}`;
  const cause = error?.cause ? ` (cause: ${error.cause.code ?? error.cause.message ?? error.cause})` : "";
  return `${name}: ${error?.message ?? String(error)}${cause}`.slice(0, 300);
}

function text(result) {
  const parts = (result?.content ?? []).filter((part) => part.type === "text");
  const joined = parts.map((part) => part.text).join("\n");
  return result?.isError ? `error (isError): ${joined}` : joined;
}

async function runTask(task) {
  const started = performance.now();
  const outputs = [];
  let error = "";
  const transport = new StreamableHTTPClientTransport(new URL(task.url), {
    requestInit: { headers: { "x-bench-task": String(task.task) } },
  });
  const client = new Client({ name: "bench-ts-sdk", version: "1.0.0" });
  try {
    await client.connect(transport);
    await client.listTools();
    for (const call of task.calls) {
      try {
        outputs.push(text(await client.callTool({ name: call.tool, arguments: call.arguments })));
      } catch (failure) {
        outputs.push(`error: ${describe(failure)}`);
      }
    }
    try {
      await transport.terminateSession();
    } catch {
      // the session's end is not the task's answer
    }
  } catch (failure) {
    error = describe(failure);
  } finally {
    await client.close().catch(() => {});
  }
  return { task: task.task, outputs, error, seconds: (performance.now() - started) / 1000 };
}

// A transport's errors also reach `onerror`; unhandled ones must not end the process.
process.on("unhandledRejection", () => {});

for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue;
  const answer = await runTask(JSON.parse(line));
  process.stdout.write(`${JSON.stringify(answer)}\n`);
}
