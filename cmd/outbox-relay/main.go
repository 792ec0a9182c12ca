// Command outbox-relay is a standalone relay worker: it publishes the rows of
// a gorm-outbox outbox table to Kafka. The writers only register
// outbox.Plugin; any number of outbox-relay processes share the buckets
// through leases.
//
//	outbox-relay -db-driver postgres -db-dsn "host=db user=app dbname=app" -kafka-brokers kafka-1:9092,kafka-2:9092
//
// Every flag has an environment variable (-db-dsn is OUTBOX_DB_DSN). The
// worker serves /metrics and /healthz and stops gracefully on SIGTERM or
// SIGINT. Subcommands (status, check, parked, requeue, discard, rebucket)
// serve the operator; outbox-relay -h and help COMMAND describe them.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/pgnotify"
	"github.com/gorm-outbox/outbox/relay"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitConfig  = 2
)

// httpShutdownTimeout bounds the HTTP server's shutdown after the relay.
const httpShutdownTimeout = 5 * time.Second

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// run is the whole worker, or the subcommand its first argument names; it
// returns the exit code and stops gracefully when ctx is done.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) > 0 && (args[0] == "version" || args[0] == "-version" || args[0] == "--version") {
		fmt.Fprintln(stdout, readBuildVersion())
		return exitOK
	}
	if len(args) > 0 && (args[0] == "help" || findSubcommand(args[0]) != nil) {
		return runSubcommand(ctx, args[0], args[1:], &adminEnv{getenv: getenv, stdout: stdout, stderr: stderr, open: openStoreAdmin, now: time.Now})
	}
	cfg, err := parseConfig(args, getenv)
	if errors.Is(err, flag.ErrHelp) {
		usage(stdout)
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "outbox-relay: %s (see outbox-relay help flags)\n", oneLine(err))
		return exitConfig
	}
	w, err := build(cfg, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "outbox-relay: %s\n", oneLine(err))
		return exitConfig
	}
	defer w.close()
	return w.run(ctx)
}

// worker is a configured relay and its HTTP server, not yet started.
type worker struct {
	cfg    *config
	log    *slog.Logger
	db     *gorm.DB // opened by run
	pub    *kafkapub.Publisher
	relay  *relay.Relay // built by run
	reg    *prometheus.Registry
	mp     *sdkmetric.MeterProvider
	notify *pgnotify.Transport // nil: polling only
}

// build assembles everything that needs no connection, so that every
// configuration error (exit 2) comes before the worker touches a service.
func build(cfg *config, stderr io.Writer) (_ *worker, err error) {
	level, _ := parseLevel(cfg.logLevel)
	hopts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewTextHandler(stderr, hopts)
	if cfg.logFormat == "json" {
		h = slog.NewJSONHandler(stderr, hopts)
	}
	w := &worker{cfg: cfg, log: slog.New(h)}
	defer func() {
		if err != nil {
			w.close()
		}
	}()
	transport, err := cfg.transport()
	if err != nil {
		return nil, err
	}
	pc := cfg.kafka
	pc.Transport = transport
	if cfg.txn.Outbox != "" {
		pc.Transactions = &cfg.txn
	}
	w.pub, err = kafkapub.New(pc)
	if err != nil {
		return nil, err
	}

	// The OpenTelemetry SDK with the Prometheus exporter on a registry of
	// our own, plus Go, process and build (go_build_info) metrics.
	w.reg = prometheus.NewRegistry()
	w.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), collectors.NewBuildInfoCollector())
	// Without scope info: the metric names already say where they come from.
	exp, err := otelprom.New(otelprom.WithRegisterer(w.reg), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	w.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp),
		sdkmetric.WithResource(resource.NewSchemaless(attribute.String("service.name", "outbox-relay"))))

	if cfg.notifyDSN != "" {
		w.notify, err = pgnotify.New(pgnotify.Config{ConnString: cfg.notifyDSN, Channel: cfg.notifyChannel, Logger: w.log})
		if err != nil {
			return nil, fmt.Errorf("-notify-postgres-dsn: %w", err)
		}
	}
	return w, nil
}

// idleConns is the relay's statements in flight at most, which the pool
// keeps idle rather than database/sql's 2 (see docs/relays.md,
// Connections): a fetch and a delete for each bucket served at once, the
// lease renewal and the backlog sample.
func (w *worker) idleConns() int {
	return 2*cmp.Or(w.cfg.relay.MaxConcurrentBuckets, relay.DefaultMaxConcurrentBuckets) + 2
}

