"""Does `outbox` keep within the sandbox of outbox-relay.service?

Reads the unit's sandbox settings and `strace -f` logs of the commands the unit runs (its
ExecStartPre and ExecStart, run by check.sh as an unprivileged user in a state directory),
and fails when the process did something the sandbox forbids, which under systemd would kill
it or fail a call it may not survive:

* SystemCallFilter: every system call made is in the allowed set (the allow list's groups
  minus the `~` lists', expanded by `systemd-analyze syscall-filter`);
* RestrictAddressFamilies: every socket is of an allowed family, or listed in REFUSED_SOCKETS
  with why its refusal is harmless;
* MemoryDenyWriteExecute: no mapping both writable and executable, no mprotect to executable;
* RestrictNamespaces: no clone/unshare/setns into new namespaces;
* LockPersonality: personality() only queried;
* ProcSubset=pid: every file of /proc outside the process's own directories that the binary
  reads is listed in HIDDEN_PROC_FILES with why its absence is harmless;
* PrivateDevices: only the pseudo devices are opened;
* ProtectSystem=strict: files are written only in the state directory and /tmp.

    python3 sandbox.py UNIT STATE_DIRECTORY TRACE...
"""

import functools
import re
import subprocess
import sys

# Files of /proc that ProcSubset=pid hides and that the binary reads, each with why it copes.
HIDDEN_PROC_FILES = {
    "/proc/sys/kernel/hostname": "the relay's host name; it falls back to HOSTNAME, which the "
    "unit sets (Environment=HOSTNAME=%H)",
    "/proc/sys/vm/overcommit_memory": "mimalloc's overcommit probe; unreadable, it assumes "
    "the Linux default (overcommit on)",
}
# Sockets of a family RestrictAddressFamilies refuses (socket() fails with EAFNOSUPPORT) that
# the binary asks for, each with why it copes. Matched against the start of the arguments.
REFUSED_SOCKETS = {
    "AF_NETLINK, SOCK_RAW|SOCK_CLOEXEC, NETLINK_ROUTE": "glibc's getaddrinfo with AI_ADDRCONFIG "
    "(librdkafka's resolver) asks which address families are configured; refused, it assumes "
    "both IPv4 and IPv6 are",
}
# What PrivateDevices=yes leaves in /dev.
PSEUDO_DEVICES = re.compile(r"/dev/(null|zero|full|random|urandom|tty|ptmx|pts/.*|shm/.*|fd/.*|std(in|out|err))$")
CLONE_NEW = re.compile(r"CLONE_NEW[A-Z]+")
# A call's first line: "PID name(arguments…" (a call resumed later has them on this line).
LINE = re.compile(r"^\d+\s+(\w+)\((.*)")


@functools.lru_cache(maxsize=None)
def expand(group):
    """The system calls of a `@group` (nested groups expanded), or the name itself."""
    if not group.startswith("@"):
        return frozenset([group])
    out = subprocess.run(
        ["systemd-analyze", "syscall-filter", group], capture_output=True, text=True, check=True
    ).stdout
    names = set()
    for line in out.splitlines()[1:]:
        line = line.strip()
        if line and not line.startswith("#"):
            names |= expand(line)
    return frozenset(names)


def unit_settings(path):
    """The [Service] settings of a unit file: name -> list of values, in order."""
    settings = {}
    section = None
    for raw in open(path, encoding="utf-8"):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
            continue
        if section == "[Service]" and "=" in line:
            key, value = line.split("=", 1)
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def allowed_syscalls(settings):
    allow, deny = set(), set()
    for value in settings.get("SystemCallFilter", []):
        target = allow
        if value.startswith("~"):
            target, value = deny, value[1:]
        for name in value.split():
            target |= expand(name)
    if not allow:
        sys.exit("FAIL: the unit has no SystemCallFilter allow list")
    return allow - deny


