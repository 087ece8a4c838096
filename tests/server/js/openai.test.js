// markbase serve through the official openai client. The server's address and key come from the
// environment: MARKBASE_URL (http://127.0.0.1:PORT) and MARKBASE_API_KEY (the key it was started with).
// Whatever the model, these hold: greedy replies are deterministic, so the streamed text equals the
// non-streamed one and a stop string taken from a reply cuts the same reply where it first occurs.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const url = process.env.MARKBASE_URL;
const key = process.env.MARKBASE_API_KEY;
if (!url || !key) throw new Error('set MARKBASE_URL and MARKBASE_API_KEY to the server under test');
const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: key, maxRetries: 0, timeout: 120_000 });

let model;
async function modelId() {
  model ??= (await client.models.list()).data[0].id;
  return model;
}

function checkUsage(usage) {
  assert.ok(Number.isInteger(usage.prompt_tokens) && usage.prompt_tokens > 0);
  assert.ok(Number.isInteger(usage.completion_tokens) && usage.completion_tokens >= 0);
  assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens);
}

const messages = [
  { role: 'system', content: 'Answer briefly.' },
  { role: 'user', content: [{ type: 'text', text: 'Tell me a story.' }] },
];

test('models.list names the served model', async () => {
  const page = await client.models.list();
  assert.equal(page.data.length, 1);
  assert.equal(page.data[0].object, 'model');
  assert.ok(page.data[0].id.length > 0);
});

test('chat: non-streaming and streaming give the same greedy reply', async () => {
  const request = { model: await modelId(), messages, max_tokens: 12, temperature: 0 };
  const done = await client.chat.completions.create(request);
  assert.match(done.id, /^chatcmpl-/);
  assert.equal(done.object, 'chat.completion');
  assert.equal(done.choices.length, 1);
  const choice = done.choices[0];
  assert.equal(choice.message.role, 'assistant');
  assert.equal(typeof choice.message.content, 'string');
  assert.ok(['stop', 'length'].includes(choice.finish_reason));
  checkUsage(done.usage);
  assert.ok(done.usage.completion_tokens <= 12);

  const stream = await client.chat.completions.create({
    ...request, stream: true, stream_options: { include_usage: true },
  });
  let text = '';
  let role;
  let finish;
  let usage;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) usage = chunk.usage;
    if (chunk.choices.length === 0) continue;
    const c = chunk.choices[0];
    role ??= c.delta.role;
    text += c.delta.content ?? '';
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert.equal(role, 'assistant');
  assert.equal(text, choice.message.content);
  assert.equal(finish, choice.finish_reason);
  assert.deepEqual(usage, done.usage);
});

test('completions: a prompt of token ids', async () => {
  const ids = [2, 100, 200, 300];
  const r = await client.completions.create({ model: await modelId(), prompt: ids, max_tokens: 4, temperature: 0 });
  assert.match(r.id, /^cmpl-/);
  assert.equal(r.object, 'text_completion');
  assert.equal(typeof r.choices[0].text, 'string');
  assert.equal(r.usage.prompt_tokens, ids.length);
  checkUsage(r.usage);
});

test('completions: max_tokens bounds the reply', async () => {
  const r = await client.completions.create({
    model: await modelId(), prompt: 'Once upon a time', max_tokens: 3, temperature: 0,
  });
  assert.ok(r.usage.completion_tokens <= 3);
  if (r.choices[0].finish_reason === 'length') assert.equal(r.usage.completion_tokens, 3);
});

test('completions: a stop string ends the reply before it', async (t) => {
  const request = { model: await modelId(), prompt: 'Once upon a time', max_tokens: 24, temperature: 0 };
  const full = (await client.completions.create(request)).choices[0].text;
  // three characters without spaces, from the reply's middle, whose first occurrence is where they are taken
  let stop;
  for (let k = Math.floor(full.length / 3); k + 3 <= full.length && !stop; ++k) {
    const s = full.slice(k, k + 3);
    if (!/\s/.test(s) && full.indexOf(s) === k) stop = s;
  }
  if (!stop) return t.skip(`the reply is too short to take a stop string from: ${JSON.stringify(full)}`);
  const cut = await client.completions.create({ ...request, stop: [stop, 'never-there'] });
  assert.equal(cut.choices[0].text, full.slice(0, full.indexOf(stop)));
  assert.equal(cut.choices[0].finish_reason, 'stop');
});

