#!/usr/bin/env bash
# Test services for the gorm-outbox integration tests: PostgreSQL, MariaDB and a
# single-node Apache Kafka broker (KRaft), all local, on 127.0.0.1 only; plus
# PgBouncer in transaction pooling mode in front of that PostgreSQL.
#
# Usage: scripts/services.sh start|stop|restart|env|status|reset
#
#   start   install what is missing (apt-get, mvn), start the three services in
#           parallel (no-op for those already running), wait until each really
#           answers, then print eval-able `export OUTBOX_TEST_...` lines on
#           stdout. Everything else goes to stderr:
#               eval "$(scripts/services.sh start)"
#   env     print the export lines only, start nothing
#   status  tell what runs (exit 0 when all run, 3 otherwise)
#   stop    stop them all (safe when nothing runs)
#   restart stop, then start
#   reset   stop and delete the state directory (data, logs); keeps the jar cache
#   kafka-run MAIN-CLASS [ARGS...]
#           run a Kafka command-line tool with the cached jars, e.g.
#             scripts/services.sh kafka-run org.apache.kafka.tools.TopicCommand \
#               --bootstrap-server 127.0.0.1:59092 --list
#           (producer: org.apache.kafka.tools.ConsoleProducer,
#            consumer: org.apache.kafka.tools.consumer.ConsoleConsumer)
#
# A three-node Kafka cluster (KRaft, replication factor 3, min.insync.replicas
# 2) for the leader-failover chaos test, separate from the services above
# (own ports, state directory and lock; `start`/`stop` leave it alone):
#   start-cluster       start the three nodes (no-op for those running), wait
#                       until each has started and the controller quorum has
#                       a leader, print the export lines:
#                           eval "$(scripts/services.sh start-cluster)"
#   start-cluster-node N  start node N (1..3) when it is not running, and wait
#                       for it (a test restarts a node it killed)
#   stop-cluster        stop the three nodes (resuming paused ones first)
#   status-cluster      tell what runs (exit 0 when all three run, 3 otherwise)
#   env-cluster         print the export lines only
#   reset-cluster       stop-cluster and delete its state directory
#
# Environment (all optional):
#   OUTBOX_SERVICES_DIR           state: data, logs, pid files   (/tmp/gorm-outbox-services)
#   OUTBOX_KAFKA_LIB              Kafka jar cache                 ($HOME/.cache/gorm-outbox/kafka-libs)
#   OUTBOX_PG_PORT                PostgreSQL port                 (55432)
#   OUTBOX_MYSQL_PORT             MariaDB port                    (53306)
#   OUTBOX_KAFKA_PORT             Kafka client listener           (59092)
#   OUTBOX_KAFKA_CONTROLLER_PORT  Kafka KRaft controller listener (59093)
#   OUTBOX_KAFKA_SASL_PORT        Kafka SASL_SSL client listener  (59094)
#   OUTBOX_KAFKA_HEAP             Kafka JVM -Xmx                  (512m)
#   OUTBOX_KAFKA_JIT              the broker JVM's compilers: c1 (starts faster; the
#                                 tests') or full (C1 then C2, as a production broker
#                                 runs; for benchmarks)           (c1)
#   OUTBOX_PGBOUNCER_PORT         PgBouncer (transaction pooling) (56432)
#   OUTBOX_CLUSTER_DIR            the cluster's state             (/tmp/gorm-outbox-cluster)
#   OUTBOX_CLUSTER_PORT           node 1's client listener; node N: +N-1, its controller +N+2
#                                                                 (29192: clients 29192-29194,
#                                                                  controllers 29195-29197)
#   OUTBOX_CLUSTER_HEAP           each cluster node's JVM -Xmx    (512m)
#   OUTBOX_FAST_UNSAFE=1          PostgreSQL without fsync, MariaDB without a flush per commit:
#                                 faster, but a killed server loses acknowledged commits
#                                 (the default is durable, as crash tests need)
#
# Runs as root (system users are created for the database servers); also works
# as an ordinary user when everything needed is already installed.

set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
STATE=${OUTBOX_SERVICES_DIR:-/tmp/gorm-outbox-services}
PG_PORT=${OUTBOX_PG_PORT:-55432}
MYSQL_PORT=${OUTBOX_MYSQL_PORT:-53306}
KAFKA_PORT=${OUTBOX_KAFKA_PORT:-59092}
KAFKA_CTRL_PORT=${OUTBOX_KAFKA_CONTROLLER_PORT:-59093}
KAFKA_LIB=${OUTBOX_KAFKA_LIB:-${HOME:-/root}/.cache/gorm-outbox/kafka-libs}
KAFKA_HEAP=${OUTBOX_KAFKA_HEAP:-512m}
KAFKA_JIT=${OUTBOX_KAFKA_JIT:-c1}
PGB_PORT=${OUTBOX_PGBOUNCER_PORT:-56432}
KAFKA_POM=$SCRIPT_DIR/kafka/pom.xml

PG_TIMEOUT=60
MYSQL_TIMEOUT=60
KAFKA_TIMEOUT=180

DB_NAME=outbox_test
MYSQL_USER=outbox      # created with no password and ALL PRIVILEGES
SVC_USER=outboxsvc     # fallback unprivileged user when postgres/mysql users do not exist

PG_DIR=$STATE/postgres
MY_DIR=$STATE/mariadb
KF_DIR=$STATE/kafka
PGB_DIR=$STATE/pgbouncer

