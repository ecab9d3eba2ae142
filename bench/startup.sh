#!/usr/bin/env bash
# Whole-process startup of `moat exec` against its peers, on this machine, in
# one hyperfine run. Prints medians and ratios; figures go in the README.
#
#   bench/startup.sh            # 200 runs each, in 5 rounds (needs hyperfine, bubblewrap)
#   RUNS=50 ROUNDS=2 bench/startup.sh
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
MOAT=${MOAT:-$(moat_binary)}
extra=""
[ "$(id -u)" = 0 ] || extra="--allow-degraded"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# A shared VM drifts by a few percent over the minutes a benchmark takes, and
# hyperfine runs one command's runs in a block: so the runs are split into
# ROUNDS rounds, each running every command in a rotated order, and the
# medians are taken over all rounds. Each block starts after a second of
# quiet: namespaces are torn down partly in the background (network
# namespaces by a kernel worker), and that work must not fall into the next
# command's runs.
names=("/bin/true" "unshare (user,pid,net,mount,ipc,uts)" "bwrap" "bwrap + dev/proc/tmp" \
       "moat exec (all layers)" "moat exec --network allowlist")
commands=("/bin/true" \
  "unshare --user --map-root-user --pid --fork --net --mount --ipc --uts /bin/true" \
  "bwrap --ro-bind / / --unshare-all --die-with-parent /bin/true" \
  "bwrap --ro-bind / / --unshare-all --die-with-parent --dev /dev --proc /proc --tmpfs /tmp /bin/true" \
  "$MOAT exec $extra --network off -- /bin/true" \
  "$MOAT exec $extra --network allowlist --allow-domain example.com -- /bin/true")
ROUNDS=${ROUNDS:-5}
per_round=$(( (RUNS + ROUNDS - 1) / ROUNDS ))
n=${#names[@]}
for round in $(seq 0 $((ROUNDS - 1))); do
  args=()
  for i in $(seq 0 $((n - 1))); do
    j=$(( (i + round) % n ))
    args+=(-n "${names[$j]}" "${commands[$j]}")
  done
  hyperfine -N --setup "sleep 1" --warmup 10 --runs "$per_round" --style none \
    --export-json "$out/startup-$round.json" "${args[@]}" >/dev/null 2>&1 \
    || { echo "bench: hyperfine failed in round $round (run it by hand to see why)" >&2; exit 1; }
done

# Launcher peak RSS, as reported by moat itself (getrusage of the launcher).
rss=$("$MOAT" exec $extra --report - -- /bin/true 2>&1 >/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["launcherPeakRssKib"])')

python3 - "$out" "$rss" <<'PY'
import glob, json, statistics, sys
times = {}
for path in sorted(glob.glob(sys.argv[1] + "/startup-*.json")):
    for r in json.load(open(path))["results"]:
        times.setdefault(r["command"], []).extend(r["times"])
# Round 0 runs the commands in the order they are declared above.
order = [r["command"] for r in json.load(open(sys.argv[1] + "/startup-0.json"))["results"]]
median = {name: statistics.median(times[name]) * 1000 for name in order}
moat = median["moat exec (all layers)"]
print(f"{'command':40} {'median':>9} {'moat / this':>12}")
for name, ms in median.items():
    if name == "moat exec --network allowlist":
        continue
    print(f"{name:40} {ms:7.2f} ms {moat / ms:11.2f}x")
allow = median.pop("moat exec --network allowlist")
print(f"\nmoat exec --network allowlist: {allow:.2f} ms, {allow / moat:.2f}x moat exec --network off (target <= 1.3x)")
print(f"moat launcher peak RSS: {int(sys.argv[2]) / 1024:.1f} MiB")
print(f"({len(times[order[0]])} runs each, in rounds with the order rotated)")
PY
