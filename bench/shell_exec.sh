#!/usr/bin/env bash
# exec_argv of /usr/bin/true through `moat shell`, against `moat exec` of the
# same program with the same mounts, as whole processes on this machine.
# Prints per-operation medians and the ratio (target: at most 1.1x).
#
#   bench/shell_exec.sh            # 200 operations each way (needs hyperfine, python3)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-200}
for tool in hyperfine python3; do
  command -v "$tool" >/dev/null || { echo "bench: $tool is missing" >&2; exit 2; }
done
. bench/lib.sh
MOAT=$(moat_binary)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/ws/output"
"$MOAT" manifest keygen --out "$dir/keys" >/dev/null
"$MOAT" manifest template --public-key "$dir/keys/moat.pub" \
  | python3 -c 'import json,sys; m=json.load(sys.stdin); m["allowedExecutables"]=[{"path":"/usr/bin/true"}]; print(json.dumps(m))' \
  > "$dir/manifest.json"
"$MOAT" manifest sign --key "$dir/keys/moat.key" --out "$dir/signed.json" "$dir/manifest.json"
shell=("$MOAT" shell --manifest "$dir/signed.json" --trusted-key "$dir/keys/moat.pub" --workspace "$dir/ws" --state "$dir/state")

hyperfine -N --warmup 20 --runs "$N" --export-json "$dir/exec.json" \
  "$MOAT exec --mode read-only --workspace $dir/ws --output $dir/ws/output -- /usr/bin/true" >/dev/null 2>&1

python3 - "$N" "$dir/exec.json" "${shell[@]}" <<'PY'
import json, statistics, subprocess, sys, time
n, exec_json, shell = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
line = lambda i: json.dumps({"id": str(i), "runId": "bench", "correlationId": "c", "op": "exec_argv",
                             "args": {"argv": ["true"]}, "createdAt": "2026-11-29T12:00:00Z"}) + "\n"
proc = subprocess.Popen(shell, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
one_by_one = []
for i in range(n + 20):                      # each waits for its result: its own commit
    start = time.perf_counter()
    proc.stdin.write(line(i)); proc.stdin.flush()
    result = json.loads(proc.stdout.readline())
    assert result["status"] == "ok", result
    if i >= 20:
        one_by_one.append(time.perf_counter() - start)
start = time.perf_counter()                  # all at once: group commit
proc.stdin.write("".join(line(i) for i in range(n))); proc.stdin.flush()
for _ in range(n):
    assert json.loads(proc.stdout.readline())["status"] == "ok"
pipelined = (time.perf_counter() - start) / n
proc.stdin.close(); proc.wait()
bare = statistics.median(json.load(open(exec_json))["results"][0]["times"])
one = statistics.median(one_by_one)
print(f"{'':44} {'per op':>9} {'/ moat exec':>12}")
print(f"{'moat exec (whole process, same mounts)':44} {bare*1000:7.2f} ms {1.0:11.2f}x")
print(f"{'moat shell exec_argv, one at a time':44} {one*1000:7.2f} ms {one/bare:11.2f}x")
print(f"{'moat shell exec_argv, pipelined':44} {pipelined*1000:7.2f} ms {pipelined/bare:11.2f}x")
PY
