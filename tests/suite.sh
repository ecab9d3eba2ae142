#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls exactly this command).
#
# Run it as root on Debian 12 from a clone: `bash tests/suite.sh`. It needs
# nothing beforehand but rustup and build-essential, and it
#   - installs the Debian packages the tests use when they are missing
#     (util-linux, coreutils, procps, iproute2, hostname, curl, python3 with
#     venv and libseccomp's bindings, postgresql, chromium, runc, systemd
#     for systemd-analyze, podman and busybox-static for the container
#     images, qemu-system-x86, linux-image-amd64, cpio and xz-utils for the
#     microvm class's guests, and Node.js with npm if there is no `node`), with
#     apt-get;
#   - puts the Python MCP SDK in a venv of its own, target/test-venv (never
#     in the system's Python), checkov and kubernetes-validate in another,
#     target/deploy-venv, moto's S3 server in target/s3-venv,
#     componentize-py (the worker tests' Python guests) in
#     target/worker-venv, jco and componentize-js (their JavaScript
#     guests) in tests/worker/node_modules, Debian's
#     kubectl and prometheus unpacked in target/deploy-tools,
#     and the Inspector walkthrough's npm package
#     (playwright-core, which never downloads a browser) in
#     tests/inspector/node_modules;
#   - starts a throwaway PostgreSQL server (initdb + pg_ctl in a temporary
#     directory, reachable only through a socket there, run as the
#     `postgres` user that Debian's package creates), and stops and removes
#     it when the suite ends, however it ends;
#   - runs `cargo test --workspace --locked --no-fail-fast`: one failing
#     test binary does not hide the others.
# Arguments are passed to cargo test (e.g. `bash tests/suite.sh --test up`).
# The suite runs as root because it tests both the root launcher and, with
# setpriv, the unprivileged one (uid 65534).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "tests/suite.sh: run it as root (sudo bash tests/suite.sh): it installs packages and tests the root and unprivileged sandbox paths" >&2
  exit 2
fi