// openDB opens the database of c and pings it (closing it on an error); a
// -bucket-count left unset becomes the fleet's, or the default.
func openDB(ctx context.Context, c *dbConfig, log *slog.Logger) (_ *gorm.DB, err error) {
	var dial gorm.Dialector
	switch c.dbDriver {
	case "postgres":
		dial = postgres.Open(c.dbDSN)
	case "mysql":
		dial = mysql.Open(c.dbDSN)
	case "sqlite":
		dsn := c.dbDSN
		if c.readOnly {
			dsn = sqliteReadOnly(dsn)
		}
		dial = sqlite.Open(dsn)
	}
	db, err := gorm.Open(dial, &gorm.Config{DisableAutomaticPing: true, Logger: newGormLogger(log)})
	if err != nil {
		if db != nil && db.ConnPool != nil {
			closeDB(db)
		}
		return nil, err
	}
	pingCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	sqlDB, err := db.DB()
	if err == nil {
		err = sqlDB.PingContext(pingCtx)
	}
	if err != nil {
		closeDB(db)
		return nil, err
	}
	if c.outbox.BucketCount == 0 {
		n, _ := outbox.FleetBucketCount(pingCtx, db, c.outbox) // a missing table is reported by its check
		c.outbox.BucketCount = cmp.Or(n, outbox.DefaultBucketCount)
	}
	return db, nil
}

func closeDB(db *gorm.DB) {
	if sqlDB, err := db.DB(); err == nil {
		_ = sqlDB.Close()
	}
}

// sqliteReadOnly returns dsn as a SQLite URI filename opened read-only
// (mode=ro), which fails on a missing file instead of creating it.
func sqliteReadOnly(dsn string) string {
	name, query, _ := strings.Cut(dsn, "?")
	if !strings.HasPrefix(name, "file:") {
		// In a URI filename, '%', '?' and '#' are escapes and delimiters.
		name = "file:" + strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(name)
	}
	if query != "" {
		query += "&"
	}
	return name + "?" + query + "mode=ro"
}

// run connects, serves HTTP and runs the relay until ctx is done or the
// relay fails.
func (w *worker) run(ctx context.Context) int {
	var err error
	if w.db, err = openDB(ctx, &w.cfg.dbConfig, w.log); err != nil {
		w.log.Error("database unreachable", "driver", w.cfg.dbDriver, "error", err)
		return exitFailure
	}
	if sqlDB, err := w.db.DB(); err == nil {
		sqlDB.SetMaxIdleConns(w.idleConns())
	}
	if w.cfg.migrate {
		if err := outbox.AutoMigrate(w.db.WithContext(ctx), w.cfg.outbox); err != nil {
			w.log.Error("migrate failed", "error", err)
			return exitFailure
		}
	} else if err := checkOutboxTables(ctx, w.db, &w.cfg.dbConfig); err != nil {
		w.log.Error(err.Error())
		return exitFailure
	}
	store, err := gormstore.New(w.db, gormstore.Options{Config: w.cfg.outbox, StatementTimeout: w.cfg.statementTimeout, Logger: w.log})
	if err != nil { // checked by parseConfig; not expected
		w.log.Error("store options", "error", oneLine(err))
		return exitFailure
	}
	opts := w.cfg.relay
	opts.BucketCount = w.cfg.outbox.BucketCount
	opts.Logger = w.log
	opts.MeterProvider = w.mp
	opts.SingleWriter = w.cfg.dbDriver == "sqlite"
	if w.notify != nil {
		// LISTEN through a transaction pooler never wakes anyone: refuse
		// at start rather than restart the listener forever.
		if err := w.notify.Check(ctx); err != nil {
			w.log.Error("-notify-postgres-dsn unusable", "error", err)
			return exitFailure
		}
		opts.HintTransport = w.notify
	}
	w.relay, err = relay.New(store, w.pub, opts)
	if err != nil { // checked by parseConfig; not expected
		w.log.Error("relay options", "error", oneLine(err))
		return exitFailure
	}
	if w.notify == nil {
		// Taking the relay's notifier silences its advice, which names Go
		// options; the worker names its flag instead.
		_ = w.relay.Notifier()
		w.log.Info("polling for new rows every -poll-interval; for the writers' commits to wake the relay at once, set -notify-postgres-dsn (the writers send with pgnotify.Sender)",
			"poll_interval", w.cfg.relay.PollInterval)
	}

	var srv *http.Server
	srvDone := make(chan error, 1)
	if w.cfg.listen != "" {
		ln, err := net.Listen("tcp", w.cfg.listen)
		if err != nil {
			w.log.Error("cannot listen", "addr", w.cfg.listen, "error", err)
			return exitFailure
		}
		srv = &http.Server{Handler: w.handler(), ReadHeaderTimeout: 10 * time.Second}
		w.log.Info("serving /metrics and /healthz", "addr", ln.Addr().String())
		go func() { srvDone <- srv.Serve(ln) }()
	}

	w.log.Info("connected; starting the relay", append([]any{"relay", w.relay.ID(), "driver", w.cfg.dbDriver,
		"brokers", strings.Join(w.cfg.kafka.Brokers, ","), "messages_table", w.cfg.outbox.MessagesTableName(), "buckets", w.cfg.outbox.BucketCount},
		readBuildVersion().logAttrs()...)...)
	runErr := w.relay.Run(ctx)

	if srv != nil {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), httpShutdownTimeout)
		_ = srv.Shutdown(sctx)
		cancel()
		<-srvDone
	}
	if runErr != nil {
		return exitFailure // the relay logged why ("stopped by a fatal error")
	}
	w.log.Info("exiting; leases released")
	return exitOK
}

