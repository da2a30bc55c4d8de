#!/usr/bin/env bash
# Checks deploy/systemd/ without a running systemd (CI runs it from .ci/deploy.sh, after the
# workspace's debug build):
#
#   1. `systemd-analyze verify` of the unit, its binary path pointed at the build under test,
#      prints nothing (no unknown setting, no bad value, the executables exist).
#   2. `systemd-analyze security --offline=true` scores the unit's exposure at most
#      $threshold/10 (the score is printed); the settings the score does not weigh are
#      asserted: restart on failure, SIGTERM with time to drain, the environment file, the
#      state directory as working directory, no watchdog (the relay has no sd_notify).
#   3. The sandbox holds the binary: what the unit runs (`outbox migrate`, then `outbox relay`
#      on SQLite publishing to a webhook receiver until SIGTERM, and `outbox relay` with an
#      unreachable Kafka broker, which starts librdkafka's threads) runs under `strace -f` as
#      an unprivileged user in a state directory, with relay.env.example's settings; sandbox.py
#      then checks every system call against the unit's SystemCallFilter, every socket against
#      RestrictAddressFamilies, memory against MemoryDenyWriteExecute, and /proc, /dev and
#      written paths against ProcSubset, PrivateDevices and ProtectSystem. The relay must
#      publish every event and exit 0 on SIGTERM.
#   4. Every OUTBOX_* variable relay.env.example names is one the relay reads.
#
#   bash deploy/systemd/check.sh          # OUTBOX_BIN: default target/debug/outbox
set -euo pipefail
cd "$(dirname "$0")/../.."
here=deploy/systemd
unit=$here/outbox-relay.service
env_example=$here/relay.env.example
# Exposure ×10: 15 is 1.5 on systemd's 0–10 scale ("OK" up to 2.0); the unit scores 1.1.
threshold=15
started=$SECONDS

# fail, ok, need_packages, find_binary, forget_pid, wait_for, free_port, listening.
# shellcheck source=deploy/lib.sh
source deploy/lib.sh

[[ $(id -u) == 0 ]] || fail "needs root (to run the traced commands as another user)"
find_binary

need_packages systemd strace python3 util-linux
python=/usr/bin/python3

work=$(mktemp -d /tmp/outbox-systemd-check.XXXXXX)
chmod 0755 "$work"
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

# ---- 1. systemd-analyze verify --------------------------------------------------------------

grep -q '^ExecStart=/usr/local/bin/outbox relay$' "$unit" || fail "ExecStart is not /usr/local/bin/outbox relay"
# The unit as it would be installed, its binary the build under test (verify checks it exists).
mkdir "$work/units"
sed "s|/usr/local/bin/outbox|$bin|g" "$unit" >"$work/units/outbox-relay.service"
verified=$(systemd-analyze verify "$work/units/outbox-relay.service" 2>&1) ||
  fail "systemd-analyze verify failed: $verified"
[[ -z $verified ]] || fail "systemd-analyze verify printed: $verified"
ok "systemd-analyze verify $unit: nothing to say"

# ---- 2. exposure and the settings it does not weigh -------------------------------------------

report=$(systemd-analyze security --offline=true --threshold="$threshold" \
  "$work/units/outbox-relay.service" 2>&1) && secure=1 || secure=0
score=$(sed -n 's/.*Overall exposure level for outbox-relay.service: \([0-9.]*\).*/\1/p' <<<"$report")
[[ -n $score ]] || fail "systemd-analyze security printed no score: $report"
((secure)) || { grep '✗' <<<"$report" >&2 || true; fail "exposure $score is above $((threshold / 10)).$((threshold % 10))"; }
ok "systemd-analyze security: exposure $score (at most $((threshold / 10)).$((threshold % 10)))"

setting() { sed -n "s/^$1=//p" "$unit" | tail -n 1; }
[[ $(setting Restart) == on-failure ]] || fail "Restart is not on-failure"
[[ $(setting KillSignal) == SIGTERM ]] || fail "KillSignal is not SIGTERM"
stop=$(setting TimeoutStopSec)
# The relay's worst-case drain with default settings: publish_timeout 30 s, two rounds of
# statement_timeout + 5 s, 5 s for background tasks (deploy/kubernetes/check.py holds the
# same bound for the pod's grace period).
[[ $stop =~ ^([0-9]+)s$ ]] && ((BASH_REMATCH[1] >= 105)) ||
  fail "TimeoutStopSec=$stop: give the relay at least 105s (its worst-case drain) before SIGKILL"
