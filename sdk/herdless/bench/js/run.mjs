// Runs chat completions through a real JavaScript OpenAI client, each with its defaults,
// messages through Anthropic's (Claude Code's client: the Messages API), or responses
// on OpenAI's Responses API (what OpenAI's Agents SDK and Codex speak) through openai-node
// or the Vercel AI SDK's OpenAI provider (whose default model speaks it).
//
// Reads one JSON scenario on stdin:
//   {client: "openai" | "vercel" | "langchain" | "single" | "anthropic" | "responses"
//    | "vercel-responses", base_url, api_key, model,
//    calls, turns, concurrency, max_tokens (a number, or [low, high] spread over the calls),
//    stream, usage (a stream asks for its usage; default true), start_spacing_ms,
//    start_at, headers, timeout_s, prompt}
// and prints one JSON line per call as it ends, then one summary line ({summary: true}).
//
// Every client keeps its own retry rules; only its fetch is wrapped, to count the HTTP
// requests it makes (attempts) and keep each one's status and the final one's headers.
// `single` is one plain fetch POST and no retry, as Open WebUI's backend sends it.
// Every call is bounded by timeout_s (an abort, then a race as a backstop), so the
// process always ends.

import { readFileSync } from "node:fs";

import Anthropic from "@anthropic-ai/sdk";
import { createOpenAI } from "@ai-sdk/openai";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { ChatOpenAI } from "@langchain/openai";
import { generateText, streamText } from "ai";
import OpenAI from "openai";

const KEPT_HEADERS = [
  "x-herdless-backend",
  "x-herdless-fallback-reason",
  "retry-after",
  "retry-after-ms",
  "x-should-retry",
];

const scenario = {
  calls: 1,
  turns: 1,
  concurrency: 1,
  max_tokens: 32,
  stream: false,
  usage: true,
  start_spacing_ms: 0,
  headers: {},
  timeout_s: 180,
  prompt: "Tell me about the weather in one paragraph.",
  ...JSON.parse(readFileSync(0, "utf8")),
};
const baseURL = scenario.base_url.replace(/\/+$/, "") + "/v1";

const now = () => performance.now() / 1000;

function maxTokensOf(index) {
  const spec = scenario.max_tokens;
  if (!Array.isArray(spec)) return spec;
  const [low, high] = spec;
  // Spread over the range in a fixed order, the same in every run (no randomness).
  return low + ((index * 7919) % (high - low + 1));
}

// A fetch that records every request the client makes for one call.
function recordingFetch(record) {
  return async (input, init) => {
    record.attempts += 1;
    let response;
    try {
      response = await fetch(input, init);
    } catch (error) {
      record.statuses.push(0); // no answer: connection refused, reset or aborted
      throw error;
    }
    record.statuses.push(response.status);
    record.headersAt = now();
    record.headers = Object.fromEntries(
      KEPT_HEADERS.filter((name) => response.headers.has(name)).map((name) => [
        name,
        response.headers.get(name),
      ]),
    );
    return response;
  };
}

// Each call asks its own question (the prompt, numbered), as employees' requests differ:
// the gateway knows a refused request sent again, and takes that for a retry.
function messages(record) {
  return [{ role: "user", content: `${scenario.prompt} (${record.index + 1})` }];
}

// Usage named input_tokens and output_tokens (Anthropic's, the Responses API's, LangChain's
// usage_metadata) in the OpenAI names.
function usageOf(u) {
  return u ? { prompt_tokens: u.input_tokens ?? null, completion_tokens: u.output_tokens ?? null } : null;
}

// Each runner takes (record, maxTokens, signal), returns {model, usage} (usage in the
// OpenAI names, or null), and calls record.chunk() for every piece of text a stream yields.

// openai-node as an app makes it: the gateway's /v1, the scenario's key and headers.
function openAI(record) {
  return new OpenAI({
    baseURL,
    apiKey: scenario.api_key,
    fetch: recordingFetch(record),
    defaultHeaders: scenario.headers,
  });
}