def main():
    unit, state_dir, traces = sys.argv[1], sys.argv[2].rstrip("/"), sys.argv[3:]
    settings = unit_settings(unit)

    def on(name):
        return settings.get(name, ["no"])[-1] in ("yes", "true", "on", "1")

    allowed = allowed_syscalls(settings)
    families = set(" ".join(settings.get("RestrictAddressFamilies", [])).split())
    problems = []
    used = set()
    proc_files = set()
    refused_sockets = set()
    for trace in traces:
        for line in open(trace, encoding="utf-8", errors="replace"):
            match = LINE.match(line)
            if not match:
                continue
            name, args = match.groups()
            used.add(name)
            if name in ("socket", "socketpair") and families:
                family = args.split(",", 1)[0].strip()
                refused = next((s for s in REFUSED_SOCKETS if args.startswith(s)), None)
                if refused:
                    refused_sockets.add(refused)
                elif family not in families:
                    problems.append(f"RestrictAddressFamilies: {name}({family}, …) in {trace}")
            if on("MemoryDenyWriteExecute"):
                if name == "mmap" and "PROT_WRITE" in args and "PROT_EXEC" in args:
                    problems.append(f"MemoryDenyWriteExecute: {line.strip()}")
                if name in ("mprotect", "pkey_mprotect") and "PROT_EXEC" in args:
                    problems.append(f"MemoryDenyWriteExecute: {line.strip()}")
            if on("RestrictNamespaces"):
                if name in ("unshare", "setns") or (
                    name in ("clone", "clone3") and CLONE_NEW.search(args)
                ):
                    problems.append(f"RestrictNamespaces: {line.strip()}")
            if on("LockPersonality") and name == "personality":
                if not args.startswith(("0xffffffff", "PER_LINUX)")):
                    problems.append(f"LockPersonality: {line.strip()}")
            if name in ("open", "openat", "openat2", "creat"):
                path = re.search(r'"([^"]*)"', args)
                if not path:
                    continue
                path = path.group(1)
                writes = name == "creat" or re.search(r"O_WRONLY|O_RDWR|O_CREAT", args)
                if path.startswith("/proc/") and not re.match(r"/proc/(self|thread-self|\d+)(/|$)", path):
                    proc_files.add(path)
                if path.startswith("/dev/") and on("PrivateDevices") and not PSEUDO_DEVICES.match(path):
                    problems.append(f"PrivateDevices: opens {path}")
                if writes and path.startswith("/") and not (
                    path.startswith((state_dir + "/", "/tmp/", "/var/tmp/"))
                    or PSEUDO_DEVICES.match(path)
                    or path.startswith("/proc/")
                ):
                    problems.append(f"ProtectSystem=strict: opens {path} for writing")
    if "/proc/sys/kernel/hostname" in proc_files and "HOSTNAME=%H" not in " ".join(
        settings.get("Environment", [])
    ):
        problems.append("the binary reads /proc/sys/kernel/hostname: set Environment=HOSTNAME=%H")
    if settings.get("ProcSubset", [""])[-1] == "pid":
        for path in sorted(proc_files):
            if path not in HIDDEN_PROC_FILES:
                problems.append(
                    f"ProcSubset=pid hides {path}, which the binary reads: check that it copes "
                    "and list it in HIDDEN_PROC_FILES"
                )
    for call in sorted(used - allowed):
        problems.append(f"SystemCallFilter: {call} is not allowed (it fails with EPERM or kills)")
    for problem in dict.fromkeys(problems):
        print("FAIL:", problem, file=sys.stderr)
    if problems:
        sys.exit(1)
    print(
        f"{len(used)} distinct system calls, all allowed by the unit's filter "
        f"({len(allowed)} calls); sockets: {' '.join(sorted(families))}, and refused (each "
        f"copes): {'; '.join(sorted(refused_sockets)) or 'none'}; no W+X memory; hidden /proc "
        f"files read (each copes): {', '.join(sorted(proc_files)) or 'none'}"
    )


if __name__ == "__main__":
    main()
