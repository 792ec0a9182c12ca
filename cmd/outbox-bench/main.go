// Command outbox-bench runs the benchmark harness of cmd/internal/bench:
// drain throughput beside a raw loop and a naive relay, latency at a
// steady commit rate, enqueue overhead and the idle cost of a relay fleet,
// printed as tables and optionally written as JSON (BENCHMARKS.md has the
// commands and the figures). With -db postgres or mysql it creates a fresh
// database on the server of -dsn and drops it at the end.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/gorm-outbox/outbox/cmd/internal/bench"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// run parses args, runs the harness, prints the tables to stdout and logs
// progress to stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("outbox-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg       bench.Config
		brokers   string
		scenarios string
		relays    string
		rates     string
		modes     string
		fleets    string
		jsonPath  string
		relayLog  string
		quiet     bool
		serveFake bool
	)
	fs.StringVar(&cfg.DB, "db", "sqlite", "database: sqlite, postgres or mysql")
	fs.StringVar(&cfg.DSN, "dsn", "", "server DSN for postgres or mysql (default $OUTBOX_TEST_POSTGRES_DSN or $OUTBOX_TEST_MYSQL_DSN)")
	fs.StringVar(&cfg.Broker, "broker", "kfake", "broker: kfake (in-process), kfake-process (kfake in a child process of its own) or real")
	fs.StringVar(&brokers, "brokers", "", "real broker addresses, comma-separated (default $OUTBOX_TEST_KAFKA_BROKERS)")
	fs.StringVar(&scenarios, "scenarios", strings.Join(bench.AllScenarios(), ","), "scenarios to run, comma-separated")
	fs.IntVar(&cfg.N, "n", 200_000, "drain: preloaded rows")
	fs.IntVar(&cfg.NaiveN, "naive-n", 3_000, "drain: rows the naive one-row relay drains")
	fs.IntVar(&cfg.ValueSize, "value-size", 1024, "record value size in bytes")
	fs.IntVar(&cfg.Buckets, "buckets", 8, "outbox bucket count")
	fs.IntVar(&cfg.Partitions, "partitions", 8, "topic partitions")
	fs.IntVar(&cfg.BatchSize, "batch", 500, "relay and raw-loop batch size")
	fs.StringVar(&relays, "relays", "1", "drain: relay counts, comma-separated (scaling: 1,2,4)")
	fs.IntVar(&cfg.MaxConcurrentBuckets, "max-concurrent-buckets", 0, "relays' Options.MaxConcurrentBuckets (0: the library default)")
	fs.IntVar(&cfg.MaxIdleConns, "max-idle-conns", 0, "SetMaxIdleConns of every pool (0: database/sql's default of 2)")
	fs.StringVar(&rates, "rates", "100,1000", "latency: commit rates per second, comma-separated")
	fs.StringVar(&modes, "modes", "local,poll,pgnotify", "latency: notification modes, comma-separated")
	fs.DurationVar(&cfg.LatencyDuration, "latency-duration", 10*time.Second, "latency: measured commit duration per run (after a warm-up of a tenth of it, at most 1s)")
	fs.IntVar(&cfg.EnqueueTx, "enqueue-tx", 2_000, "enqueue: transactions per variant")
	fs.DurationVar(&cfg.IdleWindow, "idle-window", 30*time.Second, "idle: counting window per fleet")
	fs.StringVar(&fleets, "idle-fleets", "1,3", "idle: relay counts, comma-separated")
	fs.StringVar(&jsonPath, "json", "", "write the report as JSON to this file")
	fs.StringVar(&relayLog, "relay-log", "", "drain: write every log of the relays and their stores, DEBUG included (each batch's fetch, publish and delete times), as JSON lines to this file")
	fs.BoolVar(&quiet, "q", false, "no progress logs")
	fs.BoolVar(&serveFake, "serve-kfake", false, "run only a kfake broker (-partitions per topic), print its address, serve until stdin ends (the child of -broker kfake-process)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("outbox-bench: unexpected arguments %q", fs.Args())
	}
	if serveFake {
		return serveKfake(ctx, cfg.Partitions, os.Stdin, stdout)
	}
	if cfg.DSN == "" {
		cfg.DSN = map[string]string{"postgres": os.Getenv(testenv.EnvPostgres), "mysql": os.Getenv(testenv.EnvMySQL)}[cfg.DB]
	}
	if brokers = cmp.Or(brokers, os.Getenv(testenv.EnvKafka)); brokers != "" {
		cfg.Brokers = strings.Split(brokers, ",")
	}
	if cfg.Broker == "kfake-process" {
		p, err := startKfakeProcess(ctx, cfg.Partitions, stderr)
		if err != nil {
			return err
		}
		defer p.stop()
		cfg.Brokers = p.addrs
	}
	cfg.Scenarios, cfg.LatencyModes = split(scenarios), split(modes)
	var err error
	for _, f := range []struct {
		name, value string
		into        *[]int
	}{{"relays", relays, &cfg.Relays}, {"rates", rates, &cfg.Rates}, {"idle-fleets", fleets, &cfg.IdleFleets}} {
		if *f.into, err = ints(f.name, f.value); err != nil {
			return err
		}
	}
	level := slog.LevelInfo
	if quiet {
		level = slog.LevelWarn
	}
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	if relayLog != "" {
		f, err := os.Create(relayLog)
		if err != nil {
			return fmt.Errorf("outbox-bench: %w", err)
		}
		defer f.Close()
		cfg.RelayLogger = slog.New(slog.NewJSONHandler(f, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	rep, err := bench.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if err := rep.WriteTables(stdout); err != nil {
		return err
	}
	if jsonPath != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return fmt.Errorf("outbox-bench: encode report: %w", err)
		}
		if err := os.WriteFile(jsonPath, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("outbox-bench: %w", err)
		}
	}
	return nil
}

func split(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func ints(name, s string) ([]int, error) {
	var out []int
	for _, p := range split(s) {
		n, err := strconv.Atoi(p)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("outbox-bench: -%s: %q is not a positive integer", name, p)
		}
		out = append(out, n)
	}
	return out, nil
}
