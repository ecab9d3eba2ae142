# Stands in for a program that got out of its sandbox: run on the host with
# one run's host uid and gid (`setpriv --reuid=U --regid=U --clear-groups
# python3 escapee.py SPEC`), it tries to reach another run. SPEC (JSON) names
# the other run's processes, files, sockets and cgroup files. One JSON line
# per attempt: {"attempt": ..., "target": ..., "outcome": "reached" | "refused: ..."}.
# It never changes anything it reaches beyond what the attempt needs (a
# signal 0, a ptrace attach it detaches at once).
import ctypes, json, os, signal, socket, sys

spec = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
PTRACE_ATTACH, PTRACE_DETACH = 16, 17


def report(attempt, target, fn):
    try:
        fn()
        outcome = "reached"
    except OSError as e:
        outcome = "refused: " + (os.strerror(e.errno) if e.errno else str(e))
    print(json.dumps({"attempt": attempt, "target": str(target), "outcome": outcome}), flush=True)


def ptrace(pid):
    if libc.ptrace(PTRACE_ATTACH, pid, None, None) != 0:
        raise OSError(ctypes.get_errno(), "")
    # Reached: let the tracee go on as it was (the attach stopped it).
    os.waitpid(pid, 0x40000000)  # __WALL
    libc.ptrace(PTRACE_DETACH, pid, None, None)
    os.kill(pid, signal.SIGCONT)


def read(path):
    with open(path, "rb") as f:
        f.read(1)


def connect(address):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2)
    s.connect(address)


def write_pid(path):
    with open(path, "w") as f:
        f.write(str(os.getpid()))


for pid in spec.get("pids", []):
    report("signal", pid, lambda: os.kill(pid, 0))
    report("ptrace", pid, lambda: ptrace(pid))
    report("environ", pid, lambda: read("/proc/%d/environ" % pid))
    report("mem", pid, lambda: read("/proc/%d/mem" % pid))
    report("root", pid, lambda: os.listdir("/proc/%d/root/" % pid))
    report("netns", pid, lambda: os.close(os.open("/proc/%d/ns/net" % pid, os.O_RDONLY)))
for path in spec.get("read", []):
    report("read", path, lambda: read(path))
for path in spec.get("list", []):
    report("list", path, lambda: os.listdir(path))
for path in spec.get("write", []):
    report("write", path, lambda: open(path, "a").close())
for path in spec.get("unix", []):
    report("unix", path, lambda: connect(path))
for name in spec.get("abstract", []):
    report("abstract", name, lambda: connect("\0" + name))
for path in spec.get("cgroup", []):
    report("cgroup", path, lambda: write_pid(path))
