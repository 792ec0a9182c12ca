#!/usr/bin/env bash
# importer-check: what an application importing the library sees.
#
# Builds a throw-away importer in a temporary directory — a main package that
# uses the root package, relay, kafkapub and gormstore with gorm.io/driver/postgres, as
# the README's "Running the relay: In-process" does — whose go.mod requires
# github.com/gorm-outbox/outbox and replaces it with this checkout. After
# `go mod tidy` and `go build` it prints `go list -m all` and its count, and
# the same for the stack used directly (gorm, the driver, kafka-go, the
# OpenTelemetry metric API, google/uuid at the versions the importer selected).
#
# It fails when
#   - a forbidden module is in the importer's graph (the Prometheus client,
#     the OpenTelemetry SDK and exporters, protobuf, this repository's nested
#     modules): only the worker, the benchmark, the chaos harness, the
#     examples or the franz-go inbox consumer need them, and they live in
#     the nested modules cmd/, examples/ and inbox/franz/;
#   - a module is in the importer's graph that is neither in the direct
#     stack's graph nor in EXTRA_ALLOWED below (each with the reason it must
#     stay in the library module's go.mod). Tests that need a module the
#     library does not compile live in the test module internal/tests/
#     (its doc.go), so that the library's go.mod need not list it;
#   - the importer's graph holds more than the direct stack's modules + 1
#     (the library itself; issue 31's bound).
#
# Usage: scripts/importer-check.sh [CHECKOUT]   (default: this repository)
# Needs the Go module proxy (or a module cache holding the dependencies).
set -euo pipefail

checkout=$(cd "${1:-$(dirname "${BASH_SOURCE[0]}")/..}" && pwd)
root_module=github.com/gorm-outbox/outbox

# Forbidden modules (extended regular expressions on module paths).
FORBIDDEN=(
	'^github\.com/prometheus/'              # Prometheus client: the worker's /metrics
	'^go\.opentelemetry\.io/otel/sdk($|/)'  # OpenTelemetry SDK: the worker, tests of the commands
	'^go\.opentelemetry\.io/otel/exporters/' # OpenTelemetry exporters: the worker
	'^google\.golang\.org/protobuf$'        # came with the Prometheus client
	"^${root_module//./\\.}/(cmd|examples|inbox/franz|internal/tests|internal/testenv|outboxtest)$" # the nested modules themselves
)

# Modules beyond the direct stack that the library module's go.mod must list
# because the library's own tests (in its packages) compile them. With module
# graph pruning an importer's graph holds every requirement of that go.mod,
# so they show up here; none is compiled into an importer's binary.
EXTRA_ALLOWED=(
	github.com/gorm-outbox/outbox          # the library itself
	gorm.io/driver/sqlite                  # SQLite unit tests of the library (today also in the direct stack's graph)
	github.com/mattn/go-sqlite3            # required by gorm.io/driver/sqlite (likewise)
)

export GOWORK=off GOFLAGS=-mod=mod
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

go_version=$(go mod edit -json "$checkout/go.mod" | sed -n 's/^[[:space:]]*"Go": "\(.*\)",*$/\1/p')

# 1. the importer
mkdir "$tmp/importer"
cat >"$tmp/importer/main.go" <<'EOF'
// A throw-away importer of the library: see scripts/importer-check.sh.
package main

import (
	"context"
	"os"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
)

