// Walks through the Inspector web UI the way an operator would, in Debian's
// Chromium: log in, find the run, watch it wait for approval, approve it in
// another tab, watch the run page pick that up live, download the artifact
// and check its hash, then look at the runners and verify the ledger,
// cancel another run from its page and find it on the usage page. On the way, the run page must list what
// the sandbox refused one step (MOAT_BLOCKED: one expected line per line).
//
//   MOAT_URL=http://127.0.0.1:7411 MOAT_TOKEN=... MOAT_RUN=... \
//   MOAT_APPROVAL=... MOAT_OP=... MOAT_SHOTS=/some/dir MOAT_CANCEL_RUN=... \
//   MOAT_BLOCKED_OP=... MOAT_BLOCKED=... node tests/inspector/walkthrough.mjs
//
// Prints one JSON line on success; on failure names the step on stderr,
// leaves failure.png in MOAT_SHOTS and exits 1 (2 for a bad environment).

import { chromium } from 'playwright-core';
import { createHash } from 'node:crypto';
import { existsSync, statSync } from 'node:fs';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';

const STEP_MS = 15_000;
// Shorter than a step, so a wait that times out says what it waited for
// before the step's own deadline does.
const WAIT_MS = 12_000;
const CHROMIUM = '/usr/bin/chromium';

const env = {};
for (const name of ['MOAT_URL', 'MOAT_TOKEN', 'MOAT_RUN', 'MOAT_APPROVAL', 'MOAT_OP', 'MOAT_SHOTS', 'MOAT_CANCEL_RUN', 'MOAT_BLOCKED_OP', 'MOAT_BLOCKED']) {
  env[name] = process.env[name];
  if (!env[name]) bail(`${name} is not set`);
}
if (!statSync(env.MOAT_SHOTS, { throwIfNoEntry: false })?.isDirectory()) {
  bail(`MOAT_SHOTS=${env.MOAT_SHOTS} is not a directory`);
}
if (!existsSync(CHROMIUM)) bail(`${CHROMIUM} is missing (apt-get install chromium)`);

const base = env.MOAT_URL.replace(/\/+$/, '');
const runPath = `/ui/runs/${encodeURIComponent(env.MOAT_RUN)}`;
const runRow = `table#runs tr[data-run-id=${q(env.MOAT_RUN)}]`;
const opItem = `ol#timeline li.op[data-op-id=${q(env.MOAT_OP)}]`;
const approvalRow = `table#approvals tr[data-approval-id=${q(env.MOAT_APPROVAL)}]`;
const event = (type) => `ul#events li.event[data-type=${q(type)}]`;

const screenshots = [];
const pageErrors = [];
let current = 'start the browser';
let waitingFor = ''; // what the current step is waiting for, for its deadline message
let active = null; // the page a failure screenshot should show

