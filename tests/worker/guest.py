# A worker test guest (tests/worker.rs builds it with componentize-py):
# what it does is chosen by its first argument.
import sys

from wit_world import exports


class Run(exports.Run):
    def run(self) -> None:
        mode = sys.argv[1]
        if mode == "open":
            # Reading a host file: a worker has no filesystem.
            try:
                with open(sys.argv[2]) as f:
                    print("read:", f.read())
            except OSError as e:
                print("refused:", e.errno)
        elif mode == "loop":
            while True:
                pass
        elif mode == "memory":
            blocks = []
            while True:
                blocks.append(bytearray(16 << 20))
        else:
            print("hello from a worker,", " ".join(sys.argv[1:]))