async function runOpenAI(record, maxTokens, signal) {
  const client = openAI(record);
  const request = { model: scenario.model, messages: messages(record), max_tokens: maxTokens };
  if (!scenario.stream) {
    const answer = await client.chat.completions.create(request, { signal });
    return { model: answer.model, usage: answer.usage ?? null };
  }
  const streamed = { ...request, stream: true };
  if (scenario.usage) streamed.stream_options = { include_usage: true };
  const stream = await client.chat.completions.create(streamed, { signal });
  let model = null;
  let usage = null;
  for await (const chunk of stream) {
    model = chunk.model ?? model;
    if (chunk.usage) usage = chunk.usage;
    if (chunk.choices?.[0]?.delta?.content) record.chunk();
  }
  return { model, usage };
}

async function runVercel(record, maxTokens, signal) {
  const provider = createOpenAICompatible({
    name: "herdless",
    baseURL,
    apiKey: scenario.api_key,
    headers: scenario.headers,
    includeUsage: scenario.usage,
    fetch: recordingFetch(record),
  });
  return runAiSdk(record, provider.chatModel(scenario.model), maxTokens, signal);
}

// The AI SDK's OpenAI provider: its default model (provider(id)) is the Responses API.
async function runVercelResponses(record, maxTokens, signal) {
  const provider = createOpenAI({
    baseURL,
    apiKey: scenario.api_key,
    headers: scenario.headers,
    fetch: recordingFetch(record),
  });
  return runAiSdk(record, provider(scenario.model), maxTokens, signal);
}

// A conversation of scenario.turns requests: each next turn sends the earlier ones and the
// answers as the SDK gives them back (response.messages), as a chat app's useChat does.
async function runAiSdk(record, model, maxTokens, signal) {
  const conversation = messages(record);
  let answer;
  for (let turn = 1; turn <= scenario.turns; turn++) {
    if (turn > 1) conversation.push({ role: "user", content: `Go on. (${turn})` });
    answer = await aiSdkTurn(record, { model, messages: conversation, maxOutputTokens: maxTokens, abortSignal: signal });
    conversation.push(...answer.messages);
  }
  return { model: answer.model, usage: answer.usage };
}

async function aiSdkTurn(record, options) {
  const tokens = (u) =>
    u ? { prompt_tokens: u.inputTokens ?? null, completion_tokens: u.outputTokens ?? null } : null;
  if (!scenario.stream) {
    const answer = await generateText(options);
    const { modelId, messages } = answer.response;
    return { model: modelId ?? null, usage: tokens(answer.usage), messages };
  }
  // streamText does not throw: its errors arrive as parts of the stream.
  const result = streamText({ ...options, onError: () => {} });
  let usage = null;
  let model = null;
  for await (const part of result.fullStream) {
    if (part.type === "text-delta" && part.text) record.chunk();
    else if (part.type === "error") throw part.error;
    else if (part.type === "finish-step") model = part.response?.modelId ?? model;
    else if (part.type === "finish") usage = tokens(part.totalUsage);
  }
  return { model, usage, messages: (await result.response).messages };
}

async function runLangChain(record, maxTokens, signal) {
  const chat = new ChatOpenAI({
    model: scenario.model,
    apiKey: scenario.api_key,
    maxTokens,
    streaming: scenario.stream,
    streamUsage: scenario.usage,
    configuration: { baseURL, fetch: recordingFetch(record), defaultHeaders: scenario.headers },
  });
  if (!scenario.stream) {
    const answer = await chat.invoke(messages(record), { signal });
    return { model: answer.response_metadata?.model_name ?? null, usage: usageOf(answer.usage_metadata) };
  }
  let model = null;
  let usage = null;
  for await (const chunk of await chat.stream(messages(record), { signal })) {
    model = chunk.response_metadata?.model_name ?? model;
    if (chunk.usage_metadata) usage = usageOf(chunk.usage_metadata);
    if (typeof chunk.content === "string" && chunk.content) record.chunk();
  }
  return { model, usage };
}

