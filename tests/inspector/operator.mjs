// What the Inspector's browser walks share: an operator's Chromium (Debian's,
// headless, a throwaway profile), signed in with an org's admin token, and
// the two ways a walk moves between pages.

import { chromium } from 'playwright-core';
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';

const CHROMIUM = '/usr/bin/chromium';
const WAIT_MS = 12_000;

// The variables `names` from the environment; a missing one, or a missing
// Chromium, ends the walk with exit code 2 (a bad environment).
export function environment(walk, names) {
  const env = {};
  for (const name of names) {
    env[name] = process.env[name];
    if (!env[name]) {
      console.error(`${walk}: ${name} is not set`);
      process.exit(2);
    }
  }
  if (!existsSync(CHROMIUM)) {
    console.error(`${walk}: ${CHROMIUM} is missing (apt-get install chromium)`);
    process.exit(2);
  }
  return env;
}

// A signed-in operator at `base`: { page, go, close }.
export async function signIn(base, token, profilePrefix) {
  const root = base.replace(/\/+$/, '');
  const profile = await mkdtemp(path.join(tmpdir(), profilePrefix));
  let context = null;
  const close = async () => {
    await context?.close().catch(() => {});
    await rm(profile, { recursive: true, force: true });
  };
  try {
    context = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      viewport: { width: 1280, height: 900 },
      args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking',
        '--disable-component-update', '--disable-sync'],
    });
    context.setDefaultTimeout(WAIT_MS);
    const page = context.pages()[0] ?? (await context.newPage());
    const go = async (pathname) => {
      const response = await page.goto(root + pathname, { waitUntil: 'load' });
      if (!response?.ok()) throw new Error(`GET ${pathname} answered ${response?.status()}`);
    };
    await go('/ui/login');
    await page.locator('form#login input[name=token]').fill(token);
    await navigating(page, () => page.locator('form#login button[type=submit]').click());
    return { page, go, close };
  } catch (err) {
    await close();
    throw err;
  }
}

// A click that leads to a new document (the server redirects back).
export async function navigating(page, act) {
  const navigated = page.waitForEvent('framenavigated', (f) => f === page.mainFrame());
  await act();
  await navigated;
  await page.waitForLoadState('load');
}

// An error's message without the terminal's colours.
export function plain(err) {
  return String(err?.message ?? err).replace(/\x1b\[[0-9;]*m/g, '');
}
