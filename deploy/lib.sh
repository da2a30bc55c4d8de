# Shell helpers the deploy/*/check.sh scripts share. A script sets `started=$SECONDS` before it
# sources this file, and the array `pids` (processes to kill at exit) before it starts any.

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
ok() { echo "ok [$((SECONDS - started))s]: $*"; }

# Installs Debian packages that are missing, quietly (CI starts from a fresh machine).
need_packages() {
  local missing=() package
  for package in "$@"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" ||
      missing+=("$package")
  done
  ((${#missing[@]} == 0)) && return 0
  echo "installing ${missing[*]}"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    >/dev/null
}

# Sets `bin` to the absolute path of the outbox binary under test (OUTBOX_BIN, default
# target/debug/outbox), failing when there is none.
find_binary() {
  bin=${OUTBOX_BIN:-target/debug/outbox}
  [[ -x $bin ]] || fail "$bin is not an executable outbox binary (build it, or set OUTBOX_BIN)"
  bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
}

# A process waited for is not killed at exit: its PID may belong to another one by then.
forget_pid() {
  local kept=() pid
  for pid in "${pids[@]}"; do [[ $pid == "$1" ]] || kept+=("$pid"); done
  pids=("${kept[@]}")
}

# Polls a command until it succeeds: wait_for SECONDS WHAT COMMAND...
wait_for() {
  local timeout=$1 what=$2
  shift 2
  local deadline=$((SECONDS + timeout))
  until "$@"; do
    ((SECONDS < deadline)) || fail "timed out after ${timeout}s waiting for $what"
    sleep 0.2
  done
}

# free_port NAME: sets NAME to a TCP port above 20000 on which nothing listens, and not one
# picked before (callers declare NAME first: `printf -v` assigns it).
picked=()
free_port() {
  local port _
  for _ in $(seq 1 200); do
    port=$((20000 + RANDOM % 40000))
    [[ " ${picked[*]} " == *" $port "* ]] && continue
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      picked+=("$port")
      printf -v "$1" %s "$port"
      return 0
    fi
  done
  fail "no free port found above 20000"
}
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
