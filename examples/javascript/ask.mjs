// A Node app's question to the company GPU, through `herdless serve`, with openai-node
// and nothing of herdless inside: the gateway does the waiting.
//
//   node ask.mjs EMPLOYEE "QUESTION" [--batch]
//
// HERDLESS_GATEWAY_URL: the gateway's /v1 (default http://127.0.0.1:8080/v1);
// HERDLESS_API_KEY: this app's key, where the gateway asks for one; HERDLESS_MODEL: the
// model (default: the first one the gateway lists).

import OpenAI from "openai";

// openai-node's defaults suit the gateway: 2 retries, each at the Retry-After the gateway
// names (below 60 s, as it always is), and each retry says it is one
// (X-Stainless-Retry-Count): a full queue keeps a retry waiting for its place instead of
// refusing it again. Its timeout (10 minutes) leaves the gateway its hold.
const client = new OpenAI({
  baseURL: process.env.HERDLESS_GATEWAY_URL ?? "http://127.0.0.1:8080/v1",
  apiKey: process.env.HERDLESS_API_KEY ?? "none",
});

const [employee, question, ...flags] = process.argv.slice(2);
if (!employee || !question) {
  console.error('usage: node ask.mjs EMPLOYEE "QUESTION" [--batch]');
  process.exit(2);
}
const model = process.env.HERDLESS_MODEL ?? (await client.models.list()).data[0].id;

try {
  const { data: stream, response } = await client.chat.completions
    .create(
      { model, messages: [{ role: "user", content: question }], max_tokens: 64, stream: true },
      {
        headers: {
          // The employee: the gateway shares the GPU fairly between people, not apps.
          "X-Herdless-User": employee,
          // Batch work waits behind chats; it is never sent to a hosted model.
          "X-Herdless-Priority": flags.includes("--batch") ? "batch" : "interactive",
        },
      },
    )
    .withResponse();
  for await (const chunk of stream) {
    process.stdout.write(chunk.choices[0]?.delta?.content ?? "");
  }
  // Who answered ("upstream": the GPU; "hosted": the gateway's hosted fallback, for a key
  // that may spill) and how long the request waited in the gateway's queue.
  const backend = response.headers.get("x-herdless-backend");
  const waited = response.headers.get("x-herdless-queue-ms") ?? "0";
  console.log(`\n[answered by ${backend} for ${employee}, ${waited} ms in the gateway's queue]`);
} catch (error) {
  if (!(error instanceof OpenAI.APIError)) throw error;
  // What is left after its retries: the gateway's message says when to come back.
  console.error(`[${error.status ?? "no answer"}: ${error.message}]`);
  process.exit(1);
}
