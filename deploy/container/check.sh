#!/usr/bin/env bash
# Checks deploy/container/Containerfile on a machine that cannot pull images (CI runs it from
# .ci/deploy.sh, after the workspace's debug build). Needs root (debootstrap, chroot).
#
#   1. Lint: every base image pinned to a tag (not `latest`); the runtime stage runs as a
#      numeric non-root USER, has a HEALTHCHECK that is `outbox healthcheck`, ENTRYPOINT
#      ["outbox"], CMD ["relay"], EXPOSE 9187 and OCI labels.
#   2. A root filesystem equal to the runtime stage: `debootstrap --variant=minbase bookworm`
#      (what debian:bookworm-slim is made from) with the image's apt sources, then the runtime
#      stage's own ARG and RUN instructions executed in it (its packages, its user, its data
#      directory: they cannot drift), then the binary where its COPY puts it.
#   3. In that root, as the image's USER and in its WORKDIR: every library the binary links
#      resolves; `outbox --version`; `outbox migrate` of a SQLite file in the data directory;
#      `outbox relay` publishing events written into that file to a webhook receiver on the
#      host, every one arriving; `outbox healthcheck` passing on /healthz and /readyz while the
#      relay runs; SIGTERM stopping the relay with exit 0; `outbox healthcheck` then failing
#      (exit 1); `outbox demo` on the embedded default.
#   4. The runtime stage built with buildah (chroot isolation, vfs storage, the same root
#      filesystem imported as debian:bookworm-slim, the binary standing in for the builder
#      stage); the image's config (user, health check, entrypoint, port, workdir) asserted;
#      `outbox --version` and `outbox migrate` run in it as its user. Skipped, saying so, when
#      buildah cannot run containers on this machine; never skipped once it can.
#
# The builder stage is not built here: it needs the rust image from a registry. Its package
# list was checked by building librdkafka, OpenSSL and zlib linking, aws-lc, ring, SQLite and
# mimalloc in a bookworm root holding only those packages.
#
# Downloads are cached under target/deploy-cache/container/: a rerun takes seconds.
#
#   bash deploy/container/check.sh          # OUTBOX_BIN: default target/debug/outbox
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
containerfile=deploy/container/Containerfile
cache=$repo/target/deploy-cache/container
mirror=http://deb.debian.org/debian
started=$SECONDS

# fail, ok, need_packages, find_binary, forget_pid, wait_for, free_port, listening.
# shellcheck source=deploy/lib.sh
source deploy/lib.sh

[[ $(id -u) == 0 ]] || fail "needs root (debootstrap, chroot, mounting /proc)"
find_binary

need_packages debootstrap python3 util-linux coreutils
python=/usr/bin/python3

work=$(mktemp -d /tmp/outbox-container-check.XXXXXX)
mounts=()
# Everything this run unpacks lives in a tmpfs: buildah's vfs storage holds several copies of
# a root filesystem, and removing them from a disk took a minute; unmounting takes none.
if mount -t tmpfs -o size=4g outbox-container-check "$work" 2>/dev/null; then
  mounts+=("$work")