TAG=services
log() { printf '%s [%s] %s\n' "$(date +%H:%M:%S)" "$TAG" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
# A data directory is made in DIR.init and renamed into place once complete,
# so an existing one is whole; start never re-initialises it (a failed
# recovery must not turn into an empty database): only reset discards it.
kept() { echo "its data directory $1 is kept as it is (to discard it: $0 reset)"; }
# check_settings refuses settings that start and restart cannot honour,
# before they stop or start anything.
check_settings() {
	[[ $KAFKA_JIT == c1 || $KAFKA_JIT == full ]] || die "OUTBOX_KAFKA_JIT=$KAFKA_JIT: want c1 or full"
}
show_log() { # file [lines]
	if [[ -s $1 ]]; then
		# a JVM's shutdown buries the cause under its last lines
		if grep -qE '(ERROR|FATAL|Exception)' "$1"; then
			log "first error lines of $1:"
			grep -m 12 -E '(ERROR|FATAL|Exception)' "$1" | cut -c1-400 | sed 's/^/    | /' >&2
		fi
		log "last ${2:-40} lines of $1:"
		tail -n "${2:-40}" "$1" | sed 's/^/    | /' >&2
	else
		log "($1 is empty or missing)"
	fi
}
is_root() { [[ $(id -u) -eq 0 ]]; }
now_us() { local t=${EPOCHREALTIME//[.,]/}; echo "${t:-$((SECONDS * 1000000))}"; }
since() { # T0 (from now_us) -> seconds with one decimal, e.g. 2.4
	local d=$(($(now_us) - $1))
	printf '%d.%d' $((d / 1000000)) $((d % 1000000 / 100000))
}

print_env() {
	printf "export OUTBOX_TEST_POSTGRES_DSN='host=127.0.0.1 port=%s user=postgres dbname=%s sslmode=disable'\n" "$PG_PORT" "$DB_NAME"
	printf "export OUTBOX_TEST_MYSQL_DSN='%s@tcp(127.0.0.1:%s)/%s?parseTime=true&multiStatements=true'\n" "$MYSQL_USER" "$MYSQL_PORT" "$DB_NAME"
	printf "export OUTBOX_TEST_KAFKA_BROKERS='127.0.0.1:%s'\n" "$KAFKA_PORT"
	kf_sasl_print_env
	print_env_pgbouncer
}

# ---------------------------------------------------------------- helpers

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# proc_matches PID PATTERN: the process exists and its command line contains PATTERN
proc_matches() {
	local pid=$1 pat=$2 cmd
	[[ $pid =~ ^[0-9]+$ ]] || return 1
	[[ -r /proc/$pid/cmdline ]] || return 1
	cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
	[[ $cmd == *"$pat"* ]]
}
read_pid() { [[ -s $1 ]] && head -n1 "$1" | tr -dc '0-9'; }

# Run a command as an unprivileged user (when we are root).
as_user() {
	local u=$1
	shift
	if is_root; then runuser -u "$u" -- "$@"; else "$@"; fi
}

ensure_user() {
	local u=$1
	id -u "$u" >/dev/null 2>&1 && return 0
	is_root || die "user $u does not exist and we are not root"
	log "creating system user $u"
	useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$u"
}

# Start a detached daemon: own session, stdin from /dev/null, stdout+stderr to
# LOG, none of our other descriptors (fd 3 is the caller's stdout during
# `start`, fd 9 the lock: a daemon holding them would hang `$(services.sh start)`).
# Its pid is written to PIDFILE.
spawn_detached() { # LOG PIDFILE CMD...
	local logf=$1 pidf=$2
	shift 2
	rm -f "$pidf"
	# shellcheck disable=SC2016 # $$ and $@ belong to the inner bash
	setsid bash -c 'echo $$ >"$0"; exec "$@"' "$pidf" "$@" </dev/null >>"$logf" 2>&1 3>&- 9>&- &
	for _ in $(seq 100); do [[ -s $pidf ]] && return 0; sleep 0.1; done
	return 1
}

rotate_log() { [[ -f $1 ]] && mv -f "$1" "$1.prev"; : >"$1"; }

# Wait until `check` succeeds; fail early when the process PID died.
wait_until() { # TIMEOUT PID CHECK...
	local timeout=$1 pid=$2 t0=$SECONDS
	shift 2
	while ((SECONDS - t0 < timeout)); do
		if "$@" 2>/dev/null; then return 0; fi
		if [[ -n $pid ]] && ! kill -0 "$pid" 2>/dev/null; then
			log "process $pid exited"
			return 1
		fi
		sleep 0.25
	done
	log "timed out after ${timeout}s"
	return 1
}

stop_pid() { # NAME PIDFILE PATTERN
	local name=$1 pidf=$2 pat=$3 pid
	pid=$(read_pid "$pidf" || true)
	if [[ -z $pid ]] || ! proc_matches "$pid" "$pat"; then
		rm -f "$pidf"
		log "$name: not running"
		return 0
	fi
	log "$name: stopping pid $pid"
	kill -TERM "$pid" 2>/dev/null || true
	for _ in $(seq 240); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.25
	done
	if kill -0 "$pid" 2>/dev/null; then
		log "$name: still running after 60s, sending SIGKILL"
		kill -KILL "$pid" 2>/dev/null || true
		sleep 0.5
	fi
	rm -f "$pidf"
	log "$name: stopped"
}

# ------------------------------------------------------------ installation

APT_UPDATED=0
POLICY_RC=/usr/sbin/policy-rc.d
POLICY_RC_OURS=0
cleanup_policy_rc() {
	if [[ $POLICY_RC_OURS == 1 ]]; then rm -f "$POLICY_RC"; POLICY_RC_OURS=0; fi
}
trap cleanup_policy_rc EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

apt_install() {
	is_root || die "need root to apt-get install $*"
	if [[ $APT_UPDATED == 0 ]]; then
		log "apt-get update"
		if ! apt-get update -q </dev/null >>"$STATE/apt.log" 2>&1; then
			show_log "$STATE/apt.log"
			die "apt-get update failed"
		fi
		APT_UPDATED=1
	fi
	# Keep the packages' maintainer scripts from starting system-wide servers
	# (e.g. a MariaDB on 3306): ours run separately, from their own datadirs.
	if [[ ! -e $POLICY_RC ]]; then
		printf '#!/bin/sh\nexit 101\n' >"$POLICY_RC"
		chmod 755 "$POLICY_RC"
		POLICY_RC_OURS=1
	fi
	log "apt-get install $* (output in $STATE/apt.log)"
	local rc=0
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
		-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "$@" \
		</dev/null >>"$STATE/apt.log" 2>&1 || rc=$?
	cleanup_policy_rc
	if ((rc != 0)); then
		show_log "$STATE/apt.log"
		die "apt-get install $* failed (exit $rc)"
	fi
}

pg_bindir() {
	local d best=
	for d in $(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V); do
		[[ -x $d/postgres && -x $d/initdb && -x $d/pg_ctl && -x $d/psql && -x $d/pg_isready ]] && best=$d
	done
	[[ -n $best ]] && echo "$best"
}

find_bin() { # first of the names found on PATH or in /usr/sbin, /usr/bin
	local n
	for n in "$@"; do
		if command -v "$n" >/dev/null 2>&1; then command -v "$n"; return 0; fi
		[[ -x /usr/sbin/$n ]] && { echo "/usr/sbin/$n"; return 0; }
		[[ -x /usr/bin/$n ]] && { echo "/usr/bin/$n"; return 0; }
	done
	return 1
}
mariadbd_bin() { find_bin mariadbd mysqld; }
mariadb_bin() { find_bin mariadb mysql; }
mariadb_admin_bin() { find_bin mariadb-admin mysqladmin; }
mariadb_installdb_bin() { find_bin mariadb-install-db mysql_install_db; }

need_pg_pkgs() { [[ -z $(pg_bindir || true) ]]; }
need_mariadb_pkgs() {
	mariadbd_bin >/dev/null && mariadb_bin >/dev/null && mariadb_admin_bin >/dev/null &&
		mariadb_installdb_bin >/dev/null && return 1
	return 0
}
kafka_jars_ok() {
	[[ -f $KAFKA_LIB/.pom.sha256 ]] && compgen -G "$KAFKA_LIB/kafka_2.13-*.jar" >/dev/null &&
		[[ $(cat "$KAFKA_LIB/.pom.sha256") == $(sha256sum <"$KAFKA_POM" | cut -d' ' -f1) ]]
}
need_java_pkgs() {
	local p=()
	command -v java >/dev/null 2>&1 || p+=(openjdk-17-jre-headless)
	if ! kafka_jars_ok && ! command -v mvn >/dev/null 2>&1; then p+=(maven); fi
	echo "${p[@]}"
}

fetch_kafka_jars() {
	kafka_jars_ok && return 0
	command -v mvn >/dev/null 2>&1 || die "mvn not found"
	local t0 tmp="$KAFKA_LIB.tmp.$$"
	t0=$(now_us)
	log "fetching Kafka jars with mvn ($KAFKA_POM) into $KAFKA_LIB"
	mkdir -p "$(dirname "$KAFKA_LIB")"
	rm -rf "$tmp"
	# (sed: this mvn prints stray colour escapes even in batch mode)
	if ! mvn -q -B -Dstyle.color=never -f "$KAFKA_POM" dependency:copy-dependencies \
		-DoutputDirectory="$tmp" </dev/null 2>&1 | sed 's/\x1b\[[0-9;]*m//g' >&2; then
		rm -rf "$tmp"
		die "mvn dependency:copy-dependencies failed"
	fi
	compgen -G "$tmp/kafka_2.13-*.jar" >/dev/null || die "mvn produced no kafka_2.13 jar in $tmp"
	sha256sum <"$KAFKA_POM" | cut -d' ' -f1 >"$tmp/.pom.sha256"
	rm -rf "$KAFKA_LIB"
	mv "$tmp" "$KAFKA_LIB"
	log "fetched $(compgen -G "$KAFKA_LIB/*.jar" | wc -l) jars ($(du -sh "$KAFKA_LIB" | cut -f1)) in $(since "$t0")s"
}

kafka_version() {
	local j
	j=$(compgen -G "$KAFKA_LIB/kafka_2.13-*.jar" | head -n1) || return 1
	j=${j##*/kafka_2.13-}
	echo "${j%.jar}"
}

# Results of the parallel start jobs: one line per service in $STATE/.result.NAME
record() { # NAME VERSION SECONDS NOTE
	printf '%-8s ready in %5ss  %-40s %s\n' "$1" "$3" "$2" "$4" >"$STATE/.result.$1"
}

# ------------------------------------------------------------- PostgreSQL

# the server user: postgres (from the Debian package) or our own, or just us when not root
pg_user() {
	if ! is_root; then id -un; elif id -u postgres >/dev/null 2>&1; then echo postgres; else echo "$SVC_USER"; fi
}
pg_psql() { "$(pg_bindir)/psql" -X -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -v ON_ERROR_STOP=1 "$@"; }
pg_ready() { "$(pg_bindir)/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres; }
pg_ours_running() {
	local pid
	pid=$(read_pid "$PG_DIR/data/postmaster.pid" || true)
	[[ -n $pid ]] && proc_matches "$pid" "$PG_DIR/data"
}

pg_initdb() {
	local bindir=$1 user=$2
	log "initdb $PG_DIR/data"
	rm -rf "$PG_DIR/data.init"
	mkdir -p "$PG_DIR/data.init"
	chown -R "$user:" "$PG_DIR"
	chmod 700 "$PG_DIR/data.init"
	if ! as_user "$user" "$bindir/initdb" -D "$PG_DIR/data.init" --auth=trust -U postgres -E UTF8 --locale=C \
		--no-sync >"$PG_DIR/initdb.log" 2>&1; then
		show_log "$PG_DIR/initdb.log"
		return 1
	fi
	mv "$PG_DIR/data.init" "$PG_DIR/data"
}

pg_launch() {
	local bindir=$1 user=$2
	rotate_log "$PG_DIR/postgres.log"
	chown "$user:" "$PG_DIR/postgres.log"
	local opts="-c listen_addresses=127.0.0.1 -p $PG_PORT -k $PG_DIR/run"
	# Durable: fsync, synchronous commit and full-page writes on (PostgreSQL's
	# defaults), so that a crash test can tell a lost commit from a library
	# bug. OUTBOX_FAST_UNSAFE=1 turns them off for quick local runs.
	if [[ ${OUTBOX_FAST_UNSAFE:-0} == 1 ]]; then
		opts+=" -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
	fi
	opts+=" -c max_connections=200"
	opts+=" -c shared_buffers=128MB -c max_wal_size=1GB"
	log "pg_ctl start (port $PG_PORT)"
	if ! as_user "$user" setsid -w "$bindir/pg_ctl" start -D "$PG_DIR/data" -l "$PG_DIR/postgres.log" \
		-w -t "$PG_TIMEOUT" -o "$opts" </dev/null >>"$PG_DIR/pg_ctl.log" 2>&1 3>&- 9>&-; then
		show_log "$PG_DIR/pg_ctl.log" 10
		show_log "$PG_DIR/postgres.log"
		return 1
	fi
	wait_until "$PG_TIMEOUT" "" pg_ready || { show_log "$PG_DIR/postgres.log"; return 1; }
}

start_postgres() {
	TAG=postgres
	local t0 bindir user major note=started
	t0=$(now_us)
	bindir=$(pg_bindir) || die "no PostgreSQL server binaries under /usr/lib/postgresql/*/bin"
	major=$(basename "$(dirname "$bindir")")
	user=$(pg_user)
	ensure_user "$user"

	if pg_ours_running && pg_ready; then
		note="already running"
	else
		mkdir -p "$PG_DIR/run"
		if [[ -f $PG_DIR/data/postmaster.pid ]] && ! pg_ours_running; then
			log "removing stale postmaster.pid"
			rm -f "$PG_DIR/data/postmaster.pid"
		fi
		port_open "$PG_PORT" && die "port $PG_PORT is in use by another process (not our PostgreSQL)"
		if [[ ! -d $PG_DIR/data ]]; then pg_initdb "$bindir" "$user" || die "initdb failed"; fi
		chown -R "$user:" "$PG_DIR"
		if ! pg_launch "$bindir" "$user"; then
			as_user "$user" "$bindir/pg_ctl" stop -D "$PG_DIR/data" -m immediate >/dev/null 2>&1 || true
			die "PostgreSQL $major did not start (logs in $PG_DIR); $(kept "$PG_DIR/data")"
		fi
	fi
	if [[ -z $(pg_psql -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$DB_NAME'") ]]; then
		pg_psql -d postgres -c "CREATE DATABASE $DB_NAME" >&2 || die "cannot create database $DB_NAME"
	fi
	local version
	version=$(pg_psql -d "$DB_NAME" -tAc 'SHOW server_version') || die "PostgreSQL does not answer queries"
	local dt
	dt=$(since "$t0")
	log "ready in ${dt}s: PostgreSQL $version on 127.0.0.1:$PG_PORT ($note)"
	record postgres "PostgreSQL $version" "$dt" "$note"
}

stop_postgres() {
	TAG=postgres
	local bindir user
	if ! pg_ours_running; then
		rm -f "$PG_DIR/data/postmaster.pid" 2>/dev/null || true
		log "postgres: not running"
		return 0
	fi
	bindir=$(pg_bindir) || die "no PostgreSQL binaries"
	user=$(pg_user)
	log "postgres: pg_ctl stop -m fast"
	as_user "$user" "$bindir/pg_ctl" stop -D "$PG_DIR/data" -m fast -w -t 60 >&2 ||
		as_user "$user" "$bindir/pg_ctl" stop -D "$PG_DIR/data" -m immediate -w -t 30 >&2 || true
	log "postgres: stopped"
}

# ---------------------------------------------------------------- MariaDB

my_user() {
	if ! is_root; then id -un; elif id -u mysql >/dev/null 2>&1; then echo mysql; else echo "$SVC_USER"; fi
}
my_root() { "$(mariadb_bin)" --no-defaults -uroot --socket="$MY_DIR/mysqld.sock" "$@"; }
my_ping() { "$(mariadb_admin_bin)" --no-defaults -uroot --socket="$MY_DIR/mysqld.sock" --connect-timeout=2 ping >/dev/null 2>&1; }
# mariadbd writes mariadbd.pid itself (as the mysql user); spawn_detached
# records the pid it started in mariadbd.launch.pid (same process).
my_pid() { read_pid "$MY_DIR/mariadbd.pid" || read_pid "$MY_DIR/mariadbd.launch.pid"; }
my_ours_running() {
	local pid
	pid=$(my_pid || true)
	[[ -n $pid ]] && proc_matches "$pid" "$MY_DIR/data"
}

my_installdb() {
	local user=$1
	log "mariadb-install-db $MY_DIR/data"
	rm -rf "$MY_DIR/data.init"
	mkdir -p "$MY_DIR/data.init" "$MY_DIR/tmp"
	chown -R "$user:" "$MY_DIR"
	local args=(--no-defaults --datadir="$MY_DIR/data.init" --auth-root-authentication-method=normal
		--skip-test-db --skip-name-resolve)
	is_root && args+=(--user="$user")
	if ! "$(mariadb_installdb_bin)" "${args[@]}" </dev/null >"$MY_DIR/install-db.log" 2>&1 3>&- 9>&-; then
		show_log "$MY_DIR/install-db.log"
		return 1
	fi
	mv "$MY_DIR/data.init" "$MY_DIR/data"
}

my_launch() {
	local user=$1 pid
	rotate_log "$MY_DIR/mariadbd.log"
	rm -f "$MY_DIR/mariadbd.pid"
	mkdir -p "$MY_DIR/tmp"
	chown -R "$user:" "$MY_DIR"
	local args=(--no-defaults --datadir="$MY_DIR/data" --port="$MYSQL_PORT" --bind-address=127.0.0.1
		--socket="$MY_DIR/mysqld.sock" --pid-file="$MY_DIR/mariadbd.pid" --tmpdir="$MY_DIR/tmp"
		--log-error="$MY_DIR/mariadbd.log" --skip-name-resolve
		--character-set-server=utf8mb4 --collation-server=utf8mb4_general_ci
		--innodb-buffer-pool-size=256M --max-connections=300)
	# Durable: the redo log is flushed at every commit (MariaDB's default), so
	# a killed server keeps every commit a writer saw acknowledged.
	# OUTBOX_FAST_UNSAFE=1 trades that for speed in quick local runs.
	if [[ ${OUTBOX_FAST_UNSAFE:-0} == 1 ]]; then
		args+=(--innodb-flush-log-at-trx-commit=0 --innodb-doublewrite=0)
	else
		args+=(--innodb-flush-log-at-trx-commit=1 --sync-binlog=1)
	fi
	is_root && args+=(--user="$user")
	log "starting mariadbd (port $MYSQL_PORT)"
	spawn_detached "$MY_DIR/mariadbd.out" "$MY_DIR/mariadbd.launch.pid" "$(mariadbd_bin)" "${args[@]}" ||
		{ show_log "$MY_DIR/mariadbd.out"; return 1; }
	pid=$(read_pid "$MY_DIR/mariadbd.launch.pid")
	if ! wait_until "$MYSQL_TIMEOUT" "$pid" my_ping; then
		show_log "$MY_DIR/mariadbd.out" 10
		show_log "$MY_DIR/mariadbd.log"
		kill -KILL "$pid" 2>/dev/null || true
		return 1
	fi
}

# wait_time_wait PORT: mariadbd cannot bind a port that still has connections
# in TIME-WAIT (left by a server stopped a moment ago, e.g. by the previous
# CI run); wait for them to clear, up to 70 s.
wait_time_wait() {
	command -v ss >/dev/null 2>&1 || return 0
	local i
	for ((i = 0; i < 70; i++)); do
		[[ -z $(ss -Htan state time-wait "( sport = :$1 )" 2>/dev/null) ]] && return 0
		((i == 0)) && log "port $1 still has connections in TIME-WAIT; waiting for them to clear (up to 70s)"
		sleep 1
	done
	log "port $1 still has connections in TIME-WAIT after 70s; trying anyway"
}

start_mariadb() {
	TAG=mariadb
	local t0 user note=started
	t0=$(now_us)
	mariadbd_bin >/dev/null || die "mariadbd not found"
	user=$(my_user)
	ensure_user "$user"

	if my_ours_running && my_ping; then
		note="already running"
	else
		local pid
		pid=$(my_pid || true)
		if my_ours_running; then
			# ours but not answering: give it the usual time before giving up on it
			log "mariadbd $pid runs but does not answer yet; waiting"
			wait_until "$MYSQL_TIMEOUT" "$pid" my_ping || die "mariadbd $pid does not answer; try: $0 stop"
		else
			rm -f "$MY_DIR/mariadbd.pid" "$MY_DIR/mariadbd.launch.pid"
			port_open "$MYSQL_PORT" && die "port $MYSQL_PORT is in use by another process (not our MariaDB)"
			rm -f "$MY_DIR/mysqld.sock" "$MY_DIR/mysqld.sock.lock"
			wait_time_wait "$MYSQL_PORT"
			if [[ ! -d $MY_DIR/data ]]; then my_installdb "$user" || die "mariadb-install-db failed"; fi
			my_launch "$user" || die "MariaDB did not start (logs in $MY_DIR); $(kept "$MY_DIR/data")"
		fi
	fi
	my_root -e "
		CREATE DATABASE IF NOT EXISTS \`$DB_NAME\` CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci;
		DROP USER IF EXISTS ''@'localhost';
		DROP USER IF EXISTS ''@'$(hostname)';
		CREATE USER IF NOT EXISTS '$MYSQL_USER'@'%';
		CREATE USER IF NOT EXISTS '$MYSQL_USER'@'localhost';
		GRANT ALL PRIVILEGES ON *.* TO '$MYSQL_USER'@'%' WITH GRANT OPTION;
		GRANT ALL PRIVILEGES ON *.* TO '$MYSQL_USER'@'localhost' WITH GRANT OPTION;
		FLUSH PRIVILEGES;" >&2 || die "cannot set up database/user"
	local version
	version=$("$(mariadb_bin)" --no-defaults -h127.0.0.1 -P"$MYSQL_PORT" -u"$MYSQL_USER" -N -B \
		-e 'SELECT VERSION()' "$DB_NAME") || die "MariaDB does not answer over TCP as $MYSQL_USER"
	local dt
	dt=$(since "$t0")
	log "ready in ${dt}s: MariaDB $version on 127.0.0.1:$MYSQL_PORT ($note)"
	record mariadb "MariaDB $version" "$dt" "$note"
}

stop_mariadb() {
	TAG=mariadb
	local pid
	if ! my_ours_running; then
		rm -f "$MY_DIR/mariadbd.pid" "$MY_DIR/mariadbd.launch.pid"
		log "mariadb: not running"
		return 0
	fi
	pid=$(my_pid)
	echo "$pid" >"$MY_DIR/mariadbd.launch.pid"
	stop_pid mariadb "$MY_DIR/mariadbd.launch.pid" "$MY_DIR/data"
	rm -f "$MY_DIR/mariadbd.pid"
}

# ------------------------------------------------------------------ Kafka

kf_ours_running() {
	local pid
	pid=$(read_pid "$KF_DIR/kafka.pid" || true)
	[[ -n $pid ]] && proc_matches "$pid" "kafka.Kafka $KF_DIR/server.properties"
}
kf_started() {
	port_open "$KAFKA_PORT" && grep -q 'Kafka Server started' "$KF_DIR/kafka.log"
}

kf_write_config() {
	mkdir -p "$KF_DIR"
	cat >"$KF_DIR/server.properties" <<EOF
# generated by scripts/services.sh: single-node KRaft broker+controller for tests
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$KAFKA_CTRL_PORT
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CTRL_PORT,SASL_SSL://127.0.0.1:$KAFKA_SASL_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,SASL_SSL://127.0.0.1:$KAFKA_SASL_PORT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
log.dirs=$KF_DIR/data
num.partitions=8
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
auto.create.topics.enable=true
delete.topic.enable=true
group.initial.rebalance.delay.ms=0
num.network.threads=3
num.io.threads=4
num.recovery.threads.per.data.dir=2
log.retention.hours=24
log.segment.bytes=67108864
EOF
	kf_sasl_properties >>"$KF_DIR/server.properties"
	kf_write_log_config
}

kf_write_log_config() {
	mkdir -p "$KF_DIR"
	cat >"$KF_DIR/log4j.properties" <<'EOF'
log4j.rootLogger=INFO, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka=INFO
log4j.logger.org.apache.kafka=INFO
log4j.logger.state.change.logger=WARN
log4j.logger.kafka.request.logger=WARN
EOF
	cat >"$KF_DIR/log4j2.properties" <<'EOF'
status = warn
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
logger.statechange.name = state.change.logger
logger.statechange.level = WARN
EOF
	# command-line tools: warnings only, on stderr (stdout is the tools' output)
	cat >"$KF_DIR/tools-log4j.properties" <<'EOF'
log4j.rootLogger=WARN, stderr
log4j.appender.stderr=org.apache.log4j.ConsoleAppender
log4j.appender.stderr.Target=System.err
log4j.appender.stderr.layout=org.apache.log4j.PatternLayout
log4j.appender.stderr.layout.ConversionPattern=[%d] %p %m (%c)%n
EOF
	cat >"$KF_DIR/tools-log4j2.properties" <<'EOF'
status = warn
appender.stderr.type = Console
appender.stderr.name = STDERR
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.stderr.ref = STDERR
EOF
}

kf_java() { # MAIN ARGS... (tools; small heap)
	java -Xmx256m -XX:TieredStopAtLevel=1 -Dlog4j.configuration="file:$KF_DIR/tools-log4j.properties" \
		-Dlog4j2.configurationFile="$KF_DIR/tools-log4j2.properties" -cp "$KAFKA_LIB/*" "$@"
}

kf_format() {
	local cid
	# A Kafka cluster id is a base64url-encoded random 16-byte UUID (22 chars).
	cid=$(head -c16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')
	while [[ $cid == -* ]]; do cid=$(head -c16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '='); done
	rm -rf "$KF_DIR/data.init"
	log "formatting KRaft storage (cluster id $cid)"
	rm -f "$KF_DIR/scram-user"
	sed "s|^log.dirs=.*|log.dirs=$KF_DIR/data.init|" "$KF_DIR/server.properties" >"$KF_DIR/format.properties"
	if ! kf_java kafka.tools.StorageTool format -t "$cid" -c "$KF_DIR/format.properties" \
		--add-scram "$(kf_scram_value)" </dev/null >"$KF_DIR/format.log" 2>&1 3>&- 9>&-; then
		show_log "$KF_DIR/format.log"
		return 1
	fi
	mv "$KF_DIR/data.init" "$KF_DIR/data"
	kf_scram_marker >"$KF_DIR/scram-user"
}

kf_launch() {
	local pid t0
	t0=$(now_us)
	rotate_log "$KF_DIR/kafka.log"
	log "starting broker (127.0.0.1:$KAFKA_PORT, controller :$KAFKA_CTRL_PORT)"
	# C1 only (TieredStopAtLevel=1): starts ~30% faster on 2 busy cores and
	# leaves the CPU to the Go compiler; a test broker never needs C2's peak.
	# A benchmark's does: OUTBOX_KAFKA_JIT=full.
	local jit=(-XX:TieredStopAtLevel=1)
	[[ $KAFKA_JIT == full ]] && jit=()
	spawn_detached "$KF_DIR/kafka.log" "$KF_DIR/kafka.pid" \
		java -Xms256m -Xmx"$KAFKA_HEAP" "${jit[@]}" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
		-XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent -Djava.awt.headless=true \
		-Dlog4j.configuration="file:$KF_DIR/log4j.properties" \
		-Dlog4j2.configurationFile="$KF_DIR/log4j2.properties" \
		-Dkafka.logs.dir="$KF_DIR" \
		-cp "$KAFKA_LIB/*" kafka.Kafka "$KF_DIR/server.properties" ||
		{ show_log "$KF_DIR/kafka.log"; return 1; }
	pid=$(read_pid "$KF_DIR/kafka.pid")
	if ! wait_until "$KAFKA_TIMEOUT" "$pid" kf_started; then
		show_log "$KF_DIR/kafka.log" 60
		kill -KILL "$pid" 2>/dev/null || true
		return 1
	fi
	log "broker started in $(since "$t0")s; admin client check"
	t0=$(now_us)
	if ! kf_warmup; then
		show_log "$KF_DIR/kafka.log" 30
		kill -KILL "$pid" 2>/dev/null || true
		return 1
	fi
	log "admin client check passed in $(since "$t0")s"
}

# A round trip with the admin client: proves the broker answers the Kafka
# protocol and, through FindCoordinator, makes the broker create
# __consumer_offsets now rather than during the first test that uses a
# consumer group (that costs ~5 s on a fresh log directory).
kf_warmup() {
	local out rc=0
	out=$(timeout 60 java -Xmx128m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC \
		-Dlog4j.configuration="file:$KF_DIR/tools-log4j.properties" \
		-Dlog4j2.configurationFile="$KF_DIR/tools-log4j2.properties" -cp "$KAFKA_LIB/*" \
		org.apache.kafka.tools.consumer.group.ConsumerGroupCommand --bootstrap-server "127.0.0.1:$KAFKA_PORT" \
		--describe --group outbox-services-warmup </dev/null 2>&1 3>&- 9>&-) || rc=$?
	printf '%s\n' "$out" >"$KF_DIR/warmup.log"
	# the group does not exist: "not found" (4.x) / "does not exist" (3.x) is the expected answer
	if ((rc != 0)) && ! grep -q -i -E 'not found|does not exist' <<<"$out"; then
		log "the broker does not answer an admin client (exit $rc)"
		show_log "$KF_DIR/warmup.log" 10
		return 1
	fi
}

start_kafka() {
	TAG=kafka
	local t0 note=started fetched=0
	t0=$(now_us)
	command -v java >/dev/null 2>&1 || die "java not found"
	# the SASL_SSL listener's certificates (keytool, ~2 s once), meanwhile
	local tls_pid=
	if ! kf_tls_ok; then
		kf_tls_make &
		tls_pid=$!
	fi
	if ! kafka_jars_ok; then
		fetched=1
		if kf_ours_running; then
			log "scripts/kafka/pom.xml changed: stopping the running broker before replacing its jars"
			stop_kafka
			TAG=kafka
		fi
	fi
	fetch_kafka_jars
	local tf
	tf=$(since "$t0")
	local version
	version=$(kafka_version)
	if kf_ours_running && port_open "$KAFKA_PORT" && ! kf_sasl_listening; then
		log "the running broker has no SASL_SSL listener on :$KAFKA_SASL_PORT: restarting it"
		stop_kafka
		TAG=kafka
	fi
	if kf_ours_running && port_open "$KAFKA_PORT"; then
		note="already running"
	else
		local pid
		pid=$(read_pid "$KF_DIR/kafka.pid" || true)
		if kf_ours_running; then
			log "broker $pid runs but does not answer yet; waiting"
			wait_until "$KAFKA_TIMEOUT" "$pid" port_open "$KAFKA_PORT" || die "broker $pid does not answer; try: $0 stop"
		else
			rm -f "$KF_DIR/kafka.pid"
			port_open "$KAFKA_PORT" && die "port $KAFKA_PORT is in use by another process (not our Kafka)"
			port_open "$KAFKA_CTRL_PORT" && die "port $KAFKA_CTRL_PORT is in use by another process (not our Kafka)"
			port_open "$KAFKA_SASL_PORT" && die "port $KAFKA_SASL_PORT is in use by another process (not our Kafka)"
			kf_write_config
			if [[ ! -d $KF_DIR/data ]]; then kf_format || die "kafka storage format failed"; fi
			if [[ -n $tls_pid ]]; then wait "$tls_pid" || die "could not make the SASL_SSL listener's certificates with keytool"; fi
			kf_tls_ok || die "no SASL_SSL certificates in $KF_TLS"
			kf_launch || die "Kafka $version did not start (logs in $KF_DIR); $(kept "$KF_DIR/data")"
		fi
	fi
	kf_sasl_ensure_user || die "could not create the SCRAM user $KAFKA_SASL_USER"
	((fetched)) && note+=", incl. jar fetch ${tf}s"
	local dt
	dt=$(since "$t0")
	log "ready in ${dt}s: Kafka $version on 127.0.0.1:$KAFKA_PORT, SASL_SSL on :$KAFKA_SASL_PORT ($note)"
	record kafka "Kafka $version" "$dt" "$note"
}

stop_kafka() {
	TAG=kafka
	if ! kf_ours_running; then
		rm -f "$KF_DIR/kafka.pid"
		log "kafka: not running"
		return 0
	fi
	stop_pid kafka "$KF_DIR/kafka.pid" "kafka.Kafka $KF_DIR/server.properties"
}

# ------------------------------------------------- Kafka: SASL_SSL listener
#
# Besides PLAINTEXT, the broker has a SASL_SSL listener on KAFKA_SASL_PORT
# (SCRAM-SHA-512 and PLAIN) for the secured-Kafka tests. Its certificates are
# made once with the JDK's keytool in $KF_DIR/tls: a CA, a broker keystore
# whose certificate the CA signed (SAN 127.0.0.1 and localhost), a truststore
# with the CA, and ca.pem, the CA in PEM for Go clients. The SCRAM user is
# created with Kafka's own tools: by `kafka-storage format --add-scram` on a
# fresh log directory, else (a directory formatted before the listener
# existed) with kafka-configs against the running broker. The controller and
# inter-broker listeners stay PLAINTEXT. Test-only credentials, on 127.0.0.1.

KAFKA_SASL_PORT=${OUTBOX_KAFKA_SASL_PORT:-59094}
KAFKA_SASL_USER=outbox
KAFKA_SASL_PASSWORD=outbox-test-secret
KF_TLS=$KF_DIR/tls
KF_TLS_PASS=outbox-test-store

# the SCRAM credential as kafka-storage format --add-scram spells it
kf_scram_value() { printf 'SCRAM-SHA-512=[name=%s,password=%s]' "$KAFKA_SASL_USER" "$KAFKA_SASL_PASSWORD"; }
# what $KF_DIR/scram-user holds once that user exists in the metadata log
kf_scram_marker() { printf '%s %s\n' "$KAFKA_SASL_USER" "$(printf %s "$KAFKA_SASL_PASSWORD" | sha256sum | cut -d' ' -f1)"; }
kf_scram_done() { [[ -f $KF_DIR/scram-user && $(cat "$KF_DIR/scram-user") == "$(kf_scram_marker)" ]]; }

kf_tls_ok() {
	[[ -s $KF_TLS/broker.p12 && -s $KF_TLS/truststore.p12 && -s $KF_TLS/ca.pem ]]
}

# keytool, C1 only and serial GC: it is short-lived, like the Kafka tools.
# One PBE/MAC iteration instead of 10000: these are throw-away test stores,
# and the iterations are most of keytool's time on a busy machine.
kf_keytool() {
	keytool -J-XX:TieredStopAtLevel=1 -J-XX:+UseSerialGC -J-Dkeystore.pkcs12.certPbeIterationCount=1 \
		-J-Dkeystore.pkcs12.keyPbeIterationCount=1 -J-Dkeystore.pkcs12.macIterationCount=1 \
		-storepass "$KF_TLS_PASS" "$@"
}

# kf_tls_make: the CA, the broker keystore, the truststore and ca.pem, made
# in a scratch directory and moved into place whole (no-op when present).
kf_tls_make() {
	kf_tls_ok && return 0
	command -v keytool >/dev/null 2>&1 || { log "keytool not found (it comes with the JDK)"; return 1; }
	local t0 d="$KF_TLS.tmp.$$" san='SAN=ip:127.0.0.1,dns:localhost'
	t0=$(now_us)
	rm -rf "$d"
	mkdir -p "$d"
	# EC P-256 keys: RSA key generation takes seconds in keytool, EC a fraction.
	# The broker's key pair is made and signed in the CA's keystore (-signer),
	# then copied alone into its own keystore with the chain (broker, CA).
	if ! {
		kf_keytool -genkeypair -keystore "$d/ca.p12" -storetype PKCS12 -alias ca -dname 'CN=gorm-outbox test CA' \
			-keyalg EC -groupname secp256r1 -validity 3650 -ext bc:c -ext KU:c=keyCertSign,cRLSign &&
			kf_keytool -genkeypair -keystore "$d/ca.p12" -alias broker -signer ca -dname 'CN=localhost' \
				-keyalg EC -groupname secp256r1 -validity 3650 -ext "$san" \
				-ext KU:c=digitalSignature -ext EKU=serverAuth &&
			kf_keytool -importkeystore -srckeystore "$d/ca.p12" -srcstorepass "$KF_TLS_PASS" -srcalias broker \
				-destkeystore "$d/broker.p12" -deststoretype PKCS12 -deststorepass "$KF_TLS_PASS" -noprompt &&
			kf_keytool -exportcert -keystore "$d/ca.p12" -alias ca -rfc -file "$d/ca.pem" &&
			kf_keytool -importcert -keystore "$d/truststore.p12" -storetype PKCS12 -alias ca -file "$d/ca.pem" -noprompt
	} </dev/null >"$d/keytool.log" 2>&1 3>&- 9>&-; then
		show_log "$d/keytool.log" 20
		return 1
	fi
	chmod 644 "$d/ca.pem"
	rm -rf "$KF_TLS"
	mv "$d" "$KF_TLS"
	log "TLS: CA, broker keystore and truststore made with keytool in $(since "$t0")s ($KF_TLS)"
}

# kf_sasl_properties: the server.properties lines of the SASL_SSL listener
# (the listener itself is in kf_write_config's listeners).
kf_sasl_properties() {
	cat <<PROPS
# SASL_SSL listener (kf_sasl_properties)
sasl.enabled.mechanisms=SCRAM-SHA-512,PLAIN
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$KAFKA_SASL_USER="$KAFKA_SASL_PASSWORD";
listener.name.sasl_ssl.ssl.keystore.type=PKCS12
listener.name.sasl_ssl.ssl.keystore.location=$KF_TLS/broker.p12
listener.name.sasl_ssl.ssl.keystore.password=$KF_TLS_PASS
listener.name.sasl_ssl.ssl.key.password=$KF_TLS_PASS
listener.name.sasl_ssl.ssl.truststore.type=PKCS12
listener.name.sasl_ssl.ssl.truststore.location=$KF_TLS/truststore.p12
listener.name.sasl_ssl.ssl.truststore.password=$KF_TLS_PASS
listener.name.sasl_ssl.ssl.client.auth=none
PROPS
}

# kf_sasl_listening: the running broker has the SASL_SSL listener (one
# started by an older services.sh has not).
kf_sasl_listening() {
	port_open "$KAFKA_SASL_PORT" && grep -q "SASL_SSL://127.0.0.1:$KAFKA_SASL_PORT" "$KF_DIR/server.properties" 2>/dev/null
}

# kf_sasl_ensure_user: after the broker started, create the SCRAM user with
# kafka-configs when the log directory was formatted without it.
kf_sasl_ensure_user() {
	kf_scram_done && return 0
	local t0
	t0=$(now_us)
	log "creating SCRAM-SHA-512 user $KAFKA_SASL_USER with kafka-configs (log directory formatted without it)"
	if ! timeout 60 java -Xmx128m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC \
		-Dlog4j.configuration="file:$KF_DIR/tools-log4j.properties" \
		-Dlog4j2.configurationFile="$KF_DIR/tools-log4j2.properties" -cp "$KAFKA_LIB/*" \
		kafka.admin.ConfigCommand --bootstrap-server "127.0.0.1:$KAFKA_PORT" --alter \
		--add-config "SCRAM-SHA-512=[password=$KAFKA_SASL_PASSWORD]" --entity-type users \
		--entity-name "$KAFKA_SASL_USER" </dev/null >"$KF_DIR/scram-user.log" 2>&1 3>&- 9>&-; then
		show_log "$KF_DIR/scram-user.log" 10
		return 1
	fi
	kf_scram_marker >"$KF_DIR/scram-user"
	log "SCRAM user created in $(since "$t0")s"
}

kf_sasl_print_env() {
	printf "export OUTBOX_TEST_KAFKA_SASL_BROKERS='127.0.0.1:%s'\n" "$KAFKA_SASL_PORT"
	printf "export OUTBOX_TEST_KAFKA_SASL_USER='%s'\n" "$KAFKA_SASL_USER"
	printf "export OUTBOX_TEST_KAFKA_SASL_PASSWORD='%s'\n" "$KAFKA_SASL_PASSWORD"
	printf "export OUTBOX_TEST_KAFKA_CA_FILE='%s'\n" "$KF_TLS/ca.pem"
}

# -------------------------------------------------------------- PgBouncer
#
# PgBouncer (Debian's package) in transaction pooling mode in front of the
# test PostgreSQL, so that tests can check what works through a transaction
# pooler. Any database name is forwarded (the tests create one per test), no
# password (trust on loopback), every server connection as user postgres.

pgb_ours_running() {
	local pid
	pid=$(read_pid "$PGB_DIR/pgbouncer.pid" || true)
	[[ -n $pid ]] && proc_matches "$pid" "$PGB_DIR/pgbouncer.ini"
}
need_pgbouncer_pkgs() { ! find_bin pgbouncer >/dev/null; }
pgb_psql() { "$(pg_bindir)/psql" -X -q -h 127.0.0.1 -p "$PGB_PORT" -U postgres -v ON_ERROR_STOP=1 "$@"; }
pgb_ready() { [[ $(pgb_psql -d "$DB_NAME" -tAc 'SELECT 1' 2>/dev/null) == 1 ]]; }
pgb_version() { "$(find_bin pgbouncer)" --version 2>/dev/null | head -n1 | sed 's/^[Pp]g[Bb]ouncer[ ]*//'; }

print_env_pgbouncer() {
	# pgx's default statement cache (named prepared statements) does not
	# survive transaction pooling; default_query_exec_mode=exec does.
	printf "export OUTBOX_TEST_PGBOUNCER_DSN='host=127.0.0.1 port=%s user=postgres dbname=%s sslmode=disable default_query_exec_mode=exec'\n" "$PGB_PORT" "$DB_NAME"
}

pgb_write_config() {
	local user=$1
	mkdir -p "$PGB_DIR"
	printf '"postgres" ""\n' >"$PGB_DIR/userlist.txt"
	cat >"$PGB_DIR/pgbouncer.ini" <<EOF
; generated by scripts/services.sh: transaction pooling in front of the test PostgreSQL
[databases]
* = host=127.0.0.1 port=$PG_PORT user=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PGB_PORT
unix_socket_dir =
auth_type = trust
auth_file = $PGB_DIR/userlist.txt
admin_users = postgres
stats_users = postgres
pool_mode = transaction
max_client_conn = 1000
default_pool_size = 20
; PostgreSQL allows 200 connections: leave room for the direct tests
max_user_connections = 100
server_idle_timeout = 10
autodb_idle_timeout = 30
server_login_retry = 1
; pgx sends neither; "options" (e.g. -c statement_timeout=...) is refused, not silently dropped
ignore_startup_parameters = extra_float_digits
log_connections = 0
log_disconnections = 0
EOF
	if is_root; then echo "user = $user" >>"$PGB_DIR/pgbouncer.ini"; fi
	chown -R "$user:" "$PGB_DIR"
}

start_pgbouncer() {
	TAG=pgbouncer
	local t0 note=started bin user pid
	t0=$(now_us)
	bin=$(find_bin pgbouncer) || die "pgbouncer not found"
	user=$(pg_user)
	if pgb_ours_running && pgb_ready; then
		note="already running"
	else
		if pgb_ours_running; then
			log "pgbouncer $(read_pid "$PGB_DIR/pgbouncer.pid") runs but does not answer: restarting it"
			stop_pid pgbouncer "$PGB_DIR/pgbouncer.pid" "$PGB_DIR/pgbouncer.ini"
			TAG=pgbouncer
		fi
		rm -f "$PGB_DIR/pgbouncer.pid"
		port_open "$PGB_PORT" && die "port $PGB_PORT is in use by another process (not our PgBouncer)"
		pgb_write_config "$user"
		rotate_log "$PGB_DIR/pgbouncer.log"
		log "starting pgbouncer (127.0.0.1:$PGB_PORT -> PostgreSQL :$PG_PORT, pool_mode=transaction)"
		# In the foreground (no -d) the pid file holds pgbouncer itself; as
		# root it switches to $user (the config's "user").
		spawn_detached "$PGB_DIR/pgbouncer.log" "$PGB_DIR/pgbouncer.pid" "$bin" "$PGB_DIR/pgbouncer.ini" ||
			{ show_log "$PGB_DIR/pgbouncer.log"; die "pgbouncer did not start"; }
		pid=$(read_pid "$PGB_DIR/pgbouncer.pid")
		if ! wait_until 30 "$pid" pgb_ready; then
			show_log "$PGB_DIR/pgbouncer.log"
			kill -KILL "$pid" 2>/dev/null || true
			die "pgbouncer does not answer on 127.0.0.1:$PGB_PORT (logs in $PGB_DIR)"
		fi
	fi
	local dt version
	version=$(pgb_version || echo '?')
	dt=$(since "$t0")
	log "ready in ${dt}s: PgBouncer $version on 127.0.0.1:$PGB_PORT, transaction pooling ($note)"
	record pgbouncer "PgBouncer $version" "$dt" "$note"
}

stop_pgbouncer() {
	TAG=pgbouncer
	if ! pgb_ours_running; then
		rm -f "$PGB_DIR/pgbouncer.pid"
		log "pgbouncer: not running"
		return 0
	fi
	stop_pid pgbouncer "$PGB_DIR/pgbouncer.pid" "$PGB_DIR/pgbouncer.ini"
}

status_pgbouncer() {
	local pid
	if pgb_ours_running; then
		pid=$(read_pid "$PGB_DIR/pgbouncer.pid")
		if pgb_ready; then
			echo "pgbouncer: running (pid $pid) on 127.0.0.1:$PGB_PORT, pool_mode=transaction, PgBouncer $(pgb_version || echo '?')"
		else
			echo "pgbouncer: process $pid exists but does not answer on 127.0.0.1:$PGB_PORT"
			return 3
		fi
	else
		echo "pgbouncer: stopped"
		return 3
	fi
}

# ------------------------------------------------- Kafka: three-node cluster
#
# On request only (start-cluster; `start` does not touch it): three KRaft
# nodes, each a combined broker+controller (process.roles=broker,controller)
# in a three-voter controller quorum, for the leader-failover chaos test.
# Replication factor 3 and min.insync.replicas=2 by default, for the
# internal topics too; unclean leader election off (Kafka's default). Log
# flushing is Kafka's default: no fsync per message or per interval
# (log.flush.interval.messages/ms unset), the page cache and the other
# replicas keep acknowledged records; the KRaft metadata log is fsynced
# by the controllers. A SIGKILL of a node loses nothing the kernel holds;
# a power cut of the machine would (all three nodes share it).
#
# Its own state directory, ports and lock: it runs beside the single-node
# services and never touches them. Its ports lie below Linux's ephemeral
# range (32768-60999): the cluster starts, and its nodes restart, after
# the test suite has cycled through thousands of outbound connections,
# and a node whose port an outbound socket holds at that moment exits
# with "Address already in use" (the suspected cause of a CI run where
# node 3 exited 15 s into its start, when the ports were 59192-59197). Node N (1..3) has the client listener
# CLUSTER_PORT+N-1 and the controller listener CLUSTER_PORT+N+2, its
# configuration, log directory, log and pid file in $CL_DIR/node-N. The JVM
# flags are kf_launch's, with the heap OUTBOX_CLUSTER_HEAP.

CL_DIR=${OUTBOX_CLUSTER_DIR:-/tmp/gorm-outbox-cluster}
CL_PORT=${OUTBOX_CLUSTER_PORT:-29192}
CL_HEAP=${OUTBOX_CLUSTER_HEAP:-512m}
CL_NODES=(1 2 3)

cl_port() { echo $((CL_PORT + $1 - 1)); }       # client listener of node N
cl_ctrl_port() { echo $((CL_PORT + $1 + 2)); }  # controller listener of node N
cl_node_dir() { echo "$CL_DIR/node-$1"; }
cl_brokers() {
	local n out=
	for n in "${CL_NODES[@]}"; do out+="${out:+,}127.0.0.1:$(cl_port "$n")"; done
	echo "$out"
}
cl_pattern() { echo "kafka.Kafka $(cl_node_dir "$1")/server.properties"; }
cl_running() { # N: our node N's JVM exists (paused or not)
	local pid
	pid=$(read_pid "$(cl_node_dir "$1")/pid" || true)
	[[ -n $pid ]] && proc_matches "$pid" "$(cl_pattern "$1")"
}
cl_paused() { # N: node N's JVM is stopped (SIGSTOP)
	local pid state
	pid=$(read_pid "$(cl_node_dir "$1")/pid" || true)
	[[ -n $pid && -r /proc/$pid/stat ]] || return 1
	state=$(sed 's/^.*) //' "/proc/$pid/stat" | cut -d' ' -f1)
	[[ $state == T ]]
}
# node N finished starting: in combined mode "Kafka Server started" comes
# once its broker is registered with the quorum and unfenced
cl_started() {
	port_open "$(cl_port "$1")" && grep -q 'Kafka Server started' "$(cl_node_dir "$1")/kafka.log"
}

cl_print_env() {
	printf "export OUTBOX_TEST_KAFKA_CLUSTER_BROKERS='%s'\n" "$(cl_brokers)"
	printf "export OUTBOX_TEST_KAFKA_CLUSTER_DIR='%s'\n" "$CL_DIR"
}

cl_write_config() { # N
	local n=$1 d v voters=
	d=$(cl_node_dir "$n")
	for v in "${CL_NODES[@]}"; do voters+="${voters:+,}$v@127.0.0.1:$(cl_ctrl_port "$v")"; done
	mkdir -p "$d/data"
	cat >"$d/server.properties" <<EOF
# generated by scripts/services.sh start-cluster: node $n of a three-node KRaft cluster
process.roles=broker,controller
node.id=$n
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:$(cl_port "$n"),CONTROLLER://127.0.0.1:$(cl_ctrl_port "$n")
advertised.listeners=PLAINTEXT://127.0.0.1:$(cl_port "$n")
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
log.dirs=$d/data
num.partitions=8
default.replication.factor=3
min.insync.replicas=2
offsets.topic.replication.factor=3
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
transaction.state.log.num.partitions=4
unclean.leader.election.enable=false
auto.create.topics.enable=true
delete.topic.enable=true
group.initial.rebalance.delay.ms=0
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
log.retention.hours=24
log.segment.bytes=67108864
# failure detection: Kafka's defaults, written out because the chaos test's
# timings follow from them (a silent broker is fenced after the session
# timeout; a lagging follower leaves the ISR after replica.lag.time.max.ms)
broker.heartbeat.interval.ms=2000
broker.session.timeout.ms=9000
replica.lag.time.max.ms=30000
EOF
}

cl_format() { # N (the cluster id from $CL_DIR/cluster-id)
	local n=$1 d
	d=$(cl_node_dir "$n")
	rm -rf "$d/data"
	mkdir -p "$d/data"
	if ! KF_DIR=$CL_DIR kf_java kafka.tools.StorageTool format -t "$(cat "$CL_DIR/cluster-id")" \
		-c "$d/server.properties" </dev/null >"$d/format.log" 2>&1 3>&- 9>&-; then
		show_log "$d/format.log"
		return 1
	fi
	kafka_version >"$d/formatted-by-version"
}

# cl_spawn N: start node N's JVM (configured and formatted), do not wait
cl_spawn() {
	local n=$1 d
	d=$(cl_node_dir "$n")
	rotate_log "$d/kafka.log"
	log "starting node $n (127.0.0.1:$(cl_port "$n"), controller :$(cl_ctrl_port "$n"))"
	# kf_launch's JVM flags
	spawn_detached "$d/kafka.log" "$d/pid" \
		java -Xms256m -Xmx"$CL_HEAP" -XX:TieredStopAtLevel=1 -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
		-XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent -Djava.awt.headless=true \
		-Dlog4j.configuration="file:$CL_DIR/log4j.properties" \
		-Dlog4j2.configurationFile="$CL_DIR/log4j2.properties" \
		-Dkafka.logs.dir="$d" \
		-cp "$KAFKA_LIB/*" kafka.Kafka "$d/server.properties" ||
		{ show_log "$d/kafka.log"; return 1; }
}

cl_wait_started() { # N
	local n=$1 pid
	pid=$(read_pid "$(cl_node_dir "$n")/pid")
	if ! wait_until "$KAFKA_TIMEOUT" "$pid" cl_started "$n"; then
		show_log "$(cl_node_dir "$n")/kafka.log" 40
		return 1
	fi
}

# cl_quorum: the quorum's description (kafka-metadata-quorum describe --status)
cl_quorum() {
	timeout 60 java -Xmx128m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC \
		-Dlog4j.configuration="file:$CL_DIR/tools-log4j.properties" \
		-Dlog4j2.configurationFile="$CL_DIR/tools-log4j2.properties" -cp "$KAFKA_LIB/*" \
		org.apache.kafka.tools.MetadataQuorumCommand --bootstrap-server "$(cl_brokers)" describe --status \
		</dev/null 2>&1 3>&- 9>&-
}
# cl_quorum_leader: the quorum leader's node id, once there is one and
# all three voters are in it
cl_quorum_leader() {
	local out leader
	out=$(cl_quorum) || return 1
	leader=$(sed -n 's/^LeaderId:[[:space:]]*\([0-9]*\).*/\1/p' <<<"$out")
	[[ -n $leader && $leader != -1 ]] || return 1
	grep -q '^CurrentVoters:.*"id": *1\b.*"id": *2\b.*"id": *3\b' <<<"$out" ||
		grep -q '^CurrentVoters:.*\[1,2,3\]' <<<"$out" || return 1
	echo "$leader"
}

cl_check_ports() { # N...
	local n
	for n in "$@"; do
		port_open "$(cl_port "$n")" && die "port $(cl_port "$n") is in use by another process (not our cluster node $n)"
		port_open "$(cl_ctrl_port "$n")" && die "port $(cl_ctrl_port "$n") is in use by another process (not our cluster node $n)"
	done
	return 0
}

cl_lock() {
	mkdir -p "$CL_DIR"
	exec 9>"$CL_DIR/.lock"
	flock -w 300 9 || die "could not lock $CL_DIR/.lock"
}

# cl_prepare: jars, log configuration, the cluster id, every node's
# configuration and formatted log directory (all nodes reformatted when
# one is missing or was formatted by another Kafka version).
cl_prepare() {
	command -v java >/dev/null 2>&1 || die "java not found"
	fetch_kafka_jars
	KF_DIR=$CL_DIR kf_write_log_config
	local n version reformat=0
	version=$(kafka_version)
	for n in "${CL_NODES[@]}"; do
		cl_write_config "$n"
		[[ -f $(cl_node_dir "$n")/data/meta.properties &&
			$(cat "$(cl_node_dir "$n")/formatted-by-version" 2>/dev/null) == "$version" ]] || reformat=1
	done
	[[ -s $CL_DIR/cluster-id ]] || reformat=1
	((reformat)) || return 0
	for n in "${CL_NODES[@]}"; do
		if cl_running "$n"; then die "node $n runs but the cluster must be reformatted: '$0 stop-cluster' first"; fi
	done
	local cid
	cid=$(head -c16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')
	while [[ $cid == -* ]]; do cid=$(head -c16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '='); done
	echo "$cid" >"$CL_DIR/cluster-id"
	log "formatting the three nodes' KRaft storage (cluster id $cid)"
	local pids=() rc=0
	for n in "${CL_NODES[@]}"; do
		cl_format "$n" &
		pids+=($!)
	done
	for n in "${pids[@]}"; do wait "$n" || rc=1; done
	((rc == 0)) || die "kafka storage format failed"
}

cmd_start_cluster() {
	exec 3>&1 1>&2
	TAG=cluster
	local t0 n todo=() note=started
	t0=$(now_us)
	cl_lock
	cl_prepare
	for n in "${CL_NODES[@]}"; do
		if cl_running "$n"; then
			cl_paused "$n" && { log "node $n is paused (SIGSTOP): resuming it"; kill -CONT "$(read_pid "$(cl_node_dir "$n")/pid")"; }
		else
			rm -f "$(cl_node_dir "$n")/pid"
			todo+=("$n")
		fi
	done
	if ((${#todo[@]} == 0)); then
		note="already running"
	else
		cl_check_ports "${todo[@]}"
		# all at once: a node's broker finishes starting only once the
		# quorum (two of the three controllers) has a leader
		for n in "${todo[@]}"; do cl_spawn "$n" || die "node $n did not start (logs in $(cl_node_dir "$n"))"; done
	fi
	local failed=() retry=()
	for n in "${CL_NODES[@]}"; do cl_wait_started "$n" || failed+=("$n"); done
	# a node that exited while the others run gets one more start: the
	# quorum is up by now and takes it back
	for n in "${failed[@]}"; do
		if ! cl_running "$n"; then
			log "node $n exited while starting: starting it once more"
			rm -f "$(cl_node_dir "$n")/pid"
			cl_check_ports "$n"
			cl_spawn "$n" && cl_wait_started "$n" && continue
		fi
		retry+=("$n")
	done
	failed=("${retry[@]}")
	((${#failed[@]} == 0)) || die "node(s) ${failed[*]} did not start (logs in $CL_DIR/node-N; '$0 stop-cluster' stops the others)"
	log "all three nodes started in $(since "$t0")s; checking the controller quorum"
	local leader=
	for _ in $(seq 20); do
		leader=$(cl_quorum_leader) && break
		sleep 1
	done
	[[ -n $leader ]] || { cl_quorum | sed 's/^/    | /' >&2; die "the controller quorum has no leader with three voters"; }
	local dt
	dt=$(since "$t0")
	# the start time of the last start that started something
	if [[ $note == started ]]; then
		printf 'start-cluster at %s: ready in %ss (%s), Kafka %s, quorum leader node %s\n' \
			"$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$dt" "$note" "$(kafka_version)" "$leader" >"$CL_DIR/started"
	fi
	log "ready in ${dt}s: Kafka $(kafka_version), three nodes on $(cl_brokers), quorum leader node $leader ($note)"
	for n in "${CL_NODES[@]}"; do log "node $n: pid $(read_pid "$(cl_node_dir "$n")/pid") ($(cl_node_dir "$n")/pid)"; done
	cl_print_env >&3
}

# start-cluster-node N: start one node that is not running (a test restarts
# the node it killed) and wait until it has started.
cmd_start_cluster_node() {
	local n=${1:-}
	[[ $n =~ ^[1-3]$ ]] || die "usage: $0 start-cluster-node 1|2|3"
	TAG=cluster-node-$n
	local t0
	t0=$(now_us)
	cl_lock
	[[ -f $(cl_node_dir "$n")/data/meta.properties ]] || die "node $n was never formatted: run '$0 start-cluster' first"
	if cl_running "$n"; then
		log "node $n already runs (pid $(read_pid "$(cl_node_dir "$n")/pid"))"
		return 0
	fi
	rm -f "$(cl_node_dir "$n")/pid"
	cl_check_ports "$n"
	cl_spawn "$n" || die "node $n did not start"
	cl_wait_started "$n" || die "node $n did not start (log $(cl_node_dir "$n")/kafka.log)"
	log "node $n started in $(since "$t0")s (pid $(read_pid "$(cl_node_dir "$n")/pid"))"
}

cmd_stop_cluster() {
	TAG=cluster
	cl_lock
	local n pids=() rc=0
	for n in "${CL_NODES[@]}"; do
		# a paused JVM handles SIGTERM only once it runs again
		if cl_running "$n"; then kill -CONT "$(read_pid "$(cl_node_dir "$n")/pid")" 2>/dev/null || true; fi
		(stop_pid "cluster node $n" "$(cl_node_dir "$n")/pid" "$(cl_pattern "$n")") &
		pids+=($!)
	done
	for n in "${pids[@]}"; do wait "$n" || rc=1; done
	return $rc
}

cmd_status_cluster() {
	local n pid rc=0 leader
	for n in "${CL_NODES[@]}"; do
		if cl_running "$n"; then
			pid=$(read_pid "$(cl_node_dir "$n")/pid")
			if cl_paused "$n"; then
				echo "node $n:   paused (SIGSTOP) (pid $pid) on 127.0.0.1:$(cl_port "$n")"
				rc=3
			elif port_open "$(cl_port "$n")"; then
				echo "node $n:   running (pid $pid) on 127.0.0.1:$(cl_port "$n"), controller :$(cl_ctrl_port "$n")"
			else
				echo "node $n:   process $pid exists but 127.0.0.1:$(cl_port "$n") is closed"
				rc=3
			fi
		else
			echo "node $n:   stopped"
			rc=3
		fi
	done
	if ((rc == 0)); then
		if leader=$(cl_quorum_leader); then echo "quorum:   leader node $leader, voters 1,2,3"; else
			echo "quorum:   no leader with three voters"
			rc=3
		fi
	fi
	[[ -s $CL_DIR/started ]] && echo "last:     $(cat "$CL_DIR/started")"
	echo "state:    $CL_DIR"
	return $rc
}

# ---------------------------------------------------------------- commands

lock() {
	mkdir -p "$STATE"
	exec 9>"$STATE/.lock"
	flock -w 900 9 || die "could not lock $STATE/.lock"
}

cmd_start() {
	# Only the export lines go to the real stdout (kept on fd 3).
	exec 3>&1 1>&2
	check_settings
	local t0
	t0=$(now_us)
	lock
	rm -f "$STATE"/.result.*

	# Packages first where needed. The Kafka job (mvn fetch + JVM start) does
	# not need apt when java and mvn/jar cache are there, so it runs meanwhile.
	local java_pkgs db_pkgs=() kpid=
	java_pkgs=$(need_java_pkgs)
	if [[ -z $java_pkgs ]]; then
		(start_kafka) </dev/null &
		kpid=$!
	fi
	need_pg_pkgs && db_pkgs+=(postgresql)
	need_mariadb_pkgs && db_pkgs+=(mariadb-server mariadb-client)
	need_pgbouncer_pkgs && db_pkgs+=(pgbouncer)
	# shellcheck disable=SC2206
	local all_pkgs=($java_pkgs ${db_pkgs[@]+"${db_pkgs[@]}"})
	if ((${#all_pkgs[@]})); then
		local ta
		ta=$(now_us)
		apt_install "${all_pkgs[@]}"
		log "packages installed in $(since "$ta")s"
	fi
	if [[ -z $kpid ]]; then
		(start_kafka) </dev/null &
		kpid=$!
	fi
	(start_postgres) </dev/null &
	local ppid=$!
	(start_mariadb) </dev/null &
	local mpid=$!

	local failed=()
	wait "$ppid" || failed+=(postgres)
	[[ " ${failed[*]-} " == *" postgres "* ]] || (start_pgbouncer) </dev/null || failed+=(pgbouncer)
	wait "$mpid" || failed+=(mariadb)
	wait "$kpid" || failed+=(kafka)
	TAG=services
	if ((${#failed[@]})); then
		die "failed to start: ${failed[*]} (state and logs in $STATE; '$0 stop' stops the others)"
	fi
	log "all services ready in $(since "$t0")s:"
	cat "$STATE"/.result.postgres "$STATE"/.result.pgbouncer "$STATE"/.result.mariadb "$STATE"/.result.kafka | sed 's/^/    /' >&2
	cat "$STATE"/.result.* >"$STATE/versions.txt"
	print_env >&3
}

cmd_stop() {
	lock
	(stop_pgbouncer) || true
	(stop_kafka) &
	local k=$!
	(stop_mariadb) &
	local m=$!
	(stop_postgres) &
	local pg=$!
	local rc=0
	wait "$k" || rc=1
	wait "$m" || rc=1
	wait "$pg" || rc=1
	return $rc
}

cmd_status() {
	local rc=0 pid
	if pg_ours_running; then
		pid=$(read_pid "$PG_DIR/data/postmaster.pid")
		if pg_ready; then echo "postgres: running (pid $pid) on 127.0.0.1:$PG_PORT"; else
			echo "postgres: process $pid exists but does not answer on 127.0.0.1:$PG_PORT"
			rc=3
		fi
	else
		echo "postgres: stopped"
		rc=3
	fi
	if my_ours_running; then
		pid=$(my_pid)
		if my_ping; then echo "mariadb:  running (pid $pid) on 127.0.0.1:$MYSQL_PORT"; else
			echo "mariadb:  process $pid exists but does not answer"
			rc=3
		fi
	else
		echo "mariadb:  stopped"
		rc=3
	fi
	if kf_ours_running; then
		pid=$(read_pid "$KF_DIR/kafka.pid")
		if port_open "$KAFKA_PORT"; then
			echo "kafka:    running (pid $pid) on 127.0.0.1:$KAFKA_PORT, Kafka $(kafka_version || echo '?')"
		else
			echo "kafka:    process $pid exists but 127.0.0.1:$KAFKA_PORT is closed"
			rc=3
		fi
	else
		echo "kafka:    stopped"
		rc=3
	fi
	status_pgbouncer || rc=3
	echo "state:    $STATE"
	return $rc
}

case "${1:-}" in
start) cmd_start ;;
stop) cmd_stop ;;
restart)
	check_settings
	(cmd_stop) >&2
	cmd_start
	;;
env) print_env ;;
kafka-run)
	shift
	(($#)) || die "usage: $0 kafka-run MAIN-CLASS [ARGS...]"
	kafka_jars_ok || die "no Kafka jars in $KAFKA_LIB yet: run '$0 start' first"
	mkdir -p "$KF_DIR"
	[[ -f $KF_DIR/tools-log4j.properties ]] || kf_write_log_config
	kf_java "$@"
	;;
status) cmd_status ;;
reset)
	cmd_stop
	log "removing $STATE"
	rm -rf "$STATE"
	;;
start-cluster) cmd_start_cluster ;;
start-cluster-node) cmd_start_cluster_node "${2:-}" ;;
stop-cluster) cmd_stop_cluster ;;
status-cluster) cmd_status_cluster ;;
env-cluster) cl_print_env ;;
reset-cluster)
	cmd_stop_cluster
	log "removing $CL_DIR"
	rm -rf "$CL_DIR"
	;;
*)
	echo "usage: $0 start|stop|restart|env|status|reset|kafka-run MAIN-CLASS [ARGS...]" >&2
	echo "       $0 start-cluster|stop-cluster|status-cluster|env-cluster|reset-cluster|start-cluster-node N" >&2
	exit 2
	;;
esac
