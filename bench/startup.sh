#!/usr/bin/env bash
# Whole-process startup of `moat exec` against its peers, on this machine, in
# one hyperfine run. Prints medians and ratios; figures go in the README.
#
#   bench/startup.sh            # 200 runs each (needs hyperfine, bubblewrap)
#   RUNS=50 bench/startup.sh
#
# Run as root (moat then applies every layer, cgroups included) or as an
# unprivileged user (moat then runs with --allow-degraded: no cgroups).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-200}
for tool in hyperfine bwrap unshare python3; do
  command -v "$tool" >/dev/null || { echo "bench: $tool is missing (apt-get install hyperfine bubblewrap util-linux python3)" >&2; exit 2; }
done
. bench/lib.sh
MOAT=$(moat_binary)
extra=""
[ "$(id -u)" = 0 ] || extra="--allow-degraded"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

hyperfine -N --warmup 20 --runs "$RUNS" --export-json "$out/startup.json" \
  -n "/bin/true" "/bin/true" \
  -n "unshare (user,pid,net,mount,ipc,uts)" "unshare --user --map-root-user --pid --fork --net --mount --ipc --uts /bin/true" \
  -n "bwrap" "bwrap --ro-bind / / --unshare-all --die-with-parent /bin/true" \
  -n "bwrap + dev/proc/tmp" "bwrap --ro-bind / / --unshare-all --die-with-parent --dev /dev --proc /proc --tmpfs /tmp /bin/true" \
  -n "moat exec (all layers)" "$MOAT exec $extra --network off -- /bin/true" \
  -n "moat exec --network allowlist" "$MOAT exec $extra --network allowlist --allow-domain example.com -- /bin/true" \
  >/dev/null

# Launcher peak RSS, as reported by moat itself (getrusage of the launcher).
rss=$("$MOAT" exec $extra --report - -- /bin/true 2>&1 >/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["launcherPeakRssKib"])')

python3 - "$out/startup.json" "$rss" <<'PY'
import json, statistics, sys
results = json.load(open(sys.argv[1]))["results"]
median = {r["command"]: statistics.median(r["times"]) * 1000 for r in results}
moat = median["moat exec (all layers)"]
print(f"{'command':40} {'median':>9} {'moat / this':>12}")
for name, ms in median.items():
    if name == "moat exec --network allowlist":
        continue
    print(f"{name:40} {ms:7.2f} ms {moat / ms:11.2f}x")
allow = median.pop("moat exec --network allowlist")
print(f"\nmoat exec --network allowlist: {allow:.2f} ms, {allow / moat:.2f}x moat exec --network off (target <= 1.3x)")
print(f"moat launcher peak RSS: {int(sys.argv[2]) / 1024:.1f} MiB")
PY