[[ $(setting EnvironmentFile) == /etc/outbox/relay.env ]] || fail "EnvironmentFile is not /etc/outbox/relay.env"
[[ $(setting StateDirectory) == outbox && $(setting WorkingDirectory) == "%S/outbox" ]] ||
  fail "the working directory is not the state directory (%S/outbox)"
[[ -z $(setting WatchdogSec) ]] || fail "WatchdogSec is set, but the relay does not speak sd_notify"
[[ $(setting Type) != notify ]] || fail "Type=notify, but the relay does not speak sd_notify"
ok "Restart=on-failure, KillSignal=SIGTERM, TimeoutStopSec=$stop, EnvironmentFile, StateDirectory, no watchdog"

# ---- 3. the binary under the unit's sandbox, traced -------------------------------------------

# As `nobody` (the unit's dynamic user is unprivileged too: SQLite, for one, behaves
# differently as root), with umask 0077, in a state directory of its own, with the example
# environment file's settings, and with /proc mounted as ProtectProc=invisible and
# ProcSubset=pid mount it (so the relay's fallbacks for what that hides really run).
runas=(setpriv --reuid=65534 --regid=65534 --clear-groups)
state=$work/state
traces=$work/traces
install -d -m 0700 -o 65534 -g 65534 "$state" "$traces"
install -m 0755 "$bin" "$work/outbox"
# An environment file's lines: KEY=VALUE, and `#` comments.
mapfile -t example_env < <(grep -E '^[A-Za-z_][A-Za-z0-9_]*=' "$env_example")
((${#example_env[@]} > 0)) || fail "$env_example sets nothing"
hostname=outbox-check-host
# traced NAME [VAR=VALUE…] -- ARGS…: `outbox ARGS` as the unit runs it, under strace, its log
# in $traces/NAME.trace; exits with its status. It execs: call it in a subshell, `$(…)` or
# `… &` (then $! is strace's PID: no process in between).
traced() {
  local name=$1 extra=()
  shift
  while [[ $1 != -- ]]; do
    extra+=("$1")
    shift
  done
  shift
  cd "$state"
  umask 0077
  exec unshare --mount --propagation private -- /bin/sh -c \
    'mount -t proc -o subset=pid,hidepid=invisible proc /proc && exec "$@"' sh \
    "${runas[@]}" env -i PATH=/usr/bin:/bin HOSTNAME="$hostname" "${example_env[@]}" "${extra[@]}" \
    strace -f -qq -o "$traces/$name.trace" "$work/outbox" "$@"
}

# ExecStartPre: outbox migrate, with the example's OUTBOX_DATABASE_URL (sqlite://outbox.db).
migrated=$(traced migrate -- migrate 2>&1) || fail "outbox migrate: $migrated"
[[ $migrated == "outbox outbox_events is up to date" && -f $state/outbox.db ]] ||
  fail "outbox migrate said: $migrated"
ok "ExecStartPre (outbox migrate) created outbox.db in the state directory"

events=(0192f0c4-7d1e-7b3a-9c55-1d2e3f405201 0192f0c4-7d1e-7b3a-9c55-1d2e3f405202
  0192f0c4-7d1e-7b3a-9c55-1d2e3f405203)
"${runas[@]}" "$python" - "$state/outbox.db" "${events[@]}" <<'EOF'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], timeout=30)
with db:
    for version, event_id in enumerate(sys.argv[2:], start=1):
        db.execute(
            "INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id,"
            " aggregate_version, event_type, payload) VALUES (?, 'order', '7', ?, 'OrderPlaced', ?)",
            (event_id, version, b'{"order_id":7}'),
        )
EOF


receiver_port=
free_port receiver_port
deliveries=$work/deliveries
: >"$deliveries"
"$python" - "$receiver_port" "$deliveries" <<'EOF' &
import http.server, sys
port, out = int(sys.argv[1]), sys.argv[2]
class Receiver(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with open(out, "a") as f:
            f.write(self.headers.get("webhook-id", "-") + "\n")
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Receiver).serve_forever()
EOF
pids+=($!)
wait_for 10 "the webhook receiver on port $receiver_port" listening "$receiver_port"

# relay_until_sigterm NAME BROKER_URL CONDITION…: ExecStart, traced: starts `outbox relay`,
# waits for /healthz and then for CONDITION, stops it with SIGTERM (by its PID, the first in
# its trace) and fails unless it exits 0.
relay_until_sigterm() {
  local name=$1 broker=$2 relay status=0
  shift 2
  relay_port=
  free_port relay_port
  relay_log=$work/$name.log
  traced "$name" OUTBOX_BROKER_URL="$broker" OUTBOX_LISTEN="127.0.0.1:$relay_port" -- relay \
    >"$relay_log" 2>&1 &
  tracer=$!
  pids+=("$tracer")
  # The relay's PID, killed at exit too if need be: strace killed leaves its tracee running.
  relay_started() { relay_alive && [[ -s $traces/$name.trace ]]; }
  wait_for 10 "the $name relay to start under strace" relay_started
  relay=$(awk 'NR == 1 && / execve\(/ {print $1}' "$traces/$name.trace")
  [[ -n $relay ]] || fail "no relay PID in $traces/$name.trace"
  pids+=("$relay")
  wait_for 30 "the $name relay to serve /healthz" serving
  wait_for 60 "$*" "$@"
  kill -TERM "$relay"
  wait "$tracer" || status=$?
  forget_pid "$tracer"
  forget_pid "$relay"
  ((status == 0)) || { cat "$relay_log" >&2; fail "the $name relay exited $status on SIGTERM"; }
}
relay_alive() { kill -0 "$tracer" 2>/dev/null || { cat "$relay_log" >&2; fail "the relay exited"; }; }
serving() {
  relay_alive && "$bin" healthcheck --url "http://127.0.0.1:$relay_port/healthz" >/dev/null 2>&1
}

all_delivered() {
  relay_alive
  local id
  for id in "${events[@]}"; do grep -qx "$id" "$deliveries" || return 1; done
}
relay_until_sigterm relay-webhook "http://127.0.0.1:$receiver_port/events" all_delivered
# /proc/sys is hidden: the relay id must come from HOSTNAME (the unit sets it to %H).
grep -q "relay_id=$hostname-" "$work/relay-webhook.log" ||
  fail "the relay id does not carry HOSTNAME: $(grep -m1 relay_id "$work/relay-webhook.log")"
ok "ExecStart (outbox relay) published all ${#events[@]} events to a webhook, took its id from HOSTNAME, exited 0 on SIGTERM"

# An unreachable Kafka broker: the producer is made (/readyz then says why the relay is not
# ready), librdkafka's threads start and try to connect, and SIGTERM stops them.
kafka_started() {
  relay_alive
  local readiness
  readiness=$("$bin" healthcheck --url "http://127.0.0.1:$relay_port/readyz" 2>&1 || true)
  [[ $readiness == *"broker unreachable"* ]] &&
    grep -q 'PR_SET_NAME, "rdk:broker' "$traces/relay-kafka.trace"
}
kafka_port=
free_port kafka_port
relay_until_sigterm relay-kafka "kafka://127.0.0.1:$kafka_port" kafka_started
ok "outbox relay with Kafka (unreachable) started librdkafka and exited 0 on SIGTERM"

summary=$("$python" "$here/sandbox.py" "$unit" "$state" "$traces"/*.trace) || fail "the binary leaves the unit's sandbox (above)"
ok "sandbox: $summary"

# ---- 4. relay.env.example names only variables the relay reads --------------------------------

# The config file's top-level keys, which OUTBOX_<KEY>[__…] variables set (config.rs, KEYS).
keys=$(sed -n '/^const KEYS/,/^];/p' crates/outbox-cli/src/config.rs | grep -o '"[a-z_]*"' | tr -d '"')
[[ -n $keys ]] || fail "could not read the config keys from crates/outbox-cli/src/config.rs"
while read -r variable; do
  key=$(tr 'A-Z' 'a-z' <<<"${variable#OUTBOX_}")
  key=${key%%__*}
  grep -qx "$key" <<<"$keys" || fail "$env_example: $variable is no setting of the relay"
done < <(grep -oE '^#?OUTBOX_[A-Z0-9_]+' "$env_example" | tr -d '#' | sort -u)
ok "every OUTBOX_* variable in $env_example is a setting of the relay"

echo "deploy/systemd: all checks passed in $((SECONDS - started))s"
