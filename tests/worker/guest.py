# A worker test guest (tests/worker.rs builds it with componentize-py):
# what it does is chosen by its first argument.
import sys

from wit_world import exports
import json

from wit_world.imports import http, inputs, kv, outputs, queue


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
        elif mode == "kv":
            # The kv and queue bindings: a read, a write, a send; and one
            # of each that was not granted.
            greeting = kv.get("config", "greeting")
            print("greeting:", greeting.decode() if greeting else None)
            kv.set("config", "seen", b"yes")
            print("seen:", kv.get("config", "seen").decode())
            print("keys:", ",".join(kv.keys("config")))
            queue.send("next", json.dumps({"said": greeting.decode()}), "once")
            for attempt in (lambda: kv.get("secrets", "x"), lambda: queue.send("other", "{}", None)):
                try:
                    attempt()
                except Exception as e:
                    print("refused:", type(getattr(e, "value", e)).__name__)
        elif mode == "chain":
            # The first link of the queue chain: a kv key, an input and the
            # message make an output and a message for the next link.
            name = json.loads(queue.message() or "{}").get("name", "nobody")
            greeting = kv.get("config", "greeting")
            if greeting is None:
                print("no greeting yet")
                sys.exit(3)
            note = inputs.read("note.txt").decode().strip()
            text = f"{greeting.decode()}, {name}: {note}"
            outputs.write("greeting.txt", text.encode())
            queue.send("reverse", json.dumps({"text": text}), None)
            print("sent:", text)
        else:
            print("hello from a worker,", " ".join(sys.argv[1:]))
