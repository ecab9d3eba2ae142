// Opens the Inspector's Capacity page in Debian's Chromium, signed in as an
// org's admin, and checks what an operator would look at: the org's runner
// on its host with what its runs reserve, the quota reached, and the chart
// of CPU time by day with the daily quota drawn over it.
//
//   MOAT_URL=http://127.0.0.1:7411 MOAT_TOKEN=... MOAT_RUNNER=runner_... \
//   MOAT_HOST=host-a MOAT_SHOTS=/some/dir node tests/inspector/capacity.mjs
//
// Prints one JSON line on success; on failure says what was wrong on
// stderr, leaves capacity-failure.png in MOAT_SHOTS and exits 1.

import { chromium } from 'playwright-core';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';

const env = {};
for (const name of ['MOAT_URL', 'MOAT_TOKEN', 'MOAT_RUNNER', 'MOAT_HOST', 'MOAT_SHOTS']) {
  env[name] = process.env[name];
  if (!env[name]) {
    console.error(`${name} is not set`);
    process.exit(2);
  }
}
const base = env.MOAT_URL.replace(/\/+$/, '');
const profile = await mkdtemp(path.join(tmpdir(), 'moat-capacity-'));
let context = null;
let page = null;
let exitCode = 0;
try {
  context = await chromium.launchPersistentContext(profile, {
    executablePath: '/usr/bin/chromium',
    headless: true,
    viewport: { width: 1280, height: 900 },
    // No network beyond the control plane on loopback.
    args: [
      '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
    ],
    timeout: 15_000,
  });
  await context.addCookies([{ name: 'moat_inspector', value: env.MOAT_TOKEN, url: base }]);
  page = await context.newPage();
  const answer = await page.goto(`${base}/ui/capacity`, { timeout: 15_000 });
  if (answer.status() !== 200) throw new Error(`GET /ui/capacity answered ${answer.status()}`);
  await page.locator('header a.here', { hasText: 'Capacity' }).waitFor({ timeout: 10_000 });
  const row = page.locator(`table#hosts tr.runner[data-runner-id="${env.MOAT_RUNNER}"]`);
  await row.waitFor({ timeout: 10_000 });
  const host = await row.getAttribute('data-host');
  if (host !== env.MOAT_HOST) throw new Error(`the runner is shown on host ${host}, not ${env.MOAT_HOST}`);
  const cpu = (await row.locator('td.cpu').innerText()).trim();
  if (!/^1\.000 \/ 1\.500$/.test(cpu)) throw new Error(`CPU reserved / has: ${cpu}`);
  const exceeded = (await page.locator('#quota-exceeded').innerText()).trim();
  if (!exceeded.startsWith('quota_exceeded: concurrent_runs 1 of 1')) throw new Error(`quota line: ${exceeded}`);
  const bars = await page.locator('svg#cpu-chart rect.bar').count();
  if (bars < 1) throw new Error('the CPU chart has no day');
  const quotaLine = await page.locator('svg#cpu-chart line#quota-line').getAttribute('data-quota');
  if (quotaLine !== '3600') throw new Error(`the chart's quota line: ${quotaLine}`);
  const box = await page.locator('svg#cpu-chart').boundingBox();
  if (!box || box.width < 100 || box.height < 100) throw new Error(`the chart is not drawn: ${JSON.stringify(box)}`);
  await page.screenshot({ path: path.join(env.MOAT_SHOTS, 'capacity.png'), fullPage: true });
  console.log(JSON.stringify({ ok: true, host, cpu, exceeded, bars }));
} catch (err) {
  exitCode = 1;
  console.error(String(err?.message ?? err).replace(/\x1b\[[0-9;]*m/g, ''));
  if (page) await page.screenshot({ path: path.join(env.MOAT_SHOTS, 'capacity-failure.png') }).catch(() => {});
} finally {
  if (context) await context.close().catch(() => {});
  await rm(profile, { recursive: true, force: true });
}
process.exit(exitCode);
