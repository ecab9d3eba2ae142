// An operator follows a run's browser session in the Inspector, in Debian's
// Chromium: log in, find the browser step waiting for approval, check that
// it shows the session's page as it stands (its last screenshot, a real
// PNG), approve it; then, on the run's page, find the session with its
// steps in order, each navigating or clicking step with its screenshot.
//
//   MOAT_URL=http://127.0.0.1:7411 MOAT_TOKEN=... MOAT_RUN=web \
//   MOAT_SESSION=s MOAT_APPROVAL=apr_... MOAT_STEPS='open navigate type' \
//   MOAT_SHOTS=/some/dir node tests/inspector/browser-session.mjs
//
// Prints one JSON line on success; on failure says what was missing on
// stderr, leaves failure.png in MOAT_SHOTS and exits 1 (2 for a bad
// environment).

import path from 'node:path';
import { environment, navigating, plain, signIn } from './operator.mjs';

const env = environment('browser-session', ['MOAT_URL', 'MOAT_TOKEN', 'MOAT_RUN', 'MOAT_SESSION', 'MOAT_APPROVAL', 'MOAT_STEPS', 'MOAT_SHOTS']);
const quote = (s) => s.replace(/["\\]/g, '\\$&');

let operator = null;
let page = null;
let exitCode = 0;
try {
  operator = await signIn(env.MOAT_URL, env.MOAT_TOKEN, 'moat-browser-session-');
  ({ page } = operator);

  // The step waiting for a person, with the page it would act on.
  await operator.go('/ui/approvals');
  const request = page.locator(`table#approvals tr[data-approval-id="${quote(env.MOAT_APPROVAL)}"]`);
  await request.waitFor({ state: 'attached' });
  const now = request.locator('figure.page img.screenshot');
  const nowSize = await loaded(now, 'the approval\'s screenshot');
  await page.screenshot({ path: path.join(env.MOAT_SHOTS, 'browser-approval.png'), fullPage: true });
  await request.locator('form.approve input[name=reason]').fill('the form is the one I expect');
  await navigating(page, () => request.locator('form.approve button[type=submit]').click());
  const settled = page.locator(`table#approval-history tr[data-approval-id="${quote(env.MOAT_APPROVAL)}"]`);
  await settled.waitFor({ state: 'attached' });
  if ((await settled.getAttribute('data-state')) !== 'approved') throw new Error('the step is not approved');

  // The session on the run's page: its steps in order, with screenshots.
  await operator.go(`/ui/runs/${encodeURIComponent(env.MOAT_RUN)}`);
  const session = page.locator(`#browser-sessions section.session[data-session="${quote(env.MOAT_SESSION)}"]`);
  await session.waitFor({ state: 'attached' });
  const actions = [];
  for (const step of await session.locator('li.step').all()) actions.push(await step.getAttribute('data-action'));
  const wanted = env.MOAT_STEPS.split(' ');
  if (wanted.some((a, i) => actions[i] !== a)) {
    throw new Error(`the session shows steps ${JSON.stringify(actions)}, not ${JSON.stringify(wanted)} first`);
  }
  const navigated = session.locator('li.step[data-action="navigate"] img.screenshot').first();
  const shotSize = await loaded(navigated, 'the navigate step\'s screenshot');
  if (shotSize.width !== 1280 || shotSize.height !== 800) {
    throw new Error(`the navigate step's screenshot is ${shotSize.width}x${shotSize.height}, not 1280x800`);
  }
  await page.screenshot({ path: path.join(env.MOAT_SHOTS, 'browser-session.png'), fullPage: true });
  console.log(JSON.stringify({ ok: true, actions, approvalScreenshot: nowSize, stepScreenshot: shotSize }));
} catch (err) {
  exitCode = 1;
  console.error(`browser-session failed: ${plain(err)}`);
  await page?.screenshot({ path: path.join(env.MOAT_SHOTS, 'failure.png'), fullPage: true }).catch(() => {});
} finally {
  await operator?.close();
}
process.exit(exitCode);

// The image's own size once it has loaded: a broken image has none.
async function loaded(img, what) {
  await img.waitFor({ state: 'attached' });
  const size = await img.evaluate(async (el) => {
    if (!el.complete) await new Promise((done) => { el.onload = done; el.onerror = done; });
    return { width: el.naturalWidth, height: el.naturalHeight };
  });
  if (!size.width || !size.height) throw new Error(`${what} did not load`);
  return size;
}
