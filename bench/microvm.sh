#!/usr/bin/env bash
# Start-to-exit of `/bin/true` under `moat exec --class microvm`, next to its
# floor: a bare `qemu-system-x86_64 -M microvm` boot of the same kernel with
# an init that reboots at once (busybox), same accelerator, same memory.
# Prints medians, the ratio, and the accelerator every figure was taken
# with (TCG is software emulation: seconds, not milliseconds).
#
#   bench/microvm.sh                 # 10 runs each (needs hyperfine, busybox-static, cpio; as root)
#   RUNS=5 bench/microvm.sh
#   MOAT=/path/to/moat bench/microvm.sh
#
# Run as root. Without usable KVM moat needs --allow-degraded, which this
# script passes: the figures are then TCG's, and it says so.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-10}
for tool in hyperfine qemu-system-x86_64 busybox cpio python3; do
  command -v "$tool" >/dev/null || { echo "bench: $tool is missing (apt-get install hyperfine qemu-system-x86 busybox-static cpio python3)" >&2; exit 2; }
done
. bench/lib.sh
MOAT=${MOAT:-$(moat_binary)}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cp "$MOAT" "$out/moat" && MOAT=$out/moat
MEMORY=512

# One run first: it builds and caches the init image, settles the
# accelerator (a probe boot, remembered), and says which kernel and
# accelerator the runs use.
report=$("$MOAT" exec --class microvm --allow-degraded --memory ${MEMORY}M --report - -- /bin/true 2>&1 >/dev/null)
read -r accel degraded < <(python3 -c 'import json,sys
r = json.loads(sys.stdin.read())
vm = r["vm"]
print(vm["accelerator"], "yes" if vm.get("degraded") else "no")' <<<"$report")
# The kernel moat boots: the one inside the newest Debian kernel, unpacked
# into the cache (or, when it could not be, the compressed image itself).
kernel=$(ls -t /boot/vmlinuz-*-amd64 | head -1)
unpacked=$(ls -t /var/cache/moat/microvm/vmlinux-* 2>/dev/null | head -1 || true)
[ -n "$unpacked" ] && kernel=$unpacked

# The floor's init: busybox, rebooting at once (with -no-reboot QEMU exits).
mkdir -p "$out/floor/bin"
cp "$(command -v busybox)" "$out/floor/bin/busybox"
printf '#!/bin/busybox sh\n/bin/busybox reboot -f\n' > "$out/floor/init"
chmod 755 "$out/floor/init"
(cd "$out/floor" && find . | cpio -o -H newc --quiet > "$out/floor.cpio")

case $accel in
  kvm) accel_args="-accel kvm -cpu host,-arch-capabilities"; append="";;
  *) accel_args="-accel tcg,tb-size=64 -cpu max"
     khz=$(awk -F: '/^cpu MHz/ {printf "%d", $2 * 1000; exit}' /proc/cpuinfo)
     append=" tsc_early_khz=$khz";;
esac
floor="qemu-system-x86_64 -M microvm,x-option-roms=off,rtc=off,isa-serial=on $accel_args -m ${MEMORY}M -smp 1 -nodefaults -no-user-config -display none -monitor none -serial none -no-reboot -kernel $kernel -initrd $out/floor.cpio -append 'console=ttyS0 panic=-1 reboot=t quiet rdinit=/init$append'"
moat="$MOAT exec --class microvm --allow-degraded --memory ${MEMORY}M -- /bin/true"

hyperfine -N --runs "$RUNS" --warmup 1 --style none --export-json "$out/vm.json" \
  -n "qemu microvm boot to a busybox init (the floor)" "$floor" \
  -n "moat exec --class microvm -- /bin/true" "$moat" >/dev/null 2>&1 \
  || { echo "bench: hyperfine failed (run the commands by hand to see why):" >&2; echo "$floor" >&2; echo "$moat" >&2; exit 1; }

python3 - "$out/vm.json" "$accel" "$degraded" "$kernel" <<'PY'
import json, statistics, sys
results = {r["command"]: r["times"] for r in json.load(open(sys.argv[1]))["results"]}
accel, degraded, kernel = sys.argv[2], sys.argv[3], sys.argv[4]
floor = statistics.median(results["qemu microvm boot to a busybox init (the floor)"])
moat = statistics.median(results["moat exec --class microvm -- /bin/true"])
what = "KVM" if accel == "kvm" else "TCG (software emulation" + (", KVM not usable here)" if degraded == "yes" else ")")
print(f"accelerator: {what}; kernel {kernel}; {len(results[next(iter(results))])} runs each")
print(f"{'command':50} {'median':>9}")
print(f"{'qemu microvm boot to a busybox init (the floor)':50} {floor:7.2f} s")
print(f"{'moat exec --class microvm -- /bin/true':50} {moat:7.2f} s")
print(f"moat / floor: {moat / floor:.2f}x (target <= 1.2x)")
print("warm pool: not built; no op latency to report")
PY