// handler serves /metrics and /healthz.
func (w *worker) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(w.reg, promhttp.HandlerOpts{}))
	mux.Handle("GET /healthz", healthz(func() error {
		if w.relay == nil {
			return errors.New("outbox-relay: starting: the relay is not built yet")
		}
		return w.relay.Health()
	}))
	return mux
}

// healthz serves health: 200 "ok", or 503 and the reason on one line.
func healthz(health func() error) http.HandlerFunc {
	return func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := health(); err != nil {
			rw.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(rw, oneLine(err))
			return
		}
		fmt.Fprintln(rw, "ok")
	}
}

// close releases the publisher, the meter provider and the database pool.
func (w *worker) close() {
	if w.notify != nil {
		w.notify.Close()
	}
	if w.pub != nil {
		_ = w.pub.Close()
	}
	if w.mp != nil {
		_ = w.mp.Shutdown(context.Background())
	}
	if w.db != nil {
		closeDB(w.db)
	}
}

// newGormLogger returns gorm's logger for the worker: slow statements
// (over a second) as warnings, without their bound values (keys and
// payloads stay out of the logs). Failed statements are not logged: their
// errors are logged once, with their context, by the relay or the worker.
func newGormLogger(log *slog.Logger) logger.Interface {
	return gormLogger{logger.NewSlogLogger(log.With("component", "gorm"), logger.Config{
		SlowThreshold: time.Second, LogLevel: logger.Warn, IgnoreRecordNotFoundError: true,
	})}
}

// gormLogger drops failed statements and bound values; see newGormLogger.
type gormLogger struct{ logger.Interface }

func (l gormLogger) LogMode(level logger.LogLevel) logger.Interface {
	return gormLogger{l.Interface.LogMode(level)}
}

func (l gormLogger) Trace(ctx context.Context, begin time.Time, fc func() (string, int64), err error) {
	if err != nil {
		return
	}
	l.Interface.Trace(ctx, begin, fc, nil)
}

// ParamsFilter implements gorm.ParamsFilter: logged SQL keeps placeholders.
func (gormLogger) ParamsFilter(_ context.Context, sql string, _ ...any) (string, []any) {
	return sql, nil
}

// checkOutboxTables reports the outbox tables of dc missing on db, in one
// error that says how to create them.
func checkOutboxTables(ctx context.Context, db *gorm.DB, dc *dbConfig) error {
	store, err := gormstore.New(db, gormstore.Options{Config: dc.outbox, StatementTimeout: dc.statementTimeout})
	if err != nil {
		return err
	}
	missing, err := store.MissingTables(ctx)
	if err != nil || len(missing) == 0 {
		return err
	}
	renamed := ""
	if c := dc.outbox.WithDefaults(); c != (outbox.Config{BucketCount: c.BucketCount}).WithDefaults() {
		renamed = " with these names"
	}
	return fmt.Errorf("missing outbox tables %s: start once with -migrate, or apply migrations/%s.sql%s",
		strings.Join(missing, ", "), dc.dbDriver, renamed)
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("-log-level %q: must be debug, info, warn or error", s)
	}
	return l, nil
}