// One create() of an SDK's API (Anthropic's Messages, openai-node's Responses): unstreamed,
// the answer's model and usage; streamed, each event given to read(event, seen), which
// notes the model and the usage in seen and calls record.chunk() for each piece of text.
async function created(api, request, signal, read) {
  if (!scenario.stream) {
    const answer = await api.create(request, { signal });
    return { model: answer.model, usage: usageOf(answer.usage) };
  }
  const seen = { model: null, usage: null };
  for await (const event of await api.create({ ...request, stream: true }, { signal })) {
    read(event, seen);
  }
  return seen;
}

// Anthropic's SDK on the Messages API: the key as its apiKey, sent as x-api-key (what
// Claude Code sends for ANTHROPIC_API_KEY); a stream always carries its usage.
async function runAnthropic(record, maxTokens, signal) {
  const client = new Anthropic({
    baseURL: scenario.base_url.replace(/\/+$/, ""), // it adds /v1/messages
    apiKey: scenario.api_key,
    authToken: null,
    fetch: recordingFetch(record),
    defaultHeaders: scenario.headers,
  });
  const request = { model: scenario.model, messages: messages(record), max_tokens: maxTokens };
  return created(client.messages, request, signal, (event, seen) => {
    if (event.type === "message_start") seen.model = event.message.model;
    else if (event.type === "message_delta") seen.usage = usageOf(event.usage);
    else if (event.type === "content_block_delta" && event.delta.text) record.chunk();
  });
}

// openai-node on the Responses API: the prompt as its input, max_output_tokens for the
// cap; a stream always ends with the whole response, its usage included.
async function runResponses(record, maxTokens, signal) {
  const client = openAI(record);
  const input = messages(record)[0].content;
  const request = { model: scenario.model, input, max_output_tokens: maxTokens };
  return created(client.responses, request, signal, (event, seen) => {
    if (event.type === "response.output_text.delta" && event.delta) record.chunk();
    else if (event.type === "response.completed" || event.type === "response.incomplete") {
      seen.model = event.response.model;
      seen.usage = usageOf(event.response.usage);
    } else if (event.type === "error" || event.type === "response.failed") {
      throw new Error(`stream error: ${JSON.stringify(event)}`);
    }
  });
}

// One plain POST, no retry: what a chat front-end's backend does.
async function runSingle(record, maxTokens, signal) {
  const body = { model: scenario.model, messages: messages(record), max_tokens: maxTokens };
  if (scenario.stream) Object.assign(body, { stream: true });
  if (scenario.stream && scenario.usage) body.stream_options = { include_usage: true };
  const response = await recordingFetch(record)(`${baseURL}/chat/completions`, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      authorization: `Bearer ${scenario.api_key}`,
      ...scenario.headers,
    },
    body: JSON.stringify(body),
    signal,
  });
  if (!response.ok) {
    const error = new Error(`${response.status} ${(await response.text()).slice(0, 300)}`);
    error.status = response.status;
    throw error;
  }
  if (!scenario.stream) {
    const answer = await response.json();
    return { model: answer.model ?? null, usage: answer.usage ?? null };
  }
  let model = null;
  let usage = null;
  let buffer = "";
  const decoder = new TextDecoder();
  for await (const bytes of response.body) {
    buffer += decoder.decode(bytes, { stream: true });
    const lines = buffer.split("\n");
    buffer = lines.pop();
    for (const line of lines) {
      const data = line.startsWith("data:") ? line.slice(5).trim() : "";
      if (!data || data === "[DONE]") continue;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(`stream error: ${JSON.stringify(chunk.error)}`);
      model = chunk.model ?? model;
      if (chunk.usage) usage = chunk.usage;
      if (chunk.choices?.[0]?.delta?.content) record.chunk();
    }
  }
  return { model, usage };
}

const RUNNERS = {
  openai: runOpenAI,
  vercel: runVercel,
  langchain: runLangChain,
  single: runSingle,
  anthropic: runAnthropic,
  responses: runResponses,
  "vercel-responses": runVercelResponses,
};

const CONVERSING = new Set(["vercel", "vercel-responses"]);

