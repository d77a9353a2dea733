// response_format (structured output) through the official OpenAI client (npm openai@6)
// against a real `moeserve serve` with the demo model. Its weights are random, so only the
// grammar makes its output JSON; every answer is checked with Ajv (npm ajv@8), an
// independent JSON Schema validator.
import assert from 'node:assert/strict';
import Ajv from 'ajv';
import OpenAI from 'openai';
import { parseArgs, runTests, startServer, waitEngineIdle } from './lib/server.mjs';

const args = parseArgs();
const MODEL = 'demo';
const noThinking = { chat_template_kwargs: { enable_thinking: false } };
const messages = [{ role: 'user', content: 'Describe a colour as JSON.' }];

// A schema whose texts are bounded (booleans, enums, short arrays, null, a small integer
// range): every answer ends.
const finiteSchema = {
  type: 'object',
  properties: {
    ok: { type: 'boolean' },
    color: { enum: ['red', 'green', 'blue'] },
    tags: { type: 'array', items: { enum: ['a', 'b'] }, maxItems: 3 },
    note: { type: 'null' },
    month: { type: 'integer', minimum: 1, maximum: 12 },
  },
  required: ['ok', 'color', 'tags', 'note', 'month'],
  additionalProperties: false,
};
const ajv = new Ajv({ strict: true });
const validFinite = ajv.compile(finiteSchema);
const asJsonSchema = (schema) => ({ type: 'json_schema', json_schema: { name: 'answer', schema, strict: true } });

function checkFinite(text) {
  const value = JSON.parse(text);
  assert.ok(validFinite(value), `${text}: ${ajv.errorsText(validFinite.errors)}`);
  assert.deepEqual(Object.keys(value), ['ok', 'color', 'tags', 'note', 'month'], 'properties in the schema\'s order');
  return value;
}

// Random schemas whose texts are bounded (so that a random model's answers end), from a
// seeded generator: booleans, null, enums, consts, integer ranges, short strings, short
// arrays, objects with optional and required properties, anyOf, type lists, $ref into $defs.
function mulberry32(seed) {
  return () => {
    seed |= 0; seed = (seed + 0x6D2B79F5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
function randomSchema(rand, depth = 0) {
  const pick = (list) => list[Math.floor(rand() * list.length)];
  const int = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));
  const leaf = () => pick([
    () => ({ type: 'boolean' }),
    () => ({ type: 'null' }),
    () => ({ enum: pick([['x', 'y'], [1, 2, 3], ['a', null, true], ['é', '日本', 'a"b']]) }),
    () => ({ const: pick(['fixed', 42, false]) }),
    () => { const lo = int(-30, 30); return { type: 'integer', minimum: lo, maximum: lo + int(0, 40) }; },
    () => ({ type: 'integer', exclusiveMinimum: int(-5, 5), exclusiveMaximum: int(20, 99) }),
    () => ({ type: 'string', maxLength: int(0, 4) }),
    () => ({ type: 'string', minLength: 1, maxLength: 3 }),
    () => ({ type: ['integer', 'null'], minimum: 0, maximum: 9 }),
    () => ({ type: 'number', minimum: pick([0, -1.5, 0.25]), maximum: pick([1, 2.75]) }),
    () => ({ type: 'string', pattern: pick(['^[a-z]{1,3}$', '^\\d{2}-\\d{2}$', '^(cat|dog)s?$', '^[A-Z]\\.$']) }),
  ])();
  if (depth >= 3) return leaf();
  return pick([
    leaf, leaf, leaf,
    () => ({ type: 'array', items: randomSchema(rand, depth + 1), minItems: int(0, 1), maxItems: int(1, 3) }),
    () => {
      const properties = {};
      const required = [];
      const n = int(1, 3);
      for (let i = 0; i < n; i++) {
        const name = pick(['id', 'name', 'value', 'kind', 'x y', 'ключ']) + i;
        properties[name] = randomSchema(rand, depth + 1);
        if (rand() < 0.6) required.push(name);
      }
      return { type: 'object', properties, required, additionalProperties: false };
    },
    () => ({ anyOf: [leaf(), { type: 'array', items: leaf(), maxItems: 2 }] }),
  ])();
}

async function tokenIds(baseUrl, text) {
  const r = await fetch(`${baseUrl}/tokenize`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ model: MODEL, prompt: text }),
  });
  assert.equal(r.status, 200);
  return (await r.json()).tokens;
}

