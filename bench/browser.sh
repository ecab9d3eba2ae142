#!/usr/bin/env bash
# browser_step's speed, next to Playwright driving the same Chromium without
# Moat: a session's cold start (`open`, until the page answers) and a step
# (`click` on a button, then a `screenshot`) on a simple page served on
# loopback. Moat's browser runs in its sandbox and reaches the page through
# its egress proxy; Playwright's runs on the host and reaches it directly.
#
#   bench/browser.sh                  # 5 cold starts, 40 steps (needs python3, node)
#   N=100 MOAT=path/to/moat bench/browser.sh
#
# Run as root (the sandbox then has every layer).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-40}
COLD=${COLD:-5}
for tool in python3 node; do
  command -v "$tool" >/dev/null || { echo "bench: $tool is missing" >&2; exit 2; }
done
[ -d tests/inspector/node_modules/playwright-core ] || (cd tests/inspector && npm ci --silent)
. bench/lib.sh
MOAT=${MOAT:-$(moat_binary)}
dir=$(mktemp -d)
site_pid=
trap '[ -n "$site_pid" ] && kill "$site_pid" 2>/dev/null; rm -rf "$dir"' EXIT
mkdir -p "$dir/site" "$dir/ws"
cat > "$dir/site/index.html" <<'HTML'
<html><head><title>Bench</title></head><body>
<button id="b" onclick="this.textContent = 'clicked ' + (++window.n || (window.n = 1))">Click</button>
<p>A simple page.</p></body></html>
HTML
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 -m http.server "$port" --bind 127.0.0.1 --directory "$dir/site" >/dev/null 2>&1 &
site_pid=$!
"$MOAT" manifest keygen --out "$dir/keys" >/dev/null
"$MOAT" manifest template --public-key "$dir/keys/moat.pub" | python3 -c '
import json, sys
m = json.load(sys.stdin)
m["allowedOps"] = sorted(set(m["allowedOps"]) | {"browser_step"})
m["networkPolicy"] = {"mode": "allowlist", "allowDomains": ["app.test:" + sys.argv[1]],
                      "allowAddresses": ["127.0.0.1"]}
print(json.dumps(m))' "$port" > "$dir/manifest.json"
"$MOAT" manifest sign --key "$dir/keys/moat.key" --out "$dir/signed.json" "$dir/manifest.json"

cat > "$dir/playwright.mjs" <<'JS'
import { chromium } from 'playwright-core';
const [url, n, cold] = [process.argv[2], Number(process.argv[3]), Number(process.argv[4])];
const ms = (t) => Number(process.hrtime.bigint() - t) / 1e6;
const starts = [];
for (let i = 0; i < cold; i++) {
  const t = process.hrtime.bigint();
  const browser = await chromium.launch({ executablePath: '/usr/lib/chromium/chromium', headless: true });
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  starts.push(ms(t));
  await page.goto(url);
  await browser.close();
}
const browser = await chromium.launch({ executablePath: '/usr/lib/chromium/chromium', headless: true });
const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
await page.goto(url);
const steps = [];
for (let i = 0; i < n + 5; i++) {
  const t = process.hrtime.bigint();
  await page.click('#b');
  await page.screenshot({ type: 'png' });
  if (i >= 5) steps.push(ms(t));
}
await browser.close();
console.log(JSON.stringify({ starts, steps }));
JS
cp -r tests/inspector/node_modules "$dir/node_modules"

python3 - "$N" "$COLD" "$MOAT" "$dir" "$port" <<'PY'
import json, statistics, subprocess, sys, time
n, cold, moat, d, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
url = f"http://app.test:{port}/"
shell = subprocess.Popen(
    [moat, "shell", "--manifest", f"{d}/signed.json", "--trusted-key", f"{d}/keys/moat.pub",
     "--workspace", f"{d}/ws", "--state", f"{d}/state", "--resolve", "app.test=127.0.0.1"],
    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
count = 0
def step(args):
    global count
    count += 1
    envelope = json.dumps({"id": str(count), "runId": "bench", "correlationId": "c",
                           "op": "browser_step", "args": args,
                           "createdAt": "2026-12-04T00:00:00Z"})
    # Approved as a control plane would (outside the timing); an acting
    # step still looks its element up before it acts (`--element any`
    # binds none, as a control plane's fingerprint would bind one).
    line = subprocess.run([moat, "capability", "issue", "--ttl", "60s", "--key", f"{d}/keys/moat.key",
                           "--manifest", f"{d}/signed.json", "--element", "any"], input=envelope, check=True,
                          capture_output=True, text=True).stdout.strip() + "\n"
    start = time.perf_counter()
    shell.stdin.write(line); shell.stdin.flush()
    result = json.loads(shell.stdout.readline())
    took = (time.perf_counter() - start) * 1000
    assert result["status"] == "ok", result
    return took
starts = []
for i in range(cold):
    s = f"cold{i}"
    starts.append(step({"action": "open", "sessionId": s}))
    step({"action": "navigate", "sessionId": s, "url": url})
    step({"action": "close", "sessionId": s})
step({"action": "open", "sessionId": "warm"})
step({"action": "navigate", "sessionId": "warm", "url": url})
steps = []
for i in range(n + 5):
    # A click step answers with its page's screenshot: one operation.
    took = step({"action": "click", "sessionId": "warm", "selector": "#b"})
    if i >= 5:
        steps.append(took)
step({"action": "close", "sessionId": "warm"})
shell.stdin.close(); shell.wait()
pw = json.loads(subprocess.run(["node", f"{d}/playwright.mjs", url.replace("app.test", "127.0.0.1"), str(n), str(cold)],
                               check=True, capture_output=True, text=True, cwd=d).stdout)
rows = [("session start (open)", statistics.median(starts), statistics.median(pw["starts"])),
        ("step (click + screenshot)", statistics.median(steps), statistics.median(pw["steps"]))]
print(f"{'':28} {'moat':>10} {'playwright':>11} {'ratio':>7}")
for name, m, p in rows:
    print(f"{name:28} {m:7.0f} ms {p:8.0f} ms {m / p:6.2f}x")
print(f"(medians: {cold} cold starts, {n} steps; a moat click step answers with its screenshot, "
      "recorded as an artifact)")
PY