const profile = await mkdtemp(path.join(tmpdir(), 'moat-inspector-'));
let context = null;
let exitCode = 0;
try {
  const result = await run();
  console.log(JSON.stringify({ ok: true, ...result, screenshots }));
} catch (err) {
  exitCode = 1;
  // Playwright colours its call logs; a CI log shows them as noise.
  const message = String(err?.message ?? err).replace(/\x1b\[[0-9;]*m/g, '');
  console.error(`walkthrough failed at step "${current}": ${message}`);
  if (pageErrors.length) console.error(`page errors:\n  ${pageErrors.join('\n  ')}`);
  if (active) {
    const file = path.join(env.MOAT_SHOTS, 'failure.png');
    await active.screenshot({ path: file, fullPage: true, timeout: 5_000 })
      .then(() => console.error(`screenshot of ${active.url()}: ${file}`))
      .catch((e) => console.error(`no failure screenshot: ${e.message}`));
  }
} finally {
  await context?.close().catch(() => {});
  await rm(profile, { recursive: true, force: true });
}
process.exit(exitCode);

async function run() {
  await step('start the browser', async () => {
    // A persistent context on a fresh directory keeps Chromium away from any
    // profile on the machine, and the directory goes when we are done.
    context = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      acceptDownloads: true,
      viewport: { width: 1280, height: 900 },
      args: [
        '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
        '--disable-background-networking', '--disable-component-update', '--disable-sync',
      ],
      timeout: STEP_MS,
    });
    context.setDefaultTimeout(WAIT_MS);
    context.setDefaultNavigationTimeout(WAIT_MS);
  });
  const page = context.pages()[0] ?? (await context.newPage());
  watch(page, 'run tab');
  active = page;

  await step('a. log in', async () => {
    await open(page, '/ui/login');
    await page.locator('form#login input[name=token][type=password]').fill(env.MOAT_TOKEN);
    await shot(page, '01-login.png');
    await submit(page, page.locator('form#login button[type=submit]'));
    expectPath(page, '/ui/runs', 'after logging in (is MOAT_TOKEN an admin token?)');
  });

  await step('b. runs list and state filter', async () => {
    await present(page, runRow, `row for run ${env.MOAT_RUN} in the runs list`);
    await page.locator('form#run-filter select[name=state]').selectOption('running');
    const filter = page.locator('form#run-filter');
    const button = filter.locator('[type=submit]');
    // The contract names no submit button for the filter; submit the form as
    // a browser would when there is none.
    await submit(page, (await button.count()) ? button.first() : filter);
    expectPath(page, '/ui/runs', 'after filtering the runs');
    await present(page, runRow, `row for run ${env.MOAT_RUN} with the "running" filter on`);
    await shot(page, '02-runs.png');
    await submit(page, page.locator(`${runRow} a.run-link`));
    expectPath(page, runPath, 'after clicking the run link');
  });

  let runState;
  await step('c. run page shows the pending approval', async () => {
    runState = (await page.locator('#run-state').innerText()).trim();
    if (!runState) throw new Error('#run-state is empty');
    await present(page, event('approval.requested'), 'approval.requested event');
    await hasState(page, opItem, 'pending_approval');
    for (const denied of await page.locator('ol#timeline li.op.denied').all()) {
      const reason = await denied.locator('.reason').first().innerText().catch(() => '');
      if (!reason.trim()) {
        throw new Error(`denied op ${await denied.getAttribute('data-op-id')} shows no .reason`);
      }
    }
    // The step that went looking for credentials lists what was refused.
    const blocked = `ol#timeline li.op[data-op-id=${q(env.MOAT_BLOCKED_OP)}] ul.blocked li`;
    await present(page, blocked, `the blocked-access lines of op ${env.MOAT_BLOCKED_OP}`);
    const lines = (await page.locator(blocked).allInnerTexts()).map((t) => t.trim());
    for (const want of env.MOAT_BLOCKED.split('\n')) {
      if (!lines.some((line) => line.startsWith(`blocked: ${want}`))) {
        throw new Error(`op ${env.MOAT_BLOCKED_OP} does not show "blocked: ${want}"; it shows ${JSON.stringify(lines)}`);
      }
    }
    // Step e checks this mark to prove the tab was never reloaded, so what it
    // sees then came over server-sent events.
    await page.evaluate(() => { window.__moatWalkthrough = 'not reloaded'; });
    await shot(page, '03-run-pending.png');
  });

  // The run tab stays open, untouched, while the approval is made elsewhere.
  const approvals = await context.newPage();
  watch(approvals, 'approvals tab');
  active = approvals;
  await step('d. approve on the approvals page', async () => {
    await open(approvals, '/ui/approvals');
    const row = approvals.locator(approvalRow);
    await present(approvals, approvalRow, `row for approval ${env.MOAT_APPROVAL}`);
    const opId = await row.getAttribute('data-op-id');
    if (opId !== env.MOAT_OP) {
      throw new Error(`approval ${env.MOAT_APPROVAL} is for op ${opId}, expected ${env.MOAT_OP}`);
    }
    await row.locator('form.approve input[name=reason]').fill('walkthrough approves');
    await submit(approvals, row.locator('form.approve button[type=submit]'));
    expectPath(approvals, '/ui/approvals', 'after approving');
    if ((await row.count()) > 0) {
      const state = await row.getAttribute('data-state');
      if (state !== 'approved') {
        throw new Error(`approval row is still listed with data-state=${JSON.stringify(state)}`);
      }
    }
    await shot(approvals, '04-approved.png');
  });

  active = page;
  await page.bringToFront();
  await step('e1. run page receives the grant and the artifact live', async () => {
    await present(page, event('approval.granted'), 'approval.granted event, live');
    await present(page, event('artifact.created'), 'artifact.created event, live');
    const mark = await page.evaluate(() => window.__moatWalkthrough);
    if (mark !== 'not reloaded') throw new Error('the run page reloaded itself; events were not live');
  });

  await step('e2. operation succeeds after a reload', async () => {
    const deadline = Date.now() + STEP_MS - 1_000;
    let state;
    for (;;) {
      await page.reload({ waitUntil: 'load' });
      const op = page.locator(opItem);
      state = (await op.count()) ? await op.getAttribute('data-state') : '(no such op)';
      if (state === 'succeeded') break;
      if (Date.now() + 500 > deadline) {
        throw new Error(`op ${env.MOAT_OP} is ${state}, not succeeded, after ${STEP_MS / 1000} s`);
      }
      await page.waitForTimeout(500);
    }
    await shot(page, '05-run-done.png');
  });

  let artifactSha256;
  await step('f. download the artifact and check its hash', async () => {
    const row = page.locator('table#artifacts tr.artifact').first();
    await present(page, 'table#artifacts tr.artifact', 'a row in table#artifacts');
    const listed = (await row.locator('code.sha256').innerText()).trim().toLowerCase();
    if (!/^[0-9a-f]{64}$/.test(listed)) throw new Error(`code.sha256 is not a SHA-256: ${JSON.stringify(listed)}`);
    waitingFor = 'a download from a.download (does the server send Content-Disposition: attachment?)';
    const [download] = await Promise.all([
      page.waitForEvent('download').catch((err) => {
        throw new Error(`clicking a.download started no download: ${firstLine(err)}`);
      }),
      row.locator('a.download').click(),
    ]);
    const failure = await download.failure();
    if (failure) throw new Error(`download failed: ${failure}`);
    const bytes = await readFile(await download.path());
    const actual = createHash('sha256').update(bytes).digest('hex');
    if (actual !== listed) {
      throw new Error(`downloaded ${bytes.length} bytes hash to ${actual}, the page lists ${listed}`);
    }
    artifactSha256 = actual;
  });

  await step('g1. runners page', async () => {
    await open(page, '/ui/runners');
    await present(page, 'table#runners', 'table#runners');
    // Each runner shows its slots: used / free.
    const slots = (await page.locator('table#runners td.slots').first().innerText()).trim();
    if (!/^\d+ \/ \d+$/.test(slots)) throw new Error(`the runner's slots read ${JSON.stringify(slots)}`);
    await shot(page, '06-runners.png');
  });

  await step('g2. ledger verifies intact', async () => {
    await open(page, '/ui/ledger');
    await submit(page, page.locator('form#verify button').first());
    expectPath(page, '/ui/ledger', 'after verifying the ledger');
    const status = (await page.locator('#ledger-status').innerText()).trim();
    if (!status.includes('intact')) throw new Error(`#ledger-status says ${JSON.stringify(status)}`);
    await shot(page, '07-ledger.png');
  });

  await step('h. cancel a live run from its page', async () => {
    const cancelPath = `/ui/runs/${encodeURIComponent(env.MOAT_CANCEL_RUN)}`;
    await open(page, cancelPath);
    await present(page, 'form#cancel-run button', 'the cancel button');
    await submit(page, page.locator('form#cancel-run button').first());
    expectPath(page, cancelPath, 'after cancelling');
    const state = (await page.locator('#run-state').innerText()).trim();
    if (state !== 'cancelled') throw new Error(`#run-state says ${JSON.stringify(state)}`);
    if (await page.locator('form#cancel-run').count()) throw new Error('a cancelled run still offers to cancel');
    await shot(page, '08-cancelled.png');
  });

  await step('i. the cancelled run says what it used, and the usage page counts it', async () => {
    // The run's end records its usage; the page is re-read until it shows.
    const cancelPath = `/ui/runs/${encodeURIComponent(env.MOAT_CANCEL_RUN)}`;
    await open(page, cancelPath);
    await present(page, 'dl#run-usage', 'the run page\'s usage');
    await open(page, '/ui/usage');
    const today = new Date().toISOString().slice(0, 10);
    const row = `table#usage tr.day[data-day="${today}"]`;
    await present(page, row, `today's row (${today}) on the usage page`);
    const runs = Number((await page.locator(`${row} td.runs`).innerText()).trim());
    if (!(runs >= 1)) throw new Error(`today's row counts ${runs} runs`);
    await shot(page, '09-usage.png');
  });

  return { run: env.MOAT_RUN, runState, artifactSha256 };
}

