// The official OpenAI client (npm openai@6) against a real `moeserve serve` with the demo
// model (random weights: the text is gibberish, but greedy decoding is deterministic, so
// streaming, stop strings, logprobs and logit_bias can be checked exactly).
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { parseArgs, runTests, startServer } from './lib/server.mjs';

const args = parseArgs();
const API_KEY = 'sk-e2e-test';
const MODEL = 'demo';

async function tokenize(baseUrl, body) {
  const r = await fetch(`${baseUrl}/tokenize`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${API_KEY}` },
    body: JSON.stringify(body),
  });
  assert.equal(r.status, 200);
  return r.json();
}

const messages = [{ role: 'user', content: 'Write a haiku about the sea.' }];
const noThinking = { chat_template_kwargs: { enable_thinking: false } };

async function collectChatStream(stream) {
  const out = { content: '', reasoning: '', finish: null, usage: null, roles: 0, chunks: 0 };
  for await (const chunk of stream) {
    out.chunks++;
    if (chunk.usage) out.usage = chunk.usage;
    for (const c of chunk.choices) {
      if (c.delta.role) out.roles++;
      if (c.delta.content) out.content += c.delta.content;
      if (c.delta.reasoning_content) out.reasoning += c.delta.reasoning_content;
      if (c.finish_reason) out.finish = c.finish_reason;
    }
  }
  return out;
}

await runTests({
  async 'models.list names the served model'({ client, server }) {
    const models = await client.models.list();
    assert.deepEqual(models.data.map((m) => m.id), [MODEL]);
    assert.equal(models.data[0].object, 'model');
    assert.equal(models.data[0].root, args.model);
  },

  async 'chat: non-streaming shape and usage'({ client, server }) {
    const r = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 8, temperature: 0, ...noThinking });
    assert.equal(r.object, 'chat.completion');
    assert.match(r.id, /^chatcmpl-/);
    assert.equal(r.choices.length, 1);
    const c = r.choices[0];
    assert.equal(c.message.role, 'assistant');
    assert.ok(['stop', 'length'].includes(c.finish_reason));
    const prompt = await tokenize(server.baseUrl, { model: MODEL, messages, ...noThinking });
    assert.equal(r.usage.prompt_tokens, prompt.count);
    assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 8);
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
    if (c.finish_reason === 'length') assert.equal(r.usage.completion_tokens, 8);
  },

  async 'chat: streaming equals non-streaming (greedy)'({ client }) {
    const req = { model: MODEL, messages, max_tokens: 12, temperature: 0, ...noThinking };
    const whole = await client.chat.completions.create(req);
    const stream = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
    const s = await collectChatStream(stream);
    assert.equal(s.roles, 1);
    assert.equal(s.content, whole.choices[0].message.content ?? '');
    assert.equal(s.finish, whole.choices[0].finish_reason);
    assert.deepEqual(s.usage, whole.usage);
  },

  async 'chat: reasoning_content with --reasoning-parser qwen3'({ client, server }) {
    // The server's template opens a think block: without "</think>" everything is reasoning.
    const thinking = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 6, temperature: 0 });
    const m = thinking.choices[0].message;
    assert.equal(m.content, null);
    assert.ok(m.reasoning_content.length > 0, JSON.stringify(m));
    assert.equal(thinking.choices[0].finish_reason, 'length');
    const s = await collectChatStream(await client.chat.completions.create({ model: MODEL, messages, max_tokens: 6, temperature: 0, stream: true }));
    assert.equal(s.reasoning, m.reasoning_content);
    assert.equal(s.content, '');
    // Thinking off: the same kind of text is content.
    const plain = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 6, temperature: 0, ...noThinking });
    assert.ok(plain.choices[0].message.content.length > 0);
    assert.equal(plain.choices[0].message.reasoning_content ?? null, null);
    // A forced "</think>" closes the block at once: later tags are plain content.
    const close = (await tokenize(server.baseUrl, { model: MODEL, prompt: '</think>' })).tokens;
    assert.equal(close.length, 1);
    const closed = await client.chat.completions.create({
      model: MODEL, messages, max_tokens: 3, temperature: 0, logit_bias: { [close[0]]: 100 },
    });
    assert.equal(closed.choices[0].message.reasoning_content ?? null, null);
    assert.equal(closed.choices[0].message.content, '</think></think>');
  },

  async 'completions: text, streaming, n, seed'({ client }) {
    const req = { model: MODEL, prompt: 'The quick brown fox', max_tokens: 10, temperature: 0 };
    const a = await client.completions.create(req);
    assert.equal(a.object, 'text_completion');
    const b = await client.completions.create(req);
    assert.equal(a.choices[0].text, b.choices[0].text, 'greedy is deterministic');
    let streamed = '';
    let finish = null;
    for await (const chunk of await client.completions.create({ ...req, stream: true })) {
      for (const c of chunk.choices) {
        streamed += c.text;
        finish = c.finish_reason ?? finish;
      }
    }
    assert.equal(streamed, a.choices[0].text);
    assert.equal(finish, a.choices[0].finish_reason);

    const sampled = { model: MODEL, prompt: 'Once upon a time', max_tokens: 8, temperature: 1.0, seed: 1234, n: 3 };
    const s1 = await client.completions.create(sampled);
    const s2 = await client.completions.create(sampled);
    assert.deepEqual(s1.choices.map((c) => c.index), [0, 1, 2]);
    assert.deepEqual(s1.choices.map((c) => c.text), s2.choices.map((c) => c.text), 'same seed, same samples');
  },

  async 'stop strings cut the greedy text'({ client }) {
    const req = { model: MODEL, prompt: 'Hello there, my friend', max_tokens: 16, temperature: 0, ignore_eos: true };
    const full = (await client.completions.create(req)).choices[0].text;
    // A stop string taken from the middle of the known output.
    const chars = [...full];
    assert.ok(chars.length >= 6, `greedy output too short: ${JSON.stringify(full)}`);
    const stop = chars.slice(3, 5).join('');
    const r = await client.completions.create({ ...req, stop: [stop, 'never-appears'] });
    const c = r.choices[0];
    assert.equal(c.text, full.slice(0, full.indexOf(stop)));
    assert.equal(c.finish_reason, 'stop');
    assert.equal(c.stop_reason, stop);
    const kept = await client.completions.create({ ...req, stop, include_stop_str_in_output: true });
    assert.equal(kept.choices[0].text, full.slice(0, full.indexOf(stop) + stop.length));
  },

  async 'logit_bias forces tokens; a forced eos stops'({ client, server }) {
    const hello = (await tokenize(server.baseUrl, { model: MODEL, prompt: ' hello' })).tokens;
    assert.equal(hello.length, 1);
    const r = await client.completions.create({
      model: MODEL, prompt: 'Say it:', max_tokens: 3, temperature: 0, logit_bias: { [hello[0]]: 100 },
    });
    assert.equal(r.choices[0].text, ' hello hello hello');
    assert.equal(r.choices[0].finish_reason, 'length');
    const imEnd = (await tokenize(server.baseUrl, { model: MODEL, prompt: '<|im_end|>' })).tokens[0];
    const chat = await client.chat.completions.create({
      model: MODEL, messages, max_tokens: 5, temperature: 0, logit_bias: { [imEnd]: 100 }, ...noThinking,
    });
    assert.equal(chat.choices[0].finish_reason, 'stop');
    assert.equal(chat.choices[0].message.content, '');
    assert.equal(chat.usage.completion_tokens, 1);
  },

  async 'logprobs: greedy picks the top alternative'({ client }) {
    const r = await client.chat.completions.create({
      model: MODEL, messages, max_tokens: 5, temperature: 0, logprobs: true, top_logprobs: 3, ...noThinking,
    });
    const lp = r.choices[0].logprobs.content;
    assert.equal(lp.length, r.usage.completion_tokens);
    for (const t of lp) {
      assert.equal(t.top_logprobs.length, 3);
      assert.equal(t.token, t.top_logprobs[0].token);
      assert.ok(Math.abs(t.logprob - t.top_logprobs[0].logprob) < 1e-5);
      assert.ok(t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob);
      assert.ok(t.logprob <= 0);
    }
    const text = Buffer.from(lp.flatMap((t) => t.bytes)).toString('utf8');
    assert.equal(text.replace('<|im_end|>', ''), r.choices[0].message.content);
  },

  async 'completions: echo with prompt logprobs and max_tokens 0'({ client, server }) {
    const prompt = 'Scores for every prompt token';
    const ids = (await tokenize(server.baseUrl, { model: MODEL, prompt })).tokens;
    const r = await client.completions.create({ model: MODEL, prompt, max_tokens: 0, echo: true, logprobs: 1 });
    const c = r.choices[0];
    assert.equal(c.text, prompt);
    assert.equal(c.logprobs.tokens.length, ids.length);
    assert.equal(c.logprobs.token_logprobs[0], null);
    for (const v of c.logprobs.token_logprobs.slice(1)) assert.ok(v <= 0);
    assert.equal(r.usage.completion_tokens, 0);
    assert.equal(r.usage.prompt_tokens, ids.length);
  },

  async 'tools: named tool_choice answers with a call or content, never an error'({ client }) {
    const tools = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];
    const r = await client.chat.completions.create({
      model: MODEL, messages, tools, max_tokens: 8, temperature: 0,
      tool_choice: { type: 'function', function: { name: 'get_weather' } },
    });
    const m = r.choices[0].message;
    assert.ok(Array.isArray(m.tool_calls));
    for (const t of m.tool_calls) assert.equal(t.function.name, 'get_weather');
    const auto = await client.chat.completions.create({ model: MODEL, messages, tools, max_tokens: 8, temperature: 0 });
    assert.ok(['stop', 'length', 'tool_calls'].includes(auto.choices[0].finish_reason));
  },

  async 'the client reports errors as APIError with the status'({ client }) {
    await assert.rejects(client.chat.completions.create({ model: 'nope', messages }),
      (e) => e instanceof OpenAI.NotFoundError && e.status === 404);
    await assert.rejects(client.chat.completions.create({ model: MODEL, messages, temperature: -1 }),
      (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && /temperature/.test(e.message));
    const anonymous = new OpenAI({ baseURL: client.baseURL, apiKey: 'wrong', maxRetries: 0 });
    await assert.rejects(anonymous.models.list(), (e) => e instanceof OpenAI.AuthenticationError);
  },
}, {
  async before() {
    const server = await startServer(args, [
      '--api-key', API_KEY, '--reasoning-parser', 'qwen3', '--tool-call-parser', 'qwen3_coder',
      '--enable-auto-tool-choice', '--max-model-len', '2048', '--seed', '0',
      '--chat-template', new URL('./fixtures/chatml_thinking.jinja', import.meta.url).pathname,
    ]);
    await server.waitReady();
    const client = new OpenAI({ baseURL: `${server.baseUrl}/v1`, apiKey: API_KEY, maxRetries: 0, timeout: 60000 });
    return { server, client };
  },
  async after({ server }) {
    const { code } = await server.stop();
    assert.equal(code, 0, `exit code ${code}:\n${server.log}`);
  },
});