fi
# uid 10001 writes into the root filesystem from the host side too (the events inserted).
chmod 0755 "$work"
pids=()
# Kills what this run started (by PID), unmounts what it mounted (innermost first) and removes
# its temp dir, buildah's storage with it.
cleanup() {
  local pid i
  for pid in "${pids[@]}"; do
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
    umount "${mounts[i]}" 2>/dev/null || umount -l "${mounts[i]}" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

# ---- 1. lint -----------------------------------------------------------------------------------

# The Containerfile as instructions, one a line: comments dropped, continuations joined.
instructions=$(awk '
  /^[[:space:]]*#/ { next }
  { line = line $0 }
  /\\[[:space:]]*$/ { sub(/\\[[:space:]]*$/, " ", line); next }
  { if (line ~ /[^[:space:]]/) print line; line = "" }
' "$containerfile")
# The runtime stage: everything from the last FROM on.
runtime_stage=$(awk '/^FROM[[:space:]]/ { stage = "" } { stage = stage $0 "\n" } END { printf "%s", stage }' \
  <<<"$instructions")
instruction() { grep -E "^$1([[:space:]]|$)" <<<"$runtime_stage" || true; }

while read -r _ image _; do
  [[ $image == scratch ]] && continue
  [[ $image != *'$'* ]] || fail "FROM $image: a base image named by a variable cannot be checked"
  [[ $image == *@sha256:* || ${image##*/} == *:* ]] || fail "FROM $image: pin the base image to a tag"
  [[ ${image##*:} != latest ]] || fail "FROM $image: pin the base image to a tag, not latest"
done < <(grep -E '^FROM[[:space:]]' <<<"$instructions")
ok "base images pinned: $(grep -E '^FROM[[:space:]]' <<<"$instructions" | awk '{print $2}' | xargs)"

user=$(instruction USER | tail -n 1 | awk '{print $2}')
[[ -n $user ]] || fail "the runtime stage has no USER: it would run as root"
# Numeric, so that a runtime (Kubernetes' runAsNonRoot) can tell it is not root without the
# image's /etc/passwd, and so that chroot below uses the same ids.
[[ $user =~ ^([0-9]+):([0-9]+)$ ]] || fail "USER $user: give a numeric uid:gid"
uid=${BASH_REMATCH[1]}
gid=${BASH_REMATCH[2]}
((uid != 0 && gid != 0)) || fail "USER $user: the runtime stage must not run as root"
ok "runtime stage runs as USER $user"

healthcheck=$(instruction HEALTHCHECK)
[[ -n $healthcheck ]] || fail "the runtime stage has no HEALTHCHECK"
[[ $healthcheck == *'CMD ["outbox", "healthcheck"'* ]] ||
  fail "HEALTHCHECK is not outbox healthcheck (exec form): $healthcheck"
ok "HEALTHCHECK: ${healthcheck#HEALTHCHECK }"
[[ $(instruction ENTRYPOINT) == 'ENTRYPOINT ["outbox"]' ]] || fail "ENTRYPOINT is not [\"outbox\"]"
[[ $(instruction CMD) == 'CMD ["relay"]' ]] || fail "CMD is not [\"relay\"]"
instruction EXPOSE | grep -qw 9187 || fail "the runtime stage does not EXPOSE 9187"
for label in title description licenses source; do
  instruction LABEL | grep -q "org.opencontainers.image.$label=" ||
    fail "no LABEL org.opencontainers.image.$label"
done
ok "ENTRYPOINT [\"outbox\"], CMD [\"relay\"], EXPOSE 9187, OCI labels"

[[ $(head -n 1 <<<"$runtime_stage") =~ ^FROM[[:space:]]+debian:bookworm-slim([[:space:]]|$) ]] ||
  fail "the runtime stage is not FROM debian:bookworm-slim: the root filesystem below is bookworm"

# ---- 2. the runtime stage's root filesystem ----------------------------------------------------

mkdir -p "$cache"
base_tar=$cache/bookworm-minbase-v1.tar
if [[ ! -f $base_tar ]]; then
  echo "debootstrap --variant=minbase bookworm (once; cached in $base_tar)"
  rm -f "$cache"/bookworm-minbase-*.tar "$cache"/runtime-*.tar
  debootstrap --variant=minbase bookworm "$work/base" "$mirror" >"$work/debootstrap.log" 2>&1 ||
    { tail -n 20 "$work/debootstrap.log"; fail "debootstrap failed"; }
  # debian:bookworm-slim's apt sources: the release, its updates, and security updates.
  rm -f "$work/base/etc/apt/sources.list"
  cat >"$work/base/etc/apt/sources.list.d/debian.sources" <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  rm -rf "$work/base/var/lib/apt/lists/"* "$work/base/var/cache/apt/archives/"*.deb
  tar -C "$work/base" -cf "$base_tar.partial" . && mv "$base_tar.partial" "$base_tar"
  rm -rf "$work/base"
fi

rootfs=$work/rootfs
mkdir "$rootfs"
# Runs a command in the root filesystem as root, with the environment a RUN step has.
as_root() {
  chroot "$rootfs" /usr/bin/env -i HOME=/root \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"
}
mount_proc() {
  mount -t proc proc "$rootfs/proc"
  mounts+=("$rootfs/proc")
}
unmount_proc() {
  umount "$rootfs/proc"
  unset 'mounts[${#mounts[@]}-1]'
}

# The runtime stage's ARG and RUN instructions, in order, make the cached part; it is keyed by
# their text, so editing them rebuilds it.
steps=$(grep -E '^(ARG|RUN)[[:space:]]' <<<"$runtime_stage")
runtime_tar=$cache/runtime-$(sha256sum <<<"$(basename "$base_tar") $steps" | cut -c1-16).tar
if [[ ! -f $runtime_tar ]]; then
  echo "running the runtime stage's RUN steps in a bookworm root (cached in $runtime_tar)"
  tar -C "$rootfs" -xf "$base_tar"
  cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
  mount_proc
  args=()
  late=
  while IFS= read -r step; do
    keyword=${step%%[[:space:]]*}
    rest=$(sed -E 's/^[A-Z]+[[:space:]]+//; s/[[:space:]]+$//' <<<"$step")
    case $keyword in
      FROM | LABEL | EXPOSE | HEALTHCHECK | STOPSIGNAL | ENTRYPOINT | CMD) ;;
      ARG)
        name=${rest%%=*}
        value=${rest#*=}
        [[ $rest == *=* ]] || value=
        value=${value#\"}
        value=${value%\"}
        args+=("$name=$value")
        ;;
      RUN)
        [[ -z $late ]] || fail "RUN after $late: check.sh runs every RUN before COPY, WORKDIR and USER"
        [[ $rest != --* ]] || fail "RUN $rest: flags of RUN are not supported by check.sh"
        as_root "${args[@]}" /bin/sh -c "$rest" >"$work/run.log" 2>&1 ||
          { tail -n 30 "$work/run.log"; fail "RUN $rest"; }
        ;;
      COPY | WORKDIR | USER) late=$keyword ;;
      *) fail "$keyword in the runtime stage: check.sh cannot reproduce it; teach it" ;;
    esac
  done <<<"$runtime_stage"
  unmount_proc
  tar -C "$rootfs" -cf "$runtime_tar.partial" . && mv "$runtime_tar.partial" "$runtime_tar"
  find "$cache" -maxdepth 1 -name 'runtime-*.tar' ! -path "$runtime_tar" -delete
else
  tar -C "$rootfs" -xf "$runtime_tar"
fi

# COPY --from=builder <built binary> <destination>: the binary under test stands in.
copy=$(instruction COPY)
[[ $(wc -l <<<"$copy") == 1 && $copy =~ ^COPY[[:space:]]+--from=builder[[:space:]]+([^[:space:]]+)[[:space:]]+([^[:space:]]+)$ ]] ||
  fail "expected one COPY --from=builder SOURCE DEST in the runtime stage: $copy"
built=${BASH_REMATCH[1]}
destination=${BASH_REMATCH[2]}
install -D -m 0755 "$bin" "$rootfs$destination"
workdir=$(instruction WORKDIR | tail -n 1 | awk '{print $2}')
[[ -n $workdir ]] || fail "the runtime stage has no WORKDIR"
mkdir -p "$rootfs$workdir"
ok "root filesystem: bookworm minbase + the runtime stage's RUN steps + $destination"

# ---- 3. the binary in it, as the image's user --------------------------------------------------

mount_proc
image_path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# Runs a command as the image's USER in its WORKDIR with a bare environment, as a container
# would; `exec` keeps the PID, so a background relay's $! is the relay itself.
in_image=(chroot --userspec="$uid:$gid" --groups="$gid" "$rootfs"
  /usr/bin/env -i --chdir="$workdir" PATH="$image_path" HOME=/nonexistent)

unresolved=$(as_root ldd "$destination" | grep 'not found' || true)
[[ -z $unresolved ]] || fail "libraries the binary links are missing from the image: $unresolved"
ok "every library $destination links is in the image: $(as_root ldd "$destination" |
  awk '/=>/ {print $1}' | xargs)"

[[ $("${in_image[@]}" id -u):$("${in_image[@]}" id -g) == "$uid:$gid" ]] ||
  fail "the commands do not run as $uid:$gid"
version=$("${in_image[@]}" outbox --version) || fail "outbox --version failed in the image"
[[ $version == "$("$bin" --version)" ]] || fail "outbox --version in the image: $version"
ok "$version runs in the image as uid $uid"

database=sqlite://outbox.db
migrated=$("${in_image[@]}" outbox migrate --database-url "$database" 2>&1) ||
  fail "outbox migrate in $workdir: $migrated"
[[ $migrated == "outbox outbox_events is up to date" ]] || fail "outbox migrate said: $migrated"
[[ $(stat -c %u "$rootfs$workdir/outbox.db") == "$uid" ]] || fail "the database is not owned by $uid"
ok "outbox migrate created $workdir/outbox.db as uid $uid"

# Events written into the outbox as a writer would (plain SQL, the table's public contract),
# by the image's uid so that SQLite's -wal and -shm files stay its own.
events=(0192f0c4-7d1e-7b3a-9c55-1d2e3f405101 0192f0c4-7d1e-7b3a-9c55-1d2e3f405102
  0192f0c4-7d1e-7b3a-9c55-1d2e3f405103 0192f0c4-7d1e-7b3a-9c55-1d2e3f405104
  0192f0c4-7d1e-7b3a-9c55-1d2e3f405105)
setpriv --reuid="$uid" --regid="$gid" --clear-groups "$python" - "$rootfs$workdir/outbox.db" \
  "${events[@]}" <<'EOF'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], timeout=30)
with db:
    for version, event_id in enumerate(sys.argv[2:], start=1):
        db.execute(
            "INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id,"
            " aggregate_version, event_type, payload) VALUES (?, 'order', '42', ?, 'OrderPlaced', ?)",
            (event_id, version, ('{"order_id":42,"version":%d}' % version).encode()),
        )
EOF

# The broker: a webhook receiver on the host's loopback (the chroot shares the network), which
# records each delivery's webhook-id (the event id) and answers 200.
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


listen_port=
free_port listen_port
relay_log=$work/relay.log
# OUTBOX_HEALTHCHECK_URL as an image would set it: the relay's config loader must ignore it.
"${in_image[@]}" OUTBOX_DATABASE_URL="$database" \
  OUTBOX_BROKER_URL="http://127.0.0.1:$receiver_port/events" \
  OUTBOX_LISTEN="127.0.0.1:$listen_port" \
  OUTBOX_HEALTHCHECK_URL="http://127.0.0.1:$listen_port/healthz" \
  outbox relay >"$relay_log" 2>&1 &
relay=$!
pids+=("$relay")
relay_alive() { kill -0 "$relay" 2>/dev/null || { cat "$relay_log" >&2; fail "the relay exited"; }; }

healthcheck_passes() {
  relay_alive
  "${in_image[@]}" OUTBOX_HEALTHCHECK_URL="http://127.0.0.1:$listen_port$1" outbox healthcheck \
    >"$work/health.out" 2>&1
}
wait_for 30 "outbox healthcheck to pass on /healthz" healthcheck_passes /healthz
[[ $(cat "$work/health.out") == "healthy: 200 OK from http://127.0.0.1:$listen_port/healthz" ]] ||
  fail "outbox healthcheck said: $(cat "$work/health.out")"
ok "outbox healthcheck in the image: $(cat "$work/health.out")"

all_delivered() {
  relay_alive
  local id
  for id in "${events[@]}"; do grep -qx "$id" "$deliveries" || return 1; done
}
wait_for 60 "the ${#events[@]} events at the webhook receiver" all_delivered
nothing_pending() {
  relay_alive
  "${in_image[@]}" outbox status --database-url "$database" --json >"$work/status.json" 2>&1 &&
    "$python" -c 'import json, sys; d = json.load(open(sys.argv[1])); sys.exit(d["pending"] != 0 or d["dead"] != 0)' \
      "$work/status.json"
}
wait_for 30 "outbox status to show nothing pending" nothing_pending
ok "the relay in the image published all ${#events[@]} events to the webhook receiver; status: nothing pending"

wait_for 30 "outbox healthcheck to pass on /readyz" healthcheck_passes /readyz
ok "outbox healthcheck in the image: $(cat "$work/health.out")"

kill -TERM "$relay"
stopped() { ! kill -0 "$relay" 2>/dev/null; }
wait_for 30 "the relay to stop on SIGTERM" stopped
status=0
wait "$relay" || status=$?
forget_pid "$relay"
((status == 0)) || { cat "$relay_log" >&2; fail "the relay exited $status on SIGTERM, not 0"; }
if grep -q " WARN \| ERROR " "$relay_log"; then
  cat "$relay_log" >&2
  fail "the relay logged a warning or an error"
fi
ok "SIGTERM stopped the relay with exit 0"

status=0
"${in_image[@]}" outbox healthcheck --url "http://127.0.0.1:$listen_port/healthz" \
  >"$work/health.out" 2>&1 || status=$?
((status == 1)) || fail "outbox healthcheck exited $status with the relay stopped, not 1"
grep -q "^unhealthy: cannot GET .*refused" "$work/health.out" ||
  fail "outbox healthcheck said: $(cat "$work/health.out")"
ok "outbox healthcheck with the relay stopped: exit 1, $(cat "$work/health.out")"

# The embedded default end to end (SQLite, webhooks over loopback, a relay crash injected).
"${in_image[@]}" mkdir -p tmp
"${in_image[@]}" TMPDIR="$workdir/tmp" outbox demo --orders 30 >"$work/demo.log" 2>&1 ||
  { cat "$work/demo.log"; fail "outbox demo failed in the image"; }
grep -q "0 lost, 0 applied twice: OK" "$work/demo.log" || { cat "$work/demo.log"; fail "outbox demo"; }
ok "outbox demo in the image: 0 lost, 0 applied twice"
unmount_proc

# ---- 4. the runtime stage built with buildah ----------------------------------------------------

need_packages buildah
# Storage of its own, in the temp dir: vfs keeps a full copy of the root per layer, too much
# to cache (the runtime root filesystem above is the cached part).
buildah=(buildah --root "$work/buildah" --runroot "$work/buildah-run" --storage-driver vfs)
export BUILDAH_ISOLATION=chroot
# The same bookworm root stands in for debian:bookworm-slim (no registry here).
container=$("${buildah[@]}" from --pull=never scratch)
"${buildah[@]}" add "$container" "$base_tar" / >/dev/null
"${buildah[@]}" commit -q "$container" docker.io/library/debian:bookworm-slim >/dev/null
# Whether this machine lets buildah run a command in a container at all (a sandbox without
# the mounts chroot isolation makes says so here, whatever the Containerfile holds). The
# containers made here are not removed one by one: the storage goes with the temp dir.
probe_container=$("${buildah[@]}" from --pull=never docker.io/library/debian:bookworm-slim)
if ! probe=$("${buildah[@]}" run "$probe_container" -- true 2>&1); then
  echo "SKIPPED: buildah cannot run a container on this machine: $probe"
  skipped=" (buildah skipped)"
else
  # The builder stage replaced by the binary under test, at the path the runtime stage copies.
  context=$work/context
  mkdir "$context"
  cp "$bin" "$context/outbox"
  {
    echo "FROM scratch AS builder"
    echo "COPY outbox $built"
    sed -n '/^FROM debian:bookworm-slim/,$p' "$containerfile"
  } >"$context/Containerfile"
  "${buildah[@]}" build --pull=never --format docker -f "$context/Containerfile" \
    -t localhost/outbox-check:latest "$context" >"$work/buildah.log" 2>&1 ||
    { tail -n 40 "$work/buildah.log"; fail "buildah could not build the runtime stage"; }
  "${buildah[@]}" inspect --type image localhost/outbox-check:latest >"$work/image.json"
  "$python" - "$work/image.json" "$uid:$gid" "$workdir" <<'EOF' || fail "the built image's config"
import json, sys
config, user, workdir = json.load(open(sys.argv[1]))["Docker"]["config"], sys.argv[2], sys.argv[3]
expected = {
    "User": user,
    "WorkingDir": workdir,
    "Entrypoint": ["outbox"],
    "Cmd": ["relay"],
    "StopSignal": "SIGTERM",
}
problems = [f"{k}: {config.get(k)!r}, expected {v!r}" for k, v in expected.items() if config.get(k) != v]
if (config.get("Healthcheck") or {}).get("Test") != ["CMD", "outbox", "healthcheck"]:
    problems.append(f"Healthcheck: {config.get('Healthcheck')!r}")
if "9187/tcp" not in (config.get("ExposedPorts") or {}):
    problems.append(f"ExposedPorts: {config.get('ExposedPorts')!r}")
if any(e.startswith("OUTBOX_") for e in config.get("Env") or []):
    problems.append("an OUTBOX_* variable is set: it would override a config file")
for problem in problems:
    print("FAIL:", problem, file=sys.stderr)
sys.exit(1 if problems else 0)
EOF
  container=$("${buildah[@]}" from --pull=never localhost/outbox-check:latest)
  # `buildah run` takes the image's user and working directory.
  ran=$("${buildah[@]}" run "$container" -- id -u)
  [[ $ran == "$uid" ]] || fail "buildah run: the image runs as $ran, not $uid"
  ran=$("${buildah[@]}" run "$container" -- outbox --version)
  [[ $ran == "$version" ]] || fail "buildah run outbox --version: $ran"
  ran=$("${buildah[@]}" run "$container" -- outbox migrate --database-url "$database" 2>&1) ||
    fail "buildah run outbox migrate: $ran"
  [[ $ran == "outbox outbox_events is up to date" ]] || fail "buildah run outbox migrate: $ran"
  ok "buildah built the runtime stage: user $uid:$gid, workdir $workdir, health check, entrypoint, port as expected"
  ok "in the built image, as uid $uid: $version; outbox migrate in $workdir"
fi

echo "deploy/container: all checks passed${skipped:-} in $((SECONDS - started))s"