await runTests({
  async 'json_schema: greedy and sampled answers match the schema'({ client }) {
    const r = await client.chat.completions.create({
      model: MODEL, messages, max_tokens: 400, temperature: 0, response_format: asJsonSchema(finiteSchema), ...noThinking,
    });
    assert.equal(r.choices[0].finish_reason, 'stop');
    checkFinite(r.choices[0].message.content);
    const sampled = await client.chat.completions.create({
      model: MODEL, messages, max_tokens: 400, temperature: 1.0, seed: 5, n: 4,
      response_format: asJsonSchema(finiteSchema), ...noThinking,
    });
    assert.equal(sampled.choices.length, 4);
    for (const c of sampled.choices) {
      assert.equal(c.finish_reason, 'stop');
      checkFinite(c.message.content);
    }
  },

  async 'random schemas: every answer validates with Ajv'({ client }) {
    const rand = mulberry32(20261205);
    const schemas = [];
    for (let i = 0; i < 40; i++) {
      const schema = randomSchema(rand);
      // Sometimes behind a $ref, as Pydantic writes nested models.
      schemas.push(rand() < 0.3 ? { $defs: { Inner: schema }, $ref: '#/$defs/Inner' } : schema);
    }
    for (let start = 0; start < schemas.length; start += 8) {
      await Promise.all(schemas.slice(start, start + 8).map(async (schema, k) => {
        const r = await client.chat.completions.create({
          model: MODEL, messages, max_tokens: 1500, temperature: (start + k) % 2 ? 1.0 : 0, seed: start + k,
          response_format: asJsonSchema(schema), ...noThinking,
        });
        const text = r.choices[0].message.content;
        assert.equal(r.choices[0].finish_reason, 'stop', `${JSON.stringify(schema)} -> ${text}`);
        const validate = ajv.compile(schema);
        assert.ok(validate(JSON.parse(text)), `${JSON.stringify(schema)} -> ${text}: ${ajv.errorsText(validate.errors)}`);
      }));
    }
  },

  async 'json_schema: streaming gives the same text as one response'({ client }) {
    const body = { model: MODEL, messages, max_tokens: 400, temperature: 0, response_format: asJsonSchema(finiteSchema), ...noThinking };
    const whole = await client.chat.completions.create(body);
    const stream = await client.chat.completions.create({ ...body, stream: true });
    let text = '';
    let finish = null;
    for await (const chunk of stream) {
      for (const c of chunk.choices) {
        text += c.delta.content ?? '';
        finish = c.finish_reason ?? finish;
      }
    }
    assert.equal(finish, 'stop');
    assert.equal(text, whole.choices[0].message.content);
    checkFinite(text);
  },

  async 'json_object: logit_bias cannot push a token the format forbids'({ client, server }) {
    // "[" is forbidden at the start of an object answer, "}" right after "{" is allowed:
    // biased up by 100, the answer is exactly {}.
    const [open] = await tokenIds(server.baseUrl, '[');
    const [close] = await tokenIds(server.baseUrl, '}');
    const r = await client.chat.completions.create({
      model: MODEL, messages, max_tokens: 50, temperature: 0, response_format: { type: 'json_object' },
      logit_bias: { [open]: 100, [close]: 100 }, ...noThinking,
    });
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.equal(r.choices[0].message.content.trim(), '{}');
  },

  async 'json_object: an unfinished answer is still a prefix of an object'({ client }) {
    const r = await client.chat.completions.create({
      model: MODEL, messages, max_tokens: 24, temperature: 0, response_format: { type: 'json_object' }, ...noThinking,
    });
    const text = r.choices[0].message.content;
    if (r.choices[0].finish_reason === 'stop') {
      assert.equal(typeof JSON.parse(text), 'object');
    } else {
      assert.equal(r.choices[0].finish_reason, 'length');
      assert.match(text, /^\s*\{/);
    }
  },

  async 'json_schema after thinking: the reasoning is free, the content is JSON'({ client, server }) {
    // The prompt leaves <think> open; biasing </think> makes the model close it at once.
    const [thinkEnd] = await tokenIds(server.baseUrl, '</think>');
    const r = await client.chat.completions.create({
      model: MODEL, messages, max_tokens: 400, temperature: 0, logit_bias: { [thinkEnd]: 100 },
      response_format: asJsonSchema(finiteSchema),
    });
    assert.equal(r.choices[0].finish_reason, 'stop');
    checkFinite(r.choices[0].message.content);
  },

  async 'completions: response_format applies to the prompt continuation'({ client }) {
    const schema = { type: 'object', properties: { answer: { enum: ['yes', 'no'] } }, required: ['answer'] };
    const r = await client.completions.create({
      model: MODEL, prompt: 'Is the sky blue? Answer in JSON: ', max_tokens: 200, temperature: 0,
      response_format: asJsonSchema(schema),
    });
    assert.equal(r.choices[0].finish_reason, 'stop');
    const value = JSON.parse(r.choices[0].text);
    assert.ok(ajv.validate(schema, value), r.choices[0].text);
  },

  async 'vLLM structured_outputs: choice and json'({ client }) {
    const choices = ['positive', 'negative', 'neutral'];
    const r = await client.chat.completions.create({
      model: MODEL, messages, max_tokens: 50, temperature: 1.0, seed: 3, n: 4, structured_outputs: { choice: choices },
      ...noThinking,
    });
    for (const c of r.choices) {
      assert.equal(c.finish_reason, 'stop');
      assert.ok(choices.includes(c.message.content), c.message.content);
    }
    const re = await client.chat.completions.create({
      model: MODEL, messages, max_tokens: 50, temperature: 1.0, seed: 9, n: 4,
      structured_outputs: { regex: '(yes|no), [0-9]{1,2}(\\.[0-9])?' }, ...noThinking,
    });
    for (const c of re.choices) {
      assert.equal(c.finish_reason, 'stop');
      assert.match(c.message.content, /^(yes|no), [0-9]{1,2}(\.[0-9])?$/);
    }
    const j = await client.completions.create({
      model: MODEL, prompt: 'JSON: ', max_tokens: 400, temperature: 0,
      structured_outputs: { json: JSON.stringify(finiteSchema) },
    });
    assert.equal(j.choices[0].finish_reason, 'stop');
    checkFinite(j.choices[0].text);
  },

  async '--structured-outputs-config: compact JSON, and JSON while thinking'() {
    const server = await startServer(args, [
      '--reasoning-parser', 'qwen3', '--max-model-len', '2048', '--seed', '0',
      '--chat-template', new URL('./fixtures/chatml_thinking.jinja', import.meta.url).pathname,
      '--structured-outputs-config', '{"backend": "xgrammar", "disable_any_whitespace": true, "enable_in_reasoning": true}',
    ]);
    try {
      await server.waitReady();
      const client = new OpenAI({ baseURL: `${server.baseUrl}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
      const r = await client.chat.completions.create({
        model: MODEL, messages, max_tokens: 400, temperature: 0, response_format: asJsonSchema(finiteSchema), ...noThinking,
      });
      const text = r.choices[0].message.content;
      assert.equal(text, JSON.stringify(checkFinite(text)), 'no whitespace between JSON tokens');
      // The prompt leaves <think> open: the grammar applies from the first token, so the
      // reasoning parser (which waits for </think>) reads the JSON as reasoning.
      const thinking = await client.chat.completions.create({
        model: MODEL, messages, max_tokens: 400, temperature: 0, response_format: asJsonSchema(finiteSchema),
      });
      assert.equal(thinking.choices[0].finish_reason, 'stop');
      assert.equal(thinking.choices[0].message.content, null);
      checkFinite(thinking.choices[0].message.reasoning_content);
    } finally {
      const { code } = await server.stop();
      assert.equal(code, 0, server.log);
    }
    await assert.rejects(startServer(args, ['--structured-outputs-config', '{"regex_engine": "re2"}']),
      /unknown key `regex_engine`/);
  },

  async 'bad formats are 400s naming the field'({ client, server }) {
    const bad = async (extra, param) => assert.rejects(
      client.chat.completions.create({ model: MODEL, messages, max_tokens: 4, ...extra }),
      (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === param, JSON.stringify(extra));
    await bad({ response_format: asJsonSchema({ type: 'string', pattern: '^a+$', maxLength: 3 }) },
      'response_format.json_schema.schema');
    await bad({ response_format: asJsonSchema({ type: 'string', pattern: '(?=a)b' }) }, 'response_format.json_schema.schema');
    await bad({ response_format: { type: 'json_schema' } }, 'response_format.json_schema');
    await bad({ response_format: { type: 'grammar' } }, 'response_format.type');
    await bad({ structured_outputs: { regex: '(a)\\1' } }, 'structured_outputs.regex');
    await bad({ structured_outputs: { grammar: 'root ::= "a"' } }, 'structured_outputs.grammar');
    await bad({ structured_outputs: { json: { type: 'number', multipleOf: 3 } } }, 'structured_outputs.json');
    await bad({
      response_format: { type: 'json_object' }, tool_choice: 'required',
      tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }],
    }, 'response_format');
    await waitEngineIdle(server.baseUrl);
  },
}, {
  async before() {
    const server = await startServer(args, [
      '--reasoning-parser', 'qwen3', '--tool-call-parser', 'qwen3_coder', '--enable-auto-tool-choice',
      '--max-model-len', '2048', '--seed', '0',
      '--chat-template', new URL('./fixtures/chatml_thinking.jinja', import.meta.url).pathname,
    ]);
    await server.waitReady();
    const client = new OpenAI({ baseURL: `${server.baseUrl}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
    return { server, client };
  },
  async after({ server }) {
    const { code } = await server.stop();
    assert.equal(code, 0, `exit code ${code}:\n${server.log}`);
  },
});
