#!/usr/bin/env bash
# What the export boundary adds to an operation's end: exec_argv through
# `moat shell`, a program that writes a CSV under output/, with the
# manifest's `exports` and without (the file then simply stays). Prints
# per-operation medians and the difference, for a program that writes
# nothing, a 10 KB CSV and a 10 MB CSV.
#
#   bench/export_op.sh                 # 40 operations each (needs python3)
#   N=100 MOAT=path/to/moat bench/export_op.sh
#
# Run as root (the verifier's sandbox then has every layer) or as an
# unprivileged user (it then runs with --allow-degraded: no cgroups).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-40}
command -v python3 >/dev/null || { echo "bench: python3 is missing" >&2; exit 2; }
. bench/lib.sh
MOAT=${MOAT:-$(moat_binary)}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$MOAT" manifest keygen --out "$dir/keys" >/dev/null
for variant in with without; do
  "$MOAT" manifest template --public-key "$dir/keys/moat.pub" | python3 -c '
import json, sys
m = json.load(sys.stdin)
m["allowedExecutables"] = [{"path": "/usr/bin/python3"}]
m["filesystem"] = {"readRoots": ["."], "writeRoots": ["output"]}
if sys.argv[1] == "with":
    m["exports"] = {"rules": [{"path": "output/**", "types": ["csv", "json", "text"]}]}
print(json.dumps(m))' "$variant" > "$dir/$variant.json"
  "$MOAT" manifest sign --key "$dir/keys/moat.key" --out "$dir/$variant.signed.json" "$dir/$variant.json"
  mkdir -p "$dir/ws-$variant/output"
done
extra=()
[ "$(id -u)" = 0 ] || extra=(--allow-degraded)

python3 - "$N" "$MOAT" "$dir" "${extra[@]}" <<'PY'
import json, statistics, subprocess, sys, time
n, moat, d, extra = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
programs = {
    "writes nothing": "pass",
    "writes a 10 KB CSV": "open('output/data.csv','w').write('id,amount\\n' + ''.join('%d,%d.50\\n' % (i, i) for i in range(1000)))",
    "writes a 10 MB CSV": "open('output/data.csv','w').write('id,amount\\n' + ''.join('%d,%d.50\\n' % (i, i) for i in range(700000)))",
}
def shell(variant):
    cmd = [moat, "shell", *extra, "--manifest", f"{d}/{variant}.signed.json", "--trusted-key",
           f"{d}/keys/moat.pub", "--workspace", f"{d}/ws-{variant}", "--state", f"{d}/state-{variant}"]
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
def op(i, program):
    return json.dumps({"id": str(i), "runId": "bench", "correlationId": "c", "op": "exec_argv",
                       "args": {"argv": ["/usr/bin/python3", "-c", program]},
                       "createdAt": "2026-12-03T00:00:00Z"}) + "\n"
shells = {v: shell(v) for v in ("with", "without")}
times = {(v, p): [] for v in shells for p in programs}
i = 0
# Alternate the two shells op by op, so that drift falls on both alike.
for name, program in programs.items():
    for round in range(n + 5):
        for v, proc in shells.items():
            i += 1
            start = time.perf_counter()
            proc.stdin.write(op(i, program)); proc.stdin.flush()
            result = json.loads(proc.stdout.readline())
            took = time.perf_counter() - start
            assert result["status"] == "ok", result
            if v == "with" and program != "pass":
                promoted = result["result"]["exports"]["promoted"]
                assert len(promoted) == 1, result["result"]["exports"]
            if round >= 5:
                times[(v, name)].append(took)
for proc in shells.values():
    proc.stdin.close(); proc.wait()
print(f"{'exec_argv through moat shell':28} {'no exports':>11} {'exports':>11} {'added':>10}")
for name in programs:
    a = statistics.median(times[("without", name)])
    b = statistics.median(times[("with", name)])
    print(f"{name:28} {a*1000:8.1f} ms {b*1000:8.1f} ms {(b-a)*1000:7.1f} ms")
print(f"({n} operations each, medians, alternating)")
PY
