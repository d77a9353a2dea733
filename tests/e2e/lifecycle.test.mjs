// Server lifecycle against a real `moeserve serve`: /health is 503 while the model loads;
// a client that aborts mid-stream gets its KV blocks and state slot freed; SIGTERM lets a
// running stream finish, refuses new connections, and exits 0.
import assert from 'node:assert/strict';
import { engineStats, parseArgs, readSse, runTests, sleep, startServer, waitEngineIdle } from './lib/server.mjs';

const args = parseArgs();

function metric(text, name, labels = '') {
  const re = new RegExp(`^${name.replace(/[:]/g, '\\:')}\\{[^}]*${labels}[^}]*\\} (\\S+)$`, 'm');
  const m = text.match(re);
  return m ? Number(m[1]) : NaN;
}

async function postJson(baseUrl, path, body, signal) {
  return fetch(baseUrl + path, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body), signal,
  });
}

await runTests({
  async 'health is 503 while loading, then 200'() {
    const server = await startServer(args, ['--max-model-len', '1024']);
    try {
      // The tokenizer alone takes a while to load: the first probe lands before ready.
      const first = await fetch(`${server.baseUrl}/health`);
      assert.equal(first.status, 503);
      const body = await first.json();
      assert.equal(body.error.code, 503);
      const early = await postJson(server.baseUrl, '/v1/completions', { prompt: 'x' });
      assert.equal(early.status, 503);
      await server.waitReady();
      const metrics = await (await fetch(`${server.baseUrl}/metrics`)).text();
      assert.equal(metric(metrics, 'moeserve:ready'), 1);
    } finally {
      const { code } = await server.stop();
      assert.equal(code, 0);
    }
  },

  async 'aborting a stream frees its blocks and slot'() {
    const server = await startServer(args, ['--max-model-len', '4096']);
    try {
      await server.waitReady();
      const before = await engineStats(server.baseUrl);
      assert.equal(before.free_kv_blocks, before.total_kv_blocks);
      const controller = new AbortController();
      const r = await postJson(server.baseUrl, '/v1/completions', {
        prompt: 'A long story begins', max_tokens: 3000, ignore_eos: true, stream: true,
      }, controller.signal);
      // Read five events WITHOUT cancelling the body (leaving a `for await` over it would close the
      // connection, and the server could abort the request before the stats below are taken).
      let seen = 0;
      let busy = null;
      const reader = r.body.getReader();
      const decoder = new TextDecoder();
      let buffer = '';
      while (seen < 5) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let at;
        while ((at = buffer.indexOf('\n\n')) >= 0) {
          const event = buffer.slice(0, at);
          buffer = buffer.slice(at + 2);
          if (event.startsWith('data: ') && event.slice(6) !== '[DONE]') seen++;
        }
      }
      busy = await engineStats(server.baseUrl);  // the stream is open: the request still runs
      controller.abort();
      assert.ok(seen >= 5, `saw ${seen} events`);
      assert.ok(busy.running === 1 && busy.free_kv_blocks < busy.total_kv_blocks, JSON.stringify(busy));
      const idle = await waitEngineIdle(server.baseUrl, 5000);
      assert.equal(idle.free_state_slots, idle.total_state_slots);
      const metrics = await (await fetch(`${server.baseUrl}/metrics`)).text();
      assert.equal(metric(metrics, 'vllm:request_success_total', 'finished_reason="abort"'), 1);

      // Non-streaming: a client that gives up is noticed too.
      const giveUp = new AbortController();
      const pending = postJson(server.baseUrl, '/v1/completions', {
        prompt: 'Another long story', max_tokens: 3000, ignore_eos: true,
      }, giveUp.signal).then((r) => r.text()).catch((e) => e);
      await sleep(300);
      const waiting = await engineStats(server.baseUrl);
      assert.equal(waiting.running, 1, JSON.stringify(waiting));
      giveUp.abort();
      assert.equal((await pending).name, 'AbortError');
      await waitEngineIdle(server.baseUrl, 5000);
    } finally {
      const { code } = await server.stop();
      assert.equal(code, 0);
    }
  },

  async 'SIGTERM drains running requests and exits 0'() {
    const server = await startServer(args, ['--max-model-len', '1024']);
    await server.waitReady();
    const r = await postJson(server.baseUrl, '/v1/completions', {
      prompt: "Count slowly", max_tokens: 40, ignore_eos: true, stream: true, stream_options: { include_usage: true },
    });
    let terminated = false;
    const result = await readSse(r, () => {
      if (!terminated) {
        terminated = true;
        server.child.kill('SIGTERM');
      }
      return true;
    });
    assert.ok(result.done, 'the stream ran to its end');
    const last = result.events.filter((e) => e.choices.length).at(-1);
    assert.equal(last.choices[0].finish_reason, 'length');
    assert.equal(result.events.at(-1).usage.completion_tokens, 40);
    const { code, signal } = await server.exited;
    assert.equal(signal, null);
    assert.equal(code, 0, server.log);
    assert.match(server.log, /shut down cleanly/);
    await assert.rejects(fetch(`${server.baseUrl}/health`));
  },
});