// The status an error carries: openai-node, Anthropic's and LangChain (status), Vercel (statusCode,
// or its RetryError's last error), else the last answer's.
function statusOf(error, record) {
  for (const e of [error, error?.lastError, error?.cause]) {
    if (typeof e?.status === "number") return e.status;
    if (typeof e?.statusCode === "number") return e.statusCode;
  }
  return record.statuses.at(-1) ?? 0;
}

async function runCall(index) {
  const runner = RUNNERS[scenario.client];
  const record = { index, attempts: 0, statuses: [], headers: {}, headersAt: null, chunks: 0, firstChunkAt: null };
  const started = now();
  record.chunk = () => {
    record.chunks += 1;
    record.firstChunkAt ??= now();
  };
  const controller = new AbortController();
  const timeoutMs = scenario.timeout_s * 1000;
  let timer;
  const expired = new Promise((_, reject) => {
    timer = setTimeout(() => {
      controller.abort(new Error(`timed out after ${scenario.timeout_s} s`));
      // The backstop: a client that does not end on its abort still ends the call.
      setTimeout(() => reject(new Error(`timed out after ${scenario.timeout_s} s`)), 1000);
    }, timeoutMs);
  });
  const line = { index, client: scenario.client, ok: false, status: 0, error: null };
  try {
    const { model, usage } = await Promise.race([
      runner(record, maxTokensOf(index), controller.signal),
      expired,
    ]);
    const tokens = usage && { prompt_tokens: usage.prompt_tokens, completion_tokens: usage.completion_tokens };
    Object.assign(line, { ok: true, status: record.statuses.at(-1) ?? 0, model, usage: tokens });
  } catch (error) {
    const message = error?.message ?? String(error);
    Object.assign(line, { status: statusOf(error, record), model: null, usage: null, error: message });
  } finally {
    clearTimeout(timer);
  }
  const firstByte = scenario.stream ? record.firstChunkAt : record.headersAt;
  return {
    ...line,
    attempts: record.attempts,
    statuses: record.statuses,
    first_byte_s: line.ok && firstByte != null ? firstByte - started : null,
    total_s: now() - started,
    chunks: record.chunks,
    headers: record.headers,
  };
}

function quantile(values, q) {
  if (values.length === 0) return null;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)];
}

async function main() {
  if (!RUNNERS[scenario.client]) throw new Error(`unknown client ${JSON.stringify(scenario.client)}`);
  if (scenario.turns > 1 && !CONVERSING.has(scenario.client)) {
    throw new Error(`turns > 1: only ${[...CONVERSING].join(" and ")} hold a conversation here`);
  }
  // start_at (epoch seconds): runs in separate processes start their first calls together.
  if (scenario.start_at != null) {
    const wait = scenario.start_at * 1000 - Date.now();
    if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
  }
  const t0 = now();
  const results = [];
  let next = 0;
  async function worker() {
    while (next < scenario.calls) {
      const index = next++;
      const startAt = t0 + (index * scenario.start_spacing_ms) / 1000;
      const wait = startAt - now();
      if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait * 1000));
      const result = await runCall(index);
      results.push(result);
      process.stdout.write(JSON.stringify(result) + "\n");
    }
  }
  const workers = Math.max(1, Math.min(scenario.concurrency, scenario.calls));
  await Promise.all(Array.from({ length: workers }, worker));
  const statuses = {};
  for (const r of results) for (const s of r.statuses) statuses[s] = (statuses[s] ?? 0) + 1;
  const times = results.filter((r) => r.ok).map((r) => r.total_s);
  const summary = {
    summary: true,
    client: scenario.client,
    calls: results.length,
    ok: results.filter((r) => r.ok).length,
    errors: results.filter((r) => !r.ok).length,
    attempts: results.reduce((n, r) => n + r.attempts, 0),
    statuses,
    p50_s: quantile(times, 0.5),
    p95_s: quantile(times, 0.95),
    wall_s: now() - t0,
  };
  process.stdout.write(JSON.stringify(summary) + "\n");
}

main().then(
  // Exit once stdout is flushed: a lingering keep-alive socket must not hold the process.
  () => process.stdout.write("", () => process.exit(0)),
  (error) => {
    process.stderr.write(`run.mjs: ${error?.stack ?? error}\n`);
    process.exit(2);
  },
);
