# shellcheck shell=bash
# scripts/dev-stack.d/valkey.sh: sourced by scripts/dev-stack. Which server
# the Redis nodes run (redis_server_pick): Debian's redis-server, or Valkey
# 8.1 with DEDUCTOR_REDIS_SERVER=valkey. Valkey's bin dir (the wheel's
# valkey-server and valkey-cli, with the redis-server / redis-cli symlinks
# Valkey's own install makes; scripts/install-deps puts them in the cache)
# then goes first on PATH, so that every redis-server and redis-cli of
# redis.sh, cluster.sh and sentinel.sh is Valkey's. The state dir records
# the server it was made with (a Redis 7.0 cannot load a Valkey 8 RDB).

# The version scripts/install-deps pins (one place).
VALKEY_VERSION=$(sed -n 's/^VALKEY_VERSION=//p' "$REPO_DIR/scripts/install-deps")
VALKEY_BIN="$CACHE_DIR/valkey-$VALKEY_VERSION/bin"
REDIS_SERVER=""

# redis_server_pick [--lenient]: DEDUCTOR_REDIS_SERVER, else the server the
# state dir was made with, else redis. Strict (up, start-*): asking for
# another server than the state dir's is an error, and a missing Valkey is
# installed. --lenient (status, env, down, kill-*): the state dir's server
# wins and nothing is installed.
redis_server_pick() {
    [[ -n $REDIS_SERVER ]] && return 0
    local lenient=0 recorded=""
    [[ ${1-} == --lenient ]] && lenient=1
    [[ -s $SERVER_FILE ]] && recorded=$(<"$SERVER_FILE")
    local wanted=${DEDUCTOR_REDIS_SERVER:-${recorded:-redis}}
    case $wanted in
    redis | valkey) ;;
    *) die "DEDUCTOR_REDIS_SERVER=$wanted: use redis or valkey" ;;
    esac
    if [[ -n $recorded && $recorded != "$wanted" ]]; then
        ((lenient)) || die "$STATE_DIR was made with $recorded, not $wanted; use another DEDUCTOR_STACK_DIR (or down --wipe first)"
        wanted=$recorded
    fi
    REDIS_SERVER=$wanted
    [[ $REDIS_SERVER == valkey ]] || return 0
    if ! [[ -x $VALKEY_BIN/valkey-server && -x $VALKEY_BIN/redis-server ]] && ((!lenient)); then
        "$REPO_DIR/scripts/install-deps" --valkey-only 9>&- >&2 ||
            die "could not install Valkey $VALKEY_VERSION (scripts/install-deps --valkey-only)"
    fi
    PATH="$VALKEY_BIN:$PATH"
}

# Record the server in the state dir (at `up`).
redis_server_record() { echo "$REDIS_SERVER" >"$SERVER_FILE"; }

# redis_server_version PORT: "valkey 8.1.8" or "redis 7.0.15" (INFO server).
redis_server_version() {
    local info name version
    info=$(rcli "$1" INFO server | tr -d '\r')
    name=$(sed -n 's/^server_name://p' <<<"$info")
    if [[ $name == valkey ]]; then
        version=$(sed -n 's/^valkey_version://p' <<<"$info")
    else
        name=redis version=$(sed -n 's/^redis_version://p' <<<"$info")
    fi
    printf '%s %s' "$name" "$version"
}