// Runs one step with a hard deadline, so no step can hang the walkthrough
// even where Playwright's own timeouts would not fire.
async function step(name, body) {
  current = name;
  waitingFor = '';
  let timer;
  const deadline = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(
      `did not finish within ${STEP_MS / 1000} s${waitingFor ? `, waiting for ${waitingFor}` : ''}`,
    )), STEP_MS);
  });
  const work = body();
  // Once the deadline wins, the abandoned work fails as the browser closes;
  // that is no news, and must not surface as an unhandled rejection.
  work.catch(() => {});
  try {
    await Promise.race([work, deadline]);
  } finally {
    clearTimeout(timer);
  }
}

async function open(page, pathname) {
  const response = await page.goto(base + pathname, { waitUntil: 'load' });
  if (!response?.ok()) throw new Error(`GET ${pathname} answered ${response?.status()}`);
}

// Clicks a control (or submits a form) that leads to a new document, and
// waits for that document: waitForURL alone would return at once when the
// server redirects back to the page we are on.
async function submit(page, target) {
  const navigated = page.waitForEvent('framenavigated', (f) => f === page.mainFrame());
  const isForm = await target.evaluate((el) => el.tagName === 'FORM');
  if (isForm) await target.evaluate((form) => form.requestSubmit());
  else await target.click();
  await navigated;
  await page.waitForLoadState('load');
}

