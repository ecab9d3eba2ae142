# A worker test guest (tests/worker.rs builds it with componentize-py):
# what it does is chosen by its first argument.
import sys

from wit_world import exports
from wit_world.imports import http, inputs, outputs


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
        elif mode == "io":
            # The bindings: list and read an input, write an output.
            try:
                names = inputs.names()
                text = inputs.read(sys.argv[2]).decode()
                outputs.write("result/" + sys.argv[2], text.upper().encode())
                print("listed:", ",".join(names))
            except Exception as e:
                print("refused:", type(getattr(e, "value", e)).__name__)
            # A name that would leave the inputs is refused too.
            try:
                inputs.read("../escape")
            except Exception as e:
                print("escape:", type(getattr(e, "value", e)).__name__)
        elif mode == "fetch":
            # The http binding: through the egress proxy, never a socket.
            for url in sys.argv[2:]:
                try:
                    answer = http.fetch("GET", url, [], b"")
                    denied = dict(answer.headers).get("x-moat-denied", "")
                    print("fetched:", url, answer.status, denied, answer.body.decode().strip())
                except Exception as e:
                    print("refused:", url, type(getattr(e, "value", e)).__name__)
        else:
            print("hello from a worker,", " ".join(sys.argv[1:]))
