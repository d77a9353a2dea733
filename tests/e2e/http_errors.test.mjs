// Every bad-input case over raw HTTP against a real `moeserve serve`: OpenAI-style error
// JSON with the right status, and the server stays healthy.
import assert from 'node:assert/strict';
import net from 'node:net';
import { parseArgs, runTests, startServer, waitEngineIdle } from './lib/server.mjs';

const args = parseArgs();
const KEY = 'sk-errors';
const auth = { Authorization: `Bearer ${KEY}` };
const messages = [{ role: 'user', content: 'hi' }];

async function call(baseUrl, method, path, body, headers = auth) {
  const init = { method, headers: { ...headers } };
  if (body !== undefined) {
    init.body = typeof body === 'string' || body instanceof Uint8Array ? body : JSON.stringify(body);
    init.headers['Content-Type'] = 'application/json';
  }
  const r = await fetch(baseUrl + path, init);
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, json, text, headers: r.headers };
}

function assertError(res, status, param) {
  assert.equal(res.status, status, res.text);
  assert.ok(res.json && res.json.error, res.text);
  const e = res.json.error;
  assert.equal(e.code, status);
  assert.equal(typeof e.message, 'string');
  assert.equal(typeof e.type, 'string');
  assert.ok('param' in e);
  if (param !== undefined) assert.equal(e.param, param, res.text);
}

// Sends raw bytes and returns whatever comes back before the server closes.
function rawExchange(port, bytes) {
  return new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1');
    let reply = '';
    socket.on('data', (d) => { reply += d.toString('latin1'); });
    socket.on('error', () => resolve(reply));
    socket.on('close', () => resolve(reply));
    socket.setTimeout(2000, () => socket.destroy());
    socket.end(bytes);
  });
}

await runTests({
  async 'health, unknown route 404, wrong method 405'({ server }) {
    assert.equal((await fetch(`${server.baseUrl}/health`)).status, 200);
    assertError(await call(server.baseUrl, 'GET', '/v1/does-not-exist'), 404);
    const r = await call(server.baseUrl, 'GET', '/v1/chat/completions');
    assertError(r, 405);
    assert.equal(r.headers.get('allow'), 'POST');
    assertError(await call(server.baseUrl, 'PUT', '/v1/completions', {}), 405);
    assertError(await call(server.baseUrl, 'POST', '/health', {}), 405);
  },

  async 'authentication: missing or wrong key is 401; probes are open'({ server }) {
    assertError(await call(server.baseUrl, 'POST', '/v1/completions', { prompt: 'x' }, {}), 401);
    assertError(await call(server.baseUrl, 'GET', '/v1/models', undefined, { Authorization: 'Bearer nope' }), 401);
    assert.equal((await call(server.baseUrl, 'GET', '/v1/models')).status, 200);
    assert.equal((await fetch(`${server.baseUrl}/metrics`)).status, 200);
  },

  async 'malformed JSON, wrong body type, invalid UTF-8, oversized body'({ server }) {
    assertError(await call(server.baseUrl, 'POST', '/v1/chat/completions', '{"messages": ['), 400);
    assertError(await call(server.baseUrl, 'POST', '/v1/chat/completions', '"a string"'), 400);
    assertError(await call(server.baseUrl, 'POST', '/v1/completions',
      new Uint8Array([...Buffer.from('{"prompt": "'), 0xff, 0xfe, ...Buffer.from('"}')])), 400);
    const big = JSON.stringify({ prompt: 'a'.repeat(70000) });
    assertError(await call(server.baseUrl, 'POST', '/v1/completions', big), 413);
  },

  async 'wrong types and values name the field'({ server }) {
    const cases = [
      [{ messages, model: 'gpt-4' }, 404, 'model'],
      [{ messages, temperature: -0.5 }, 400, 'temperature'],
      [{ messages, temperature: 'warm' }, 400, 'temperature'],
      [{ messages, top_p: 0 }, 400, 'top_p'],
      [{ messages, top_p: 2 }, 400, 'top_p'],
      [{ messages, top_k: -3 }, 400, 'top_k'],
      [{ messages, min_p: 1.5 }, 400, 'min_p'],
      [{ messages, presence_penalty: -3 }, 400, 'presence_penalty'],
      [{ messages, repetition_penalty: -1 }, 400, 'repetition_penalty'],
      [{ messages, max_tokens: 0 }, 400, 'max_tokens'],
      [{ messages, max_tokens: 'many' }, 400, 'max_tokens'],
      [{ messages, n: 100 }, 400, 'n'],
      [{ messages, logprobs: true, top_logprobs: 50 }, 400, 'top_logprobs'],
      [{ messages, logit_bias: { 5: 500 } }, 400, 'logit_bias'],
      [{ messages, stop: { x: 1 } }, 400, 'stop'],
      [{ messages: 'hi' }, 400, 'messages'],
      [{ messages: [{ role: 'robot', content: 'x' }] }, 400, 'messages[0].role'],
      [{ messages, max_tokens: 100000 }, 400, 'max_tokens'],
    ];
    for (const [body, status, param] of cases) {
      const r = await call(server.baseUrl, 'POST', '/v1/chat/completions', body);
      assertError(r, status, param);
    }
    const long = 'word '.repeat(2100);
    const r = await call(server.baseUrl, 'POST', '/v1/completions', { prompt: long });
    assertError(r, 400, 'prompt');
    assert.match(r.json.error.message, /maximum context length is 1024 tokens/);
    assertError(await call(server.baseUrl, 'POST', '/v1/completions', { prompt: [1, 2, 99999999] }), 400, 'prompt');
    assertError(await call(server.baseUrl, 'POST', '/detokenize', { tokens: [-1] }), 400);
  },

  async 'garbage on the socket never takes the server down'({ server }) {
    const garbage = [
      'GARBAGE\r\n\r\n',
      'POST /v1/completions HTTP/1.1\r\nContent-Length: 5\r\n\r\n{"pro',
      'POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n',
      Buffer.from(Array.from({ length: 512 }, (_, i) => (i * 7919) % 256)),
    ];
    for (const g of garbage) {
      const reply = await rawExchange(server.port, g);
      if (reply) assert.match(reply, /^HTTP\/1\.1 \d{3}/);
    }
    assert.equal((await fetch(`${server.baseUrl}/health`)).status, 200);
    await waitEngineIdle(server.baseUrl);
  },
}, {
  async before() {
    const server = await startServer(args, ['--api-key', KEY, '--max-model-len', '1024', '--max-n', '4',
      '--max-request-body-bytes', '65536']);
    await server.waitReady();
    return { server };
  },
  async after({ server }) {
    const { code } = await server.stop();
    assert.equal(code, 0, server.log);
  },
});