export DEBIAN_FRONTEND=noninteractive
packages=(util-linux coreutils procps iproute2 hostname curl ca-certificates python3 python3-venv python3-seccomp postgresql chromium runc systemd podman busybox-static qemu-system-x86 linux-image-amd64 cpio xz-utils)
# Debian 12's nodejs (18) is enough for the pinned playwright-core; a newer
# one already on the machine is used as it is.
command -v node >/dev/null && command -v npm >/dev/null || packages+=(nodejs npm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "tests/suite.sh: installing ${missing[*]}"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # The downloaded .debs are not needed once installed; a small disk is.
  apt-get clean
fi

# The MCP test drives `moat mcp` with the official Python MCP SDK.
venv=$PWD/target/test-venv
if ! "$venv/bin/python" -c 'import mcp' 2>/dev/null; then
  echo "tests/suite.sh: installing the Python MCP SDK into $venv"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --no-cache-dir --disable-pip-version-check mcp
fi
export MOAT_TEST_PYTHON=$venv/bin/python

# The deployment checks (tests/deploy.rs) render deploy/kubernetes with
# Debian's kubectl, unpacked into target/deploy-tools rather than installed
# (it must not collide with a kubectl the machine may have), and validate it
# with kubernetes-validate and checkov, from a venv of their own.
tools=$PWD/target/deploy-tools
if [ ! -x "$tools/kubectl/usr/bin/kubectl" ]; then
  echo "tests/suite.sh: unpacking Debian's kubernetes-client into $tools"
  rm -rf "$tools" && mkdir -p "$tools"
  fetch_kubectl() { (cd "$tools" && apt-get download -qq -o APT::Sandbox::User=root kubernetes-client); }
  fetch_kubectl 2>/dev/null || { apt-get update -qq && fetch_kubectl; }
  dpkg -x "$tools"/kubernetes-client_*.deb "$tools/kubectl" && rm -f "$tools"/kubernetes-client_*.deb
fi
export MOAT_TEST_KUBECTL=$tools/kubectl/usr/bin/kubectl
# The metrics test (tests/metrics.rs) scrapes with Debian's Prometheus,
# unpacked the same way: installed, its package would start a service.
if [ ! -x "$tools/prometheus/usr/bin/prometheus" ]; then
  echo "tests/suite.sh: unpacking Debian's prometheus into $tools"
  mkdir -p "$tools"
  fetch_prometheus() { (cd "$tools" && apt-get download -qq -o APT::Sandbox::User=root prometheus); }
  fetch_prometheus 2>/dev/null || { apt-get update -qq && fetch_prometheus; }
  dpkg -x "$tools"/prometheus_*.deb "$tools/prometheus" && rm -f "$tools"/prometheus_*.deb
fi
export MOAT_TEST_PROMETHEUS=$tools/prometheus/usr/bin/prometheus
deploy_venv=$PWD/target/deploy-venv
if ! "$deploy_venv/bin/checkov" --version >/dev/null 2>&1 || ! [ -x "$deploy_venv/bin/kubernetes-validate" ]; then
  echo "tests/suite.sh: installing checkov and kubernetes-validate into $deploy_venv"
  /usr/bin/python3 -m venv "$deploy_venv"
  "$deploy_venv/bin/python" -m pip install --quiet --no-cache-dir --disable-pip-version-check checkov==3.3.30 kubernetes-validate==1.37.0
fi
export MOAT_TEST_DEPLOY_VENV=$deploy_venv

# The output store's S3 backend (crates/moat-control/tests/outputs.rs) is
# tested against moto's S3 server, from a venv of its own, on loopback.
s3_venv=$PWD/target/s3-venv
if ! [ -x "$s3_venv/bin/moto_server" ]; then
  echo "tests/suite.sh: installing moto's S3 server into $s3_venv"
  /usr/bin/python3 -m venv "$s3_venv"
  "$s3_venv/bin/python" -m pip install --quiet --no-cache-dir --disable-pip-version-check 'moto[server]==5.1.22'
fi
export MOAT_TEST_MOTO=$s3_venv/bin/moto_server

# The worker class's test guests are built from Python source in the tests
# (tests/worker.rs) with componentize-py, from PyPI into a venv of its own.
worker_venv=$PWD/target/worker-venv
if ! [ -x "$worker_venv/bin/componentize-py" ]; then
  echo "tests/suite.sh: installing componentize-py into $worker_venv"
  /usr/bin/python3 -m venv "$worker_venv"
  "$worker_venv/bin/python" -m pip install --quiet --no-cache-dir --disable-pip-version-check componentize-py==0.25.1
fi
export MOAT_TEST_COMPONENTIZE_PY=$worker_venv/bin/componentize-py
# ... and their JavaScript guests with jco and componentize-js, from npm.
(cd tests/worker && npm ci --no-audit --no-fund --loglevel=error)
export MOAT_TEST_JCO=$PWD/tests/worker/node_modules/.bin/jco

# The Inspector walkthrough drives Debian's Chromium with playwright-core.
(cd tests/inspector && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error)

# A PostgreSQL server of the suite's own: every storage test runs on SQLite
# and on PostgreSQL, each in a database it creates and drops.
pg_bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
pg_dir=$(mktemp -d /tmp/moat-test-pg.XXXXXX)
stop_postgres() {
  (cd / && runuser -u postgres -- "$pg_bin/pg_ctl" -D "$pg_dir/data" -m immediate stop) >/dev/null 2>&1 || true
  rm -rf "$pg_dir"
}
trap stop_postgres EXIT
chown postgres: "$pg_dir"
(cd / && runuser -u postgres -- "$pg_bin/initdb" -D "$pg_dir/data" -U root --auth=trust -E UTF8) >"$pg_dir/initdb.log" 2>&1 ||
  { cat "$pg_dir/initdb.log" >&2; exit 1; }
# No TCP listener: only the socket in this directory. fsync off: the
# server and its data are thrown away after the suite.
(cd / && runuser -u postgres -- "$pg_bin/pg_ctl" -D "$pg_dir/data" -l "$pg_dir/server.log" -w \
  -o "-k $pg_dir -c listen_addresses='' -c fsync=off -c max_connections=300" start) >/dev/null ||
  { cat "$pg_dir/server.log" >&2; exit 1; }
export MOAT_TEST_POSTGRES="host=$pg_dir dbname=postgres user=root"

# Root launches take each sandbox's host uid/gid from a block of their own
# (see docs/sandbox.md): the suite names one, so that it never adds Moat's
# entry to this machine's /etc/subuid and /etc/subgid. tests/subid.rs tests
# that first-use path over a private copy of /etc.
export MOAT_UID_RANGE=1895825408:65536
# ...and checks that nothing did: a test that launches a root sandbox
# without passing that on (a child given a bare environment) fails the suite.
subids() { cat /etc/subuid /etc/subgid 2>/dev/null | sha256sum; }
subids_before=$(subids)

status=0
cargo test --workspace --locked --no-fail-fast "$@" || status=$?
if [ "$(subids)" != "$subids_before" ]; then
  echo "tests/suite.sh: the tests changed /etc/subuid or /etc/subgid (a root sandbox was launched without MOAT_UID_RANGE):" >&2
  cat /etc/subuid /etc/subgid >&2
  status=1
fi
exit "$status"