func main() {
	db, err := gorm.Open(postgres.Open(os.Getenv("DSN")), &gorm.Config{})
	if err != nil {
		panic(err)
	}
	cfg := outbox.Config{}
	if err := db.Use(outbox.Plugin{Config: cfg}); err != nil {
		panic(err)
	}
	store, err := gormstore.New(db, gormstore.Options{Config: cfg})
	if err != nil {
		panic(err)
	}
	pub, err := kafkapub.New(kafkapub.Config{Brokers: []string{"kafka:9092"}})
	if err != nil {
		panic(err)
	}
	defer pub.Close()
	r, err := relay.New(store, pub, relay.Options{})
	if err != nil {
		panic(err)
	}
	_ = r.Run(context.Background())
}
EOF
(
	cd "$tmp/importer"
	go mod init example.com/importer >/dev/null 2>&1
	go mod edit -go="$go_version" -require="$root_module@v0.0.0-00010101000000-000000000000" -replace="$root_module=$checkout"
	go mod tidy
	go build -o /dev/null .
)
importer=$(cd "$tmp/importer" && go list -m -f '{{.Path}}' all | tail -n +2)

# 2. the same stack used directly, at the versions the importer selected
mkdir "$tmp/direct"
cat >"$tmp/direct/main.go" <<'EOF'
// The library's stack used directly: see scripts/importer-check.sh.
package main

import (
	"context"
	"os"

	"github.com/google/uuid"
	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
)

func main() {
	db, err := gorm.Open(postgres.Open(os.Getenv("DSN")), &gorm.Config{})
	if err != nil {
		panic(err)
	}
	_ = db
	w := &kafka.Writer{Addr: kafka.TCP("kafka:9092")}
	defer w.Close()
	c, _ := otel.GetMeterProvider().Meter("direct").Int64Counter("sent")
	c.Add(context.Background(), 1)
	_ = w.WriteMessages(context.Background(), kafka.Message{Key: []byte(uuid.NewString())})
}
EOF
(
	cd "$tmp/direct"
	go mod init example.com/direct >/dev/null 2>&1
	go mod edit -go="$go_version"
	for m in gorm.io/gorm gorm.io/driver/postgres github.com/segmentio/kafka-go go.opentelemetry.io/otel go.opentelemetry.io/otel/metric github.com/google/uuid; do
		v=$(cd "$tmp/importer" && go list -m -f '{{.Version}}' "$m")
		go mod edit -require="$m@$v"
	done
	go mod tidy
	go build -o /dev/null .
)
direct=$(cd "$tmp/direct" && go list -m -f '{{.Path}}' all | tail -n +2)

n_importer=$(grep -c . <<<"$importer")
n_direct=$(grep -c . <<<"$direct")
echo "importer-check: an importer of outbox, relay, kafkapub and gormstore (+ gorm.io/driver/postgres): $n_importer modules in go list -m all:"
(cd "$tmp/importer" && go list -m all | tail -n +2 | sed 's/^/  /')
echo "importer-check: the same stack used directly (gorm, gorm.io/driver/postgres, kafka-go, the OTel metric API, uuid): $n_direct modules"

fail=0
for re in "${FORBIDDEN[@]}"; do
	if hits=$(grep -E "$re" <<<"$importer"); then
		echo "importer-check: FORBIDDEN in the importer's graph: $(tr '\n' ' ' <<<"$hits")(pattern $re)" >&2
		fail=1
	fi
done
extra=$(comm -23 <(sort <<<"$importer") <(sort <<<"$direct"))
echo "importer-check: $(grep -c . <<<"$extra") modules beyond the direct stack:"
while read -r m; do
	[[ -n $m ]] || continue
	if printf '%s\n' "${EXTRA_ALLOWED[@]}" | grep -qxF "$m"; then
		echo "  $m"
	else
		echo "  $m   <- not expected" >&2
		echo "importer-check: $m is in the importer's graph but not in the direct stack's nor in EXTRA_ALLOWED: keep what needs it out of the library module, or add it to EXTRA_ALLOWED with the reason" >&2
		fail=1
	fi
done <<<"$extra"
if ((n_importer > n_direct + 1)); then
	echo "importer-check: $n_importer modules in the importer's graph, more than the direct stack's $n_direct + 1 (the library)" >&2
	fail=1
fi
if ((fail)); then
	echo "importer-check: FAIL" >&2
	exit 1
fi
echo "importer-check: OK"
