// An operator approves a file's export in the Inspector, in Debian's
// Chromium: log in, find the request on the approvals page, check that it
// shows what would leave (path, type, size, the checks it passed, the start
// of the file), approve it, and see it settled; then, on the run's page,
// find the files held back at the export boundary, each with its reason
// and none downloadable (MOAT_REJECTED: one "path rule" per line).
//
//   MOAT_URL=http://127.0.0.1:7411 MOAT_TOKEN=... MOAT_APPROVAL=apr_... \
//   MOAT_PATH=output/client/report.csv MOAT_PREVIEW='client,total' \
//   MOAT_RUN=... MOAT_REJECTED='output/tool executable' \
//   MOAT_SHOTS=/some/dir node tests/inspector/approve-export.mjs
//
// Prints one JSON line on success; on failure says what was missing on
// stderr, leaves failure.png in MOAT_SHOTS and exits 1 (2 for a bad
// environment).

import path from 'node:path';
import { environment, navigating, plain, signIn } from './operator.mjs';

const env = environment('approve-export', ['MOAT_URL', 'MOAT_TOKEN', 'MOAT_APPROVAL', 'MOAT_PATH', 'MOAT_PREVIEW', 'MOAT_DETAILS', 'MOAT_RUN', 'MOAT_REJECTED', 'MOAT_SECRET', 'MOAT_SHOTS']);
const row = `table#approvals tr[data-approval-id="${env.MOAT_APPROVAL.replace(/["\\]/g, '\\$&')}"]`;

let operator = null;
let page = null;
let exitCode = 0;
try {
  operator = await signIn(env.MOAT_URL, env.MOAT_TOKEN, 'moat-export-approval-');
  ({ page } = operator);

  await operator.go('/ui/approvals');
  const request = page.locator(row);
  await request.waitFor({ state: 'attached' });
  const shown = {
    path: (await request.locator('div.export code.path').innerText()).trim(),
    checks: await request.locator('div.export ul.checks li').allInnerTexts(),
    preview: await request.locator('div.export pre.preview').innerText(),
    details: (await request.locator('div.export div.muted').first().innerText()).trim(),
  };
  if (shown.path !== env.MOAT_PATH) throw new Error(`the request shows ${shown.path}, not ${env.MOAT_PATH}`);
  if (shown.checks.length === 0) throw new Error('the request lists no checks');
  if (!shown.preview.includes(env.MOAT_PREVIEW)) {
    throw new Error(`the preview does not show ${JSON.stringify(env.MOAT_PREVIEW)}: ${JSON.stringify(shown.preview)}`);
  }
  if (!shown.details.startsWith(env.MOAT_DETAILS)) {
    throw new Error(`type and size: ${shown.details}, expected ${env.MOAT_DETAILS}`);
  }
  await page.screenshot({ path: path.join(env.MOAT_SHOTS, 'export-request.png'), fullPage: true });

  await request.locator('form.approve input[name=reason]').fill('checked the preview');
  await navigating(page, () => request.locator('form.approve button[type=submit]').click());
  const settled = page.locator(`table#approval-history tr[data-approval-id="${env.MOAT_APPROVAL}"]`);
  await settled.waitFor({ state: 'attached' });
  const state = await settled.getAttribute('data-state');
  if (state !== 'approved') throw new Error(`the request is ${state} after approving`);
  if ((await page.locator(row).count()) !== 0) throw new Error('the request is still pending');
  await page.screenshot({ path: path.join(env.MOAT_SHOTS, 'export-approved.png'), fullPage: true });

  await operator.go(`/ui/runs/${encodeURIComponent(env.MOAT_RUN)}`);
  const held = page.locator('table#quarantine tr.rejected');
  await held.first().waitFor({ state: 'attached' });
  // Each row: its path (first cell) and its rules (the code of each reason).
  const rows = [];
  for (const row of await held.all()) {
    rows.push({
      path: (await row.locator('td').first().innerText()).trim(),
      rules: (await row.locator('ul.reasons li code').allInnerTexts()).map((t) => t.trim()),
    });
  }
  const wanted = env.MOAT_REJECTED.split('\n');
  for (const want of wanted) {
    const [file, rule] = want.split(' ');
    if (!rows.some((r) => r.path === file && r.rules.length === 1 && r.rules[0] === rule)) {
      throw new Error(`the run page does not show ${file} held back for ${rule} alone: ${JSON.stringify(rows)}`);
    }
  }
  if (rows.length !== wanted.length) throw new Error(`${rows.length} rows held back: ${JSON.stringify(rows)}`);
  if ((await page.content()).includes(env.MOAT_SECRET)) throw new Error('the run page shows the secret');
  await page.screenshot({ path: path.join(env.MOAT_SHOTS, 'export-quarantine.png'), fullPage: true });
  console.log(JSON.stringify({ ok: true, shown, heldBack: rows.length }));
} catch (err) {
  exitCode = 1;
  console.error(`approve-export failed: ${plain(err)}`);
  await page?.screenshot({ path: path.join(env.MOAT_SHOTS, 'failure.png'), fullPage: true }).catch(() => {});
} finally {
  await operator?.close();
}
process.exit(exitCode);
