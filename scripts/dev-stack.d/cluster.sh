# shellcheck shell=bash
# scripts/dev-stack.d/cluster.sh: sourced by scripts/dev-stack. The 3-node
# Redis Cluster of `up --cluster` (cluster_up, cluster_stop, its health
# checks) and the replica per master of `--cluster-replicas`
# (cluster_replicas_up, cluster_replicas_stop). Builds on redis.sh.

# --- Redis Cluster ---------------------------------------------------------
cluster_node_ok() { [[ $(rcli "$1" CLUSTER INFO | tr -d '\r' | sed -n 's/^cluster_state://p') == ok ]]; }
cluster_all_ok() {
    local p
    for p in "${CLUSTER_PORTS[@]}"; do cluster_node_ok "$p" || return 1; done
}
cluster_info_field() { rcli "$1" CLUSTER INFO | tr -d '\r' | sed -n "s/^$2://p"; }

cluster_up() {
    ensure_packages redis-server redis-cli
    local p
    for p in "${CLUSTER_PORTS[@]}"; do
        # A cluster node also listens on its bus port, port + 10000.
        if ! pid_alive "$CLUSTER_DIR/$p/redis.pid" redis-server && port_open $((p + 10000)); then
            die "port $((p + 10000)) (cluster bus of node $p) is in use by $(port_owner $((p + 10000))); set DEDUCTOR_CLUSTER_PORTS"
        fi
        redis_start "cluster node $p" "$p" "$CLUSTER_DIR/$p" \
            "cluster-enabled yes" \
            "cluster-config-file nodes.conf" \
            "cluster-node-timeout 5000" \
            "appendfsync everysec"
    done
    # Already formed (second `up`, or nodes restarted with their nodes.conf)?
    if wait_cluster_ok 2; then
        log "redis cluster already formed (${CLUSTER_PORTS[*]})"
        return 0
    fi
    # Fresh nodes: each knows only itself and owns no slot -> create.
    local fresh=1
    for p in "${CLUSTER_PORTS[@]}"; do
        if [[ $(cluster_info_field "$p" cluster_known_nodes) != 1 ||
            $(cluster_info_field "$p" cluster_slots_assigned) != 0 ]]; then
            fresh=0
        fi
    done
    if ((fresh)); then
        local addrs=()
        for p in "${CLUSTER_PORTS[@]}"; do addrs+=("127.0.0.1:$p"); done
        log "creating redis cluster: ${addrs[*]}"
        redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes \
            >"$CLUSTER_DIR/create.log" 2>&1 ||
            die "redis-cli --cluster create failed; see $CLUSTER_DIR/create.log"
    fi
    wait_cluster_ok 30 ||
        die "redis cluster on ${CLUSTER_PORTS[*]} is not cluster_state:ok (half-formed?); run: scripts/dev-stack down --wipe"
    log "redis cluster ok"
}

wait_cluster_ok() {
    local deadline=$((SECONDS + $1))
    while :; do
        cluster_all_ok && return 0
        ((SECONDS < deadline)) || return 1
        sleep 0.2
    done
}

cluster_stop() {
    local p
    for p in "${CLUSTER_PORTS[@]}"; do
        stop_pid "$CLUSTER_DIR/$p/redis.pid" redis-server "cluster node $p" 10
    done
}

# One replica per master: started as a cluster node, then attached with
# `redis-cli --cluster add-node --cluster-slave` (skipped when it already is).
cluster_replicas_up() {
    ((${#CLUSTER_REPLICA_PORTS[@]} == ${#CLUSTER_PORTS[@]})) ||
        die "DEDUCTOR_CLUSTER_REPLICA_PORTS needs one port per master (${#CLUSTER_PORTS[@]})"
    local i p r id
    for i in "${!CLUSTER_PORTS[@]}"; do
        p=${CLUSTER_PORTS[$i]} r=${CLUSTER_REPLICA_PORTS[$i]}
        if ! pid_alive "$CLUSTER_DIR/$r/redis.pid" redis-server && port_open $((r + 10000)); then
            die "port $((r + 10000)) (cluster bus of replica $r) is in use by $(port_owner $((r + 10000))); set DEDUCTOR_CLUSTER_REPLICA_PORTS"
        fi
        redis_start "cluster replica $r" "$r" "$CLUSTER_DIR/$r" \
            "cluster-enabled yes" \
            "cluster-config-file nodes.conf" \
            "cluster-node-timeout 5000" \
            "appendfsync always"
        if [[ $(rcli "$r" ROLE | head -n1 | tr -d '\r') == slave ]]; then
            continue
        fi
        id=$(rcli "$p" CLUSTER MYID | tr -d '\r')
        [[ -n $id ]] || die "cluster master $p gave no node id"
        log "attaching replica $r to master $p"
        redis-cli --cluster add-node "127.0.0.1:$r" "127.0.0.1:$p" --cluster-slave \
            --cluster-master-id "$id" >>"$CLUSTER_DIR/create.log" 2>&1 ||
            die "adding replica $r failed; see $CLUSTER_DIR/create.log"
    done
    local deadline=$((SECONDS + 30))
    for r in "${CLUSTER_REPLICA_PORTS[@]}"; do
        until [[ $(rcli "$r" INFO replication | tr -d '\r' | sed -n 's/^master_link_status://p') == up ]]; do
            ((SECONDS < deadline)) || die "cluster replica $r did not sync with its master within 30s; see $CLUSTER_DIR/$r/redis.log"
            sleep 0.2
        done
    done
    wait_cluster_ok 30 || die "redis cluster is not cluster_state:ok after adding replicas"
    log "redis cluster replicas ok (${CLUSTER_REPLICA_PORTS[*]})"
}

cluster_replicas_stop() {
    local r
    for r in "${CLUSTER_REPLICA_PORTS[@]}"; do
        stop_pid "$CLUSTER_DIR/$r/redis.pid" redis-server "cluster replica $r" 10
    done
}
