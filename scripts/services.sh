#!/usr/bin/env bash
# Make sure the services the tests use are running, with the start commands of SERVICES.md.
# Idempotent: a service already listening is left alone, a binary already installed too.
set -uo pipefail

up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_up() {
    local name=$1 port=$2
    for _ in $(seq 1 60); do
        if up "$port"; then echo "services: $name is up on $port"; return 0; fi
        sleep 0.5
    done
    echo "services: $name did not come up on $port" >&2
    return 1
}

need() {  # install a Debian package when its binary is missing (CI runs as root)
    command -v "$1" >/dev/null 2>&1 || [ -x "$2" ] && return 0
    echo "services: $1 missing; installing $3"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$3"
}

status=0
if ! up 5432; then
    echo "services: starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start
fi
wait_up PostgreSQL 5432 || status=1

if ! up 6379; then
    need redis-server /usr/bin/redis-server redis-server
    echo "services: starting Redis"
    mkdir -p /var/lib/redis /var/log/redis
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
        --dir /var/lib/redis --logfile /var/log/redis/ci.log
fi
wait_up Redis 6379 || status=1

if ! up 4222; then
    need nats-server /usr/sbin/nats-server nats-server
    echo "services: starting NATS with JetStream"
    mkdir -p /var/lib/nats-server
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
        -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
fi
wait_up NATS 4222 || status=1

# Not a service: tests/postgres/test_pgbouncer.py starts its own PgBouncer from this binary.
need pgbouncer /usr/sbin/pgbouncer pgbouncer || status=1
exit $status