function expectPath(page, pathname, when) {
  const actual = new URL(page.url()).pathname;
  if (actual !== pathname) throw new Error(`at ${actual} ${when}, expected ${pathname}`);
}

async function present(page, selector, what) {
  waitingFor = what;
  try {
    await page.locator(selector).first().waitFor({ state: 'attached' });
  } catch (err) {
    throw new Error(`no ${what} on ${new URL(page.url()).pathname} (selector ${selector}): ${firstLine(err)}`);
  }
}

async function hasState(page, selector, state) {
  waitingFor = `${selector} to be ${state}`;
  try {
    await page.locator(`${selector}[data-state=${q(state)}]`).waitFor({ state: 'attached' });
  } catch (err) {
    const found = page.locator(selector);
    const actual = (await found.count()) ? await found.first().getAttribute('data-state') : '(absent)';
    throw new Error(`${selector} has data-state=${actual}, expected ${state}: ${firstLine(err)}`);
  }
}

async function shot(page, name) {
  const file = path.join(env.MOAT_SHOTS, name);
  await page.screenshot({ path: file, fullPage: true });
  screenshots.push(file);
}

function watch(page, label) {
  page.on('pageerror', (err) => pageErrors.push(`${label}: ${err.message}`));
  page.on('console', (msg) => {
    if (msg.location().url.endsWith('/favicon.ico')) return;
    if (msg.type() === 'error') pageErrors.push(`${label} console: ${msg.text()}`);
  });
}

// A CSS attribute value in double quotes; ids come from the environment.
function q(value) {
  return `"${String(value).replace(/["\\]/g, '\\$&')}"`;
}

function firstLine(err) {
  return String(err?.message ?? err).split('\n')[0];
}

function bail(message) {
  console.error(`walkthrough: ${message}`);
  process.exit(2);
}
