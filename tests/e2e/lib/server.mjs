// Starts and stops a real `moeserve serve` for the end-to-end tests, and small helpers the
// tests share. Arguments every test script receives from CTest:
//   --moeserve PATH   the moeserve binary
//   --model DIR       the demo model directory
import { spawn } from 'node:child_process';
import assert from 'node:assert/strict';

export function parseArgs(argv = process.argv.slice(2)) {
  const args = {};
  for (let i = 0; i < argv.length; i += 2) {
    assert.ok(argv[i].startsWith('--'), `unexpected argument ${argv[i]}`);
    args[argv[i].slice(2)] = argv[i + 1];
  }
  assert.ok(args.moeserve && args.model, 'usage: node TEST.mjs --moeserve BIN --model DIR [--device cpu|cuda]');
  return args;
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Spawns the server on a free port (--port 0) and resolves once it logs its address.
// `extra` are additional flags. The returned object has baseUrl, the child process, the
// collected log, waitReady() and stop().
// `device` (from --device on the test's command line) selects the backend: the same tests
// run against `--device cuda` on a GPU machine (ctest -L gpu).
export async function startServer({ moeserve, model, device }, extra = [], { name = 'demo' } = {}) {
  // A small cache (the default 4 GiB takes seconds to allocate); tests that size it pass
  // --num-kv-blocks-override.
  const args = ['serve', model, '--port', '0', '--served-model-name', name, '--threads', '2',
    '--cpu-kv-cache-space', '0.0625', ...(device ? ['--device', device] : []), ...extra];
  const child = spawn(moeserve, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  const port = await new Promise((resolve, reject) => {
    const onData = (data) => {
      log += data.toString();
      const m = log.match(/listening on http:\/\/[^:]+:(\d+)/);
      if (m) resolve(Number(m[1]));
    };
    child.stderr.on('data', onData);
    child.stdout.on('data', (d) => { log += d.toString(); });
    exited.then(({ code, signal }) => reject(new Error(`moeserve exited (${code ?? signal}) before listening:\n${log}`)));
    setTimeout(() => reject(new Error(`moeserve did not listen within 60 s:\n${log}`)), 60000).unref();
  });
  const server = {
    child,
    port,
    baseUrl: `http://127.0.0.1:${port}`,
    get log() { return log; },
    exited,
    // Polls /health until 200 (the model has loaded).
    async waitReady(timeoutMs = 120000) {
      const deadline = Date.now() + timeoutMs;
      while (Date.now() < deadline) {
        try {
          const r = await fetch(`${server.baseUrl}/health`);
          if (r.status === 200) return;
        } catch { /* not yet */ }
        await sleep(50);
      }
      throw new Error(`server not ready after ${timeoutMs} ms:\n${log}`);
    },
    // SIGTERM, then waits for the exit; returns { code, signal }.
    async stop(signal = 'SIGTERM') {
      if (child.exitCode !== null || child.signalCode !== null) return exited;
      child.kill(signal);
      const timer = setTimeout(() => child.kill('SIGKILL'), 60000);
      const result = await exited;
      clearTimeout(timer);
      return result;
    },
  };
  return server;
}

// GETs /debug/engine.
export async function engineStats(baseUrl) {
  const r = await fetch(`${baseUrl}/debug/engine`);
  assert.equal(r.status, 200);
  return r.json();
}

// Waits until every KV block and state slot is free again.
export async function waitEngineIdle(baseUrl, timeoutMs = 10000) {
  const deadline = Date.now() + timeoutMs;
  let s;
  while (Date.now() < deadline) {
    s = await engineStats(baseUrl);
    if (s.running === 0 && s.waiting === 0 && s.free_kv_blocks === s.total_kv_blocks &&
        s.free_state_slots === s.total_state_slots && s.http_requests_in_flight === 0) return s;
    await sleep(25);
  }
  throw new Error(`engine still busy after ${timeoutMs} ms: ${JSON.stringify(s)}`);
}

// Reads an SSE response body into its JSON events; stops early when `onEvent` returns false.
export async function readSse(response, onEvent = () => true) {
  const events = [];
  let done = false;
  const decoder = new TextDecoder();
  let buffer = '';
  for await (const chunk of response.body) {
    buffer += decoder.decode(chunk, { stream: true });
    let at;
    while ((at = buffer.indexOf('\n\n')) >= 0) {
      const event = buffer.slice(0, at);
      buffer = buffer.slice(at + 2);
      if (!event.startsWith('data: ')) continue;
      const data = event.slice(6);
      if (data === '[DONE]') { done = true; continue; }
      const json = JSON.parse(data);
      events.push(json);
      if (onEvent(json) === false) return { events, done, aborted: true };
    }
  }
  return { events, done, aborted: false };
}

// Runs named async test functions in order, printing TAP-like lines; exits 1 on failure.
export async function runTests(tests, { before, after } = {}) {
  let failed = 0;
  const context = before ? await before() : undefined;
  try {
    for (const [name, fn] of Object.entries(tests)) {
      const t0 = Date.now();
      try {
        await fn(context);
        console.log(`ok - ${name} (${Date.now() - t0} ms)`);
      } catch (e) {
        failed++;
        console.log(`not ok - ${name}\n${e.stack ?? e}`);
      }
    }
  } finally {
    if (after) await after(context);
  }
  if (failed) {
    console.log(`${failed} test(s) failed`);
    process.exit(1);
  }
}
