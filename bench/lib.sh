# Shared by the bench scripts: build the release binary and print its path.
moat_binary() {
  cargo build --release --quiet --message-format=json \
    | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "moat" and m.get("executable"):
        print(m["executable"])'
}
