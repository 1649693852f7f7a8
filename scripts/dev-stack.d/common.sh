# shellcheck shell=bash
# scripts/dev-stack.d/common.sh: sourced by scripts/dev-stack (not run on its
# own). Logging (log, die, the ERR trap), ports (port_open, port_owner),
# processes and pidfiles (proc_running, pid_alive, stop_pid), the state dir
# and its lock (init_state), and the Debian packages (ensure_packages).
# Uses the settings of scripts/dev-stack (STATE_DIR, MARKER_FILE...).

# ---------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------
log() { printf 'dev-stack: %s\n' "$*" >&2; }
die() {
    printf 'dev-stack: error: %s\n' "$*" >&2
    exit 1
}
# Any command failing unexpectedly (set -e) still ends with a single line.
# shellcheck disable=SC2154  # rc is assigned by the trap itself
trap 'rc=$?; printf "dev-stack: error: command failed (exit %s) at line %s: %s\n" "$rc" "$LINENO" "$BASH_COMMAND" >&2; exit "$rc"' ERR

# True if something accepts TCP connections on 127.0.0.1:$1.
port_open() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Best-effort description of who listens on a port (for error messages).
port_owner() {
    local out=""
    if command -v ss >/dev/null 2>&1; then
        out=$(ss -Hltnp "sport = :$1" 2>/dev/null | grep -o 'users:(([^)]*))' | head -n1 || true)
    fi
    printf '%s' "${out:-unknown process}"
}

# True if process $1 exists and is not a zombie (an exited daemon whose
# parent, e.g. a minimal PID 1, has not reaped it yet counts as gone). A
# process whose main thread has exited shows Z while its other threads are
# still exiting and still hold its sockets (a SIGKILLed JVM on a loaded
# machine): it runs while any of its threads is not a zombie.
proc_running() {
    local status state
    [[ -d /proc/$1 ]] || return 1
    for status in "/proc/$1/task/"*/status; do
        state=$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' "$status" 2>/dev/null) || continue
        [[ -n $state && $state != Z && $state != X ]] && return 0
    done
    return 1
}

# port_closes PORT SECONDS: true once nothing accepts on 127.0.0.1:PORT,
# waiting up to SECONDS (a process that just exited may still be closing
# its listening socket).
port_closes() {
    local deadline=$((SECONDS + $2))
    while port_open "$1"; do
        ((SECONDS < deadline)) || return 1
        sleep 0.2
    done
}

# pid_alive PIDFILE PATTERN: true if the pid in PIDFILE runs and its command
# line contains PATTERN (guards against a recycled pid).
pid_alive() {
    local pid
    [[ -s $1 ]] || return 1
    pid=$(<"$1")
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    proc_running "$pid" || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$2"
}

# pid_gone PIDFILE PATTERN: the process is not alive, and still not a second
# later. A process started by `bash -c 'echo $$ >PIDFILE; exec ...'` can read
# as not alive for an instant while it execs (its /proc entries are being
# replaced): one look made `start-kafka` report a starting broker as exited.
pid_gone() {
    pid_alive "$1" "$2" && return 1
    sleep 1
    ! pid_alive "$1" "$2"
}

# stop_pid PIDFILE PATTERN NAME TIMEOUT [SIGNAL]: SIGTERM (or SIGNAL), wait
# up to TIMEOUT seconds, then SIGKILL. Removes the pidfile. No-op if not running.
stop_pid() {
    local pidfile=$1 pattern=$2 name=$3 timeout=$4 sig=${5:-TERM} pid
    if ! pid_alive "$pidfile" "$pattern"; then
        rm -f "$pidfile"
        return 0
    fi
    pid=$(<"$pidfile")
    log "stopping $name (pid $pid, SIG$sig)"
    kill "-$sig" "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + timeout))
    while proc_running "$pid" && ((SECONDS < deadline)); do
        sleep 0.2
    done
    if proc_running "$pid"; then
        log "$name did not stop within ${timeout}s, sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        deadline=$((SECONDS + 10))
        while proc_running "$pid" && ((SECONDS < deadline)); do sleep 0.1; done
        ! proc_running "$pid" || die "$name (pid $pid) survives SIGKILL"
    fi
    rm -f "$pidfile"
}

# Create the state dir (with a marker so that `down --wipe` never deletes a
# directory this script did not create) and take the lock that serialises
# concurrent invocations (tests may call us in parallel). Fd 9 holds the lock;
# every daemon we start gets `9>&-` so it does not inherit it.
init_state() {
    mkdir -p "$STATE_DIR"
    [[ -e $MARKER_FILE ]] || echo "state dir of scripts/dev-stack (safe to delete)" >"$MARKER_FILE"
    exec 9>>"$STATE_DIR/.lock"
    flock -w 600 9 || die "another dev-stack command holds $STATE_DIR/.lock for >600s"
}

# ---------------------------------------------------------------------------
# Packages
# ---------------------------------------------------------------------------
APT_UPDATED=0

# ensure_packages CMD... : make sure each command exists, apt-installing the
# Debian package that provides it when we are root (or have password-less sudo).
ensure_packages() {
    local cmd pkg missing=()
    for cmd in "$@"; do
        command -v "$cmd" >/dev/null 2>&1 && continue
        case $cmd in
        redis-server) pkg=redis-server ;;
        redis-cli) pkg=redis-tools ;;
        kcat) pkg=kcat ;;
        java) pkg=java ;; # resolved below
        mvn) pkg=maven ;;
        openssl) pkg=openssl ;;
        *) die "internal: no package known for $cmd" ;;
        esac
        [[ " ${missing[*]-} " == *" $pkg "* ]] || missing+=("$pkg")
    done
    ((${#missing[@]} > 0)) || return 0

    local sudo=()
    if ((EUID != 0)); then
        if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
            sudo=(sudo -n)
        else
            die "missing commands ($*); install: apt-get install -y ${missing[*]/#java/openjdk-17-jre-headless}"
        fi
    fi
    if ((APT_UPDATED == 0)); then
        log "apt-get update (missing: ${missing[*]})"
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 ||
            die "apt-get update failed"
        APT_UPDATED=1
    fi
    # Java: openjdk-17 where Debian has it (bookworm), else the default JRE.
    local i
    for i in "${!missing[@]}"; do
        if [[ ${missing[$i]} == java ]]; then
            if apt-cache show openjdk-17-jre-headless >/dev/null 2>&1; then
                missing[i]=openjdk-17-jre-headless
            else
                missing[i]=default-jre-headless
            fi
        fi
    done
    log "apt-get install ${missing[*]}"
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 ||
        die "apt-get install ${missing[*]} failed"
    for cmd in "$@"; do
        command -v "$cmd" >/dev/null 2>&1 || die "$cmd still missing after apt-get install"
    done
}
