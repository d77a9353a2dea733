// Load test against a real `moeserve serve`: 500 requests at concurrency 32 (chat and
// completions, streaming and not, greedy), a fifth of them abandoned by their client at a
// random moment, on a deliberately small KV pool so that requests queue and get preempted.
// Every completed response must be valid and equal (text, finish_reason, usage) to the same
// request served alone; afterwards every KV block and state slot is free and the server is
// healthy.
import assert from 'node:assert/strict';
import { engineStats, parseArgs, readSse, runTests, startServer, waitEngineIdle } from './lib/server.mjs';

const args = parseArgs();
const TOTAL = Number(args.total ?? 500);  // --total N for a quick run
const CONCURRENCY = 32;
const MAX_TOKENS = 6;

// A small deterministic PRNG (mulberry32), so a failing run can be replayed.
function rng(seed) {
  return () => {
    seed |= 0; seed = (seed + 0x6D2B79F5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const PROMPTS = [
  'The weather today', 'Once upon a time, in a land far away,', 'def fibonacci(n):', 'Bonjour, je m\'appelle',
  '1, 2, 3, 4,', 'The capital of France is', 'Explain quantum computing in simple terms', '你好，世界',
];

function requestFor(kind, prompt, stream) {
  const common = { model: 'demo', max_tokens: MAX_TOKENS, temperature: 0, stream };
  if (stream) common.stream_options = { include_usage: true };
  if (kind === 'chat')
    return ['/v1/chat/completions', { ...common, messages: [{ role: 'user', content: prompt }],
      chat_template_kwargs: { enable_thinking: false } }];
  return ['/v1/completions', { ...common, prompt }];
}

// Sends one request; returns { text, finish, usage } or { aborted: true }.
async function send(baseUrl, kind, prompt, stream, abortAfterMs, abortAfterChunks) {
  const [path, body] = requestFor(kind, prompt, stream);
  const controller = new AbortController();
  const timer = abortAfterMs !== null ? setTimeout(() => controller.abort(), abortAfterMs) : null;
  try {
    const r = await fetch(baseUrl + path, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body),
      signal: controller.signal,
    });
    assert.equal(r.status, 200, await r.clone().text());
    if (!stream) {
      const j = await r.json();
      assert.equal(j.object, kind === 'chat' ? 'chat.completion' : 'text_completion');
      const c = j.choices[0];
      return { text: kind === 'chat' ? c.message.content : c.text, finish: c.finish_reason, usage: j.usage };
    }
    let text = '';
    let finish = null;
    let usage = null;
    let chunks = 0;
    const result = await readSse(r, (e) => {
      if (e.usage) usage = e.usage;
      for (const c of e.choices) {
        text += (kind === 'chat' ? c.delta.content : c.text) ?? '';
        if (c.finish_reason) finish = c.finish_reason;
      }
      chunks++;
      if (abortAfterChunks !== null && chunks >= abortAfterChunks) {
        controller.abort();
        return false;
      }
      return true;
    });
    if (result.aborted) return { aborted: true };
    assert.ok(result.done, 'stream ended without [DONE]');
    return { text, finish, usage };
  } catch (e) {
    if (e.name === 'AbortError') return { aborted: true };
    throw e;
  } finally {
    if (timer) clearTimeout(timer);
  }
}

await runTests({
  async 'load with random disconnects: valid, equal to single requests, nothing leaked'({ server }) {
    // References: each (kind, prompt) served alone.
    const reference = new Map();
    for (const kind of ['chat', 'completion'])
      for (const prompt of PROMPTS)
        reference.set(`${kind}|${prompt}`, await send(server.baseUrl, kind, prompt, false, null, null));

    const random = rng(20261130);
    const jobs = Array.from({ length: TOTAL }, (_, i) => {
      const disconnect = random() < 0.2;
      const stream = random() < 0.5;
      return {
        i,
        kind: random() < 0.5 ? 'chat' : 'completion',
        prompt: PROMPTS[Math.floor(random() * PROMPTS.length)],
        stream,
        abortAfterMs: disconnect && !stream ? Math.floor(random() * 150) : null,
        abortAfterChunks: disconnect && stream ? 1 + Math.floor(random() * 3) : null,
      };
    });
    const t0 = Date.now();
    let next = 0, completed = 0, aborted = 0, maxRunning = 0, mismatches = [];
    const sampler = setInterval(async () => {
      try { maxRunning = Math.max(maxRunning, (await engineStats(server.baseUrl)).running); } catch { /* ignore */ }
    }, 100);
    await Promise.all(Array.from({ length: CONCURRENCY }, async () => {
      while (next < jobs.length) {
        const job = jobs[next++];
        const r = await send(server.baseUrl, job.kind, job.prompt, job.stream, job.abortAfterMs, job.abortAfterChunks);
        if (r.aborted) { aborted++; continue; }
        completed++;
        const ref = reference.get(`${job.kind}|${job.prompt}`);
        if (r.text !== ref.text || r.finish !== ref.finish ||
            JSON.stringify(r.usage) !== JSON.stringify(ref.usage))
          mismatches.push({ job, got: r, want: ref });
      }
    }));
    clearInterval(sampler);
    const seconds = (Date.now() - t0) / 1000;
    const stats = await waitEngineIdle(server.baseUrl, 10000);
    console.log(`# ${TOTAL} requests (${completed} completed, ${aborted} abandoned) at concurrency ` +
      `${CONCURRENCY} in ${seconds.toFixed(1)} s (${(TOTAL / seconds).toFixed(1)} req/s); ` +
      `max running ${maxRunning}, preemptions ${stats.num_preemptions}, steps ${stats.num_steps}`);
    assert.deepEqual(mismatches.slice(0, 3), [], `${mismatches.length} responses differ from the single-request output`);
    assert.ok(completed > TOTAL * 0.6);
    assert.ok(aborted > 0);
    assert.equal(stats.free_kv_blocks, stats.total_kv_blocks);
    assert.equal(stats.free_state_slots, stats.total_state_slots);
    assert.equal((await fetch(`${server.baseUrl}/health`)).status, 200);
    const metrics = await (await fetch(`${server.baseUrl}/metrics`)).text();
    assert.match(metrics, /vllm:request_success_total\{model_name="demo",finished_reason="abort"\} [1-9]/);
  },
}, {
  async before() {
    // 20 blocks of 16 tokens hold fewer sequences than run at once: requests wait and get
    // preempted, which must not change what they generate.
    const server = await startServer(args, ['--max-model-len', '256', '--max-num-seqs', '32',
      '--num-kv-blocks-override', '20', '--num-state-slots-override', '32']);
    await server.waitReady();
    return { server };
  },
  async after({ server }) {
    const { code } = await server.stop();
    assert.equal(code, 0, server.log);
  },
});
