# One tenant's program in a co-tenancy test, run inside a sandbox as
# `python3 -c "<this file>" TAG DIR OTHER_TAG PORT OTHER_PORT`.
#
# It leaves traces of itself where a neighbour could look (an abstract and
# two pathname sockets, a TCP listener on loopback, a SysV message queue and
# shared memory segment, a file in DIR, a secret in its environment), says
# "ready" in DIR, waits for DIR/go, then looks for the other tenant's traces
# from inside and writes what it found to DIR/TAG.json. It ends when DIR/stop
# appears (or after two minutes).
import ctypes, hashlib, json, os, socket, sys, time

tag, out, other, port, other_port = sys.argv[1:6]
port, other_port = int(port), int(other_port)
libc = ctypes.CDLL(None, use_errno=True)


def key(t):
    """A SysV IPC key of the tenant's own (a clash with the neighbour's would
    find this tenant's own queue and look like a leak)."""
    return int(hashlib.sha256(t.encode()).hexdigest()[:7], 16) + 1


assert key(tag) != key(other), "the two tenants' IPC keys clash"


held = []
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind("\0moat-" + tag)
s.listen(1)
held.append(s)
for path in ("/tmp/%s.sock" % tag, os.path.join(out, tag + ".sock")):
    p = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    p.bind(path)
    p.listen(1)
    held.append(p)
t = socket.socket()
t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind(("127.0.0.1", port))
t.listen(1)
held.append(t)
msq = libc.msgget(key(tag), 0o1000 | 0o600)
shm = libc.shmget(key(tag), 4096, 0o1000 | 0o600)
with open(os.path.join(out, tag + ".txt"), "w") as f:
    f.write("secret of " + tag)
with open(os.path.join(out, "ready"), "w") as f:
    f.write("%d %d %d" % (os.getpid(), msq, shm))

deadline = time.time() + 120
while not os.path.exists(os.path.join(out, "go")) and time.time() < deadline:
    time.sleep(0.05)


def attempt(fn):
    try:
        fn()
        return "reached"
    except OSError as e:
        return "refused: " + (os.strerror(e.errno) if e.errno else str(e))


def abstract():
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.connect("\0moat-" + other)


def tcp():
    socket.create_connection(("127.0.0.1", other_port), timeout=2)


def sysv(get):
    def go():
        if get(key(other)) < 0:
            raise OSError(ctypes.get_errno(), "")
    return go


def processes():
    """The TAG argument of every tenant process in sight."""
    seen = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    argv = f.read().split(b"\0")
                seen.append(argv[3].decode(errors="replace") if len(argv) > 3 else "")
            except OSError:
                pass
    return seen


found = {
    "abstract": attempt(abstract),
    "tcp": attempt(tcp),
    "msgqueue": attempt(sysv(lambda k: libc.msgget(k, 0))),
    "shm": attempt(sysv(lambda k: libc.shmget(k, 0, 0))),
    "otherFile": attempt(lambda: open(os.path.join(out, other + ".txt")).read()),
    "otherSocket": attempt(lambda: socket.socket(socket.AF_UNIX).connect(os.path.join(out, other + ".sock"))),
    "otherProcess": "reached" if other in processes() else "refused: not in /proc",
    "ownProcesses": len(processes()),
    "uid": os.getuid(),
}
with open(os.path.join(out, tag + ".json"), "w") as f:
    json.dump(found, f)
while not os.path.exists(os.path.join(out, "stop")) and time.time() < deadline:
    time.sleep(0.05)