test('a request without the key gets 401', async () => {
  const anonymous = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'not-the-key', maxRetries: 0 });
  await assert.rejects(anonymous.models.list(), (e) => {
    assert.ok(e instanceof OpenAI.AuthenticationError);
    assert.equal(e.status, 401);
    return true;
  });
});

test('an invalid field gets 400 naming it', async () => {
  await assert.rejects(
    client.chat.completions.create({ model: await modelId(), messages, temperature: 5 }),
    (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError);
      assert.equal(e.param, 'temperature');
      return true;
    },
  );
});

test('chat: the same seed samples the same reply', async () => {
  const request = { model: await modelId(), messages, max_tokens: 16, temperature: 1, top_p: 0.95, seed: 1234 };
  const a = await client.chat.completions.create(request);
  const b = await client.chat.completions.create(request);
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  assert.deepEqual(a.usage, b.usage);
});

// Continuous batching changes nothing: 16 greedy streams at once (more than the server's slots, so some
// wait in its queue) each give exactly the reply their prompt gets alone; a prompt longer than the context,
// sent among them, gets a 400 while they keep streaming.
test('16 concurrent streams give what each gets alone; an over-long prompt among them gets 400', async () => {
  const id = await modelId();
  const prompts = Array.from({ length: 16 }, (_, i) => `Story ${i}: once upon a time, ${'there was '.repeat(i % 5)}`);
  const alone = [];
  for (const p of prompts) {
    const r = await client.completions.create({ model: id, prompt: p, max_tokens: 10, temperature: 0 });
    alone.push(r.choices[0].text);
  }
  const streamed = prompts.map(async (p) => {
    const stream = await client.completions.create({ model: id, prompt: p, max_tokens: 10, temperature: 0, stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
    return text;
  });
  const tooLong = client.completions.create({ model: id, prompt: Array(100000).fill(5), max_tokens: 1 });
  await assert.rejects(tooLong, (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError);
    assert.equal(e.status, 400);
    return true;
  });
  assert.deepEqual(await Promise.all(streamed), alone);
});

// GET /metrics' value of a series (its name with labels, as printed).
async function metric(name) {
  const r = await fetch(`${url}/metrics`, { headers: { Authorization: `Bearer ${key}` } });
  const esc = name.replace(/[{}"]/g, (c) => `\\${c}`);
  const m = (await r.text()).match(new RegExp(`^${esc} (\\S+)$`, 'm'));
  assert.ok(m, `${name} missing from /metrics`);
  return Number(m[1]);
}

async function until(cond, ms = 20_000) {
  const end = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > end) return false;
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
  return true;
}

// A client that hangs up mid-reply frees its sequence and its KV blocks, streaming or not (a non-streaming
// reply writes nothing until the end, so the server watches the connection itself).
test('a client that hangs up, streaming or not, frees its sequence and its KV blocks', async () => {
  const id = await modelId();
  for (const stream of [false, true]) {
    const cancelled = await metric('markbase_requests_total{status="cancelled"}');
    const ac = new AbortController();
    const reply = client.completions.create(
      { model: id, prompt: 'Once upon a time', max_tokens: 3000, temperature: 0, ignore_eos: true, stream },
      { signal: ac.signal });
    reply.catch(() => {});
    assert.ok(await until(async () => (await metric('markbase_sequences_running')) === 1), `stream ${stream}: never ran`);
    assert.ok((await metric('markbase_kv_blocks_used')) > 0);
    ac.abort();
    if (!stream) await assert.rejects(reply);  // (a stream's promise resolved with the headers)
    assert.ok(await until(async () => (await metric('markbase_sequences_running')) === 0 &&
                                      (await metric('markbase_kv_blocks_used')) === 0),
              `stream ${stream}: the sequence or its KV blocks were not freed`);
    // ended by the hang-up, not by running out its 3000 tokens
    assert.equal(await metric('markbase_requests_total{status="cancelled"}'), cancelled + 1, `stream ${stream}`);
  }
});
