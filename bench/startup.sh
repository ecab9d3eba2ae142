#!/usr/bin/env bash
# Whole-process startup of `moat exec` against its peers, on this machine, in
# one hyperfine run. Prints medians and ratios; figures go in the README.
#
#   bench/startup.sh            # 200 runs each, in 5 rounds (needs hyperfine, bubblewrap)
#   RUNS=50 ROUNDS=2 bench/startup.sh
#   BASELINE=/path/to/older/moat bench/startup.sh   # adds that build, side by side
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
# Every moat binary is timed from a fresh copy in one directory: a binary
# just written by the linker starts measurably slower (its page cache is in
# small pieces, so exec maps it with more faults) than a copied one, which
# would otherwise decide a comparison between two builds.
cp "$MOAT" "$out/moat" && MOAT=$out/moat
if [ -n "${BASELINE:-}" ]; then
  cp "$BASELINE" "$out/moat-baseline" && BASELINE=$out/moat-baseline
fi

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
if [ -n "${BASELINE:-}" ]; then
  names+=("moat exec (baseline build)")
  commands+=("$BASELINE exec $extra --network off -- /bin/true")
fi
# Runs the commands named in the arrays NAMES and COMMANDS (by name) in
# ROUNDS rounds of RUNS runs, rotating their order, with hyperfine OPTS (an
# array, by name); exports $out/PREFIX-<round>.json.
run_rounds() {
  local prefix=$1 rounds=$2 runs=$3
  local -n _names=$4 _commands=$5 _opts=$6
  local n=${#_names[@]} round i j args
  for round in $(seq 0 $((rounds - 1))); do
    args=()
    for i in $(seq 0 $((n - 1))); do
      j=$(( (i + round) % n ))
      args+=(-n "${_names[$j]}" "${_commands[$j]}")
    done
    hyperfine -N "${_opts[@]}" --runs "$runs" --style none \
      --export-json "$out/$prefix-$round.json" "${args[@]}" >/dev/null 2>&1 \
      || { echo "bench: hyperfine failed in $prefix round $round (run it by hand to see why)" >&2; exit 1; }
  done
}
ROUNDS=${ROUNDS:-5}
quiet_second=(--setup "sleep 1" --warmup 10)
run_rounds startup "$ROUNDS" $(( (RUNS + ROUNDS - 1) / ROUNDS )) names commands quiet_second

# One command after a pause, as an agent issues them: back-to-back runs keep
# some kernel state warm that a lone command finds cold (an RCU-synchronised
# lock that cgroup migration takes, for one, made moat 3.5x slower than
# bwrap here before init moved itself into its cgroup). 50 ms of sleep before
# every timed run; fewer runs, in rotated rounds too.
IDLE_RUNS=${IDLE_RUNS:-60}
idle_names=("bwrap + dev/proc/tmp" "moat exec (all layers)")
idle_commands=("${commands[3]}" "${commands[4]}")
if [ -n "${BASELINE:-}" ]; then
  idle_names+=("moat exec (baseline build)")
  idle_commands+=("${commands[6]}")
fi
pause=(--prepare "sleep 0.05" --warmup 3)
run_rounds idle 3 $(( (IDLE_RUNS + 2) / 3 )) idle_names idle_commands pause

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
idle = {}
for path in sorted(glob.glob(sys.argv[1] + "/idle-*.json")):
    for r in json.load(open(path))["results"]:
        idle.setdefault(r["command"], []).extend(r["times"])
bw, mo = (statistics.median(idle[n]) * 1000 for n in ("bwrap + dev/proc/tmp", "moat exec (all layers)"))
print(f"\nafter a 50 ms pause ({len(idle['moat exec (all layers)'])} runs each):")
print(f"{'bwrap + dev/proc/tmp':40} {bw:7.2f} ms")
print(f"{'moat exec (all layers)':40} {mo:7.2f} ms {mo / bw:11.2f}x bwrap + dev/proc/tmp")
if "moat exec (baseline build)" in idle:
    base = statistics.median(idle["moat exec (baseline build)"]) * 1000
    print(f"{'moat exec (baseline build)':40} {base:7.2f} ms {mo / base:11.2f}x this build / baseline")
PY
