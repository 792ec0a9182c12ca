// Command outbox-chaos is the reliability harness of gorm-outbox (see
// CHAOS.md). Build it with the failpoints compiled in:
//
//	go build -tags outbox_failpoints -o /tmp/outbox-chaos ./cmd/outbox-chaos
//
// Subcommands: matrix (the crash matrix), run (a chaos run), effects (the
// effects run; CHAOS.md gives their flags and output), and the children the
// harness starts, "relay" and "consumer", each configured by one JSON
// argument.
//
// The database and broker come from the test environment variables
// (OUTBOX_TEST_POSTGRES_DSN, OUTBOX_TEST_MYSQL_DSN, OUTBOX_TEST_KAFKA_BROKERS);
// without OUTBOX_TEST_KAFKA_BROKERS an in-process kfake broker is used, which
// also enables broker faults (produce errors, dropped connections).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/gorm-outbox/outbox/cmd/internal/chaos"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: outbox-chaos matrix|run|effects [flags]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	var err error
	switch args := os.Args[2:]; os.Args[1] {
	case "relay":
		var c chaos.RelayConfig
		if c, err = chaos.ParseRelayArgs(args); err == nil {
			err = chaos.RunRelay(ctx, c, log)
		}
	case "consumer":
		var c chaos.ConsumerConfig
		if c, err = chaos.ParseConsumerArgs(args); err == nil {
			err = chaos.RunConsumer(ctx, c, slog.New(chaos.ConsumerLogHandler(slog.NewTextHandler(os.Stderr, nil))))
		}
	case "effects", "matrix", "run":
		err = harness(ctx, os.Args[1], args, log)
	default:
		err = fmt.Errorf("unknown subcommand %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "outbox-chaos:", err)
		os.Exit(1)
	}
}

// harness runs the subcommand sub: the flags, the environment's database
// and broker, this executable as the children, a temporary directory.
func harness(ctx context.Context, sub string, args []string, log *slog.Logger) error {
	fs := flag.NewFlagSet(sub, flag.ContinueOnError)
	dialect := fs.String("db", chaos.Postgres, "database: postgres, mysql or sqlite (effects: postgres or mysql)")
	messages := fs.Int("messages", map[string]int{"matrix": 3000, "run": 20000, "effects": 20000}[sub], "messages to write (matrix: per cell; effects: business rows)")
	txn := fs.Bool("txn", false, "matrix, run: the transactional variant: relays publish in Kafka transactions, the checker reads read_committed")
	relays := fs.Int("relays", 3, "run: relay processes")
	faults := fs.Int("faults", 24, "run: faults to inject")
	writeFor := fs.Duration("write-for", map[string]time.Duration{"run": 75 * time.Second, "effects": 5 * time.Minute}[sub], "run, effects: how long the writers take to write the messages")
	mode := fs.String("mode", "both", "effects: relay mode: default, fenced or both (one run each)")
	rounds := fs.Int("rounds", 5, "effects: how many times each fault kind is injected")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var dsn string
	switch *dialect {
	case chaos.Postgres:
		dsn = os.Getenv(testenv.EnvPostgres)
	case chaos.MySQL:
		dsn = os.Getenv(testenv.EnvMySQL)
	case chaos.SQLite:
		dsn = "-"
	}
	if dsn == "" {
		return fmt.Errorf("no DSN for %s in the environment", *dialect)
	}
	var brokers []string
	if v := os.Getenv(testenv.EnvKafka); v != "" {
		brokers = strings.Split(v, ",")
	}
	bin, err := os.Executable()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "outbox-chaos-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	env := chaos.Env{Bin: bin, Dialect: *dialect, BaseDSN: dsn, Brokers: brokers, Dir: dir, Logger: log}
	switch sub {
	case "matrix":
		rows, err := chaos.CrashMatrix(ctx, chaos.MatrixConfig{Env: env, Messages: *messages, Transactional: *txn})
		fmt.Print(chaos.FormatMatrix(rows, *txn))
		if err != nil {
			return err
		}
		for _, r := range rows {
			if r.Lost != 0 {
				return fmt.Errorf("%s, %s: %d messages lost", r.Step, r.Mode, r.Lost)
			}
		}
		return nil
	case "run":
		s, err := chaos.Run(ctx, chaos.RunConfig{Env: env, Messages: *messages, Relays: *relays, Faults: *faults, WriteFor: *writeFor, Seed: time.Now().UnixNano(), Transactional: *txn})
		fmt.Println(s)
		if err != nil {
			return err
		}
		return s.Err()
	}
	modes := map[string][]bool{"default": {false}, "fenced": {true}, "both": {false, true}}[*mode]
	if modes == nil {
		return fmt.Errorf("unknown -mode %q", *mode)
	}
	if len(brokers) == 0 {
		return fmt.Errorf("the effects run needs the real broker: set %s", testenv.EnvKafka)
	}
	pid, err := testenv.BrokerPID()
	if err != nil {
		return err
	}
	cfg := chaos.EffectsConfig{Env: env, BrokerPID: pid, Messages: *messages, WriteFor: *writeFor, Rounds: *rounds, Seed: time.Now().UnixNano()}
	var ss []chaos.EffectsSummary
	var errs []error
	for _, txn := range modes {
		cfg.Transactional = txn
		s, err := chaos.RunEffects(ctx, cfg)
		ss = append(ss, s)
		fmt.Println(s)
		for _, c := range s.Cells {
			fmt.Printf("%s mode, %s: the faults' proofs:\n%s", s.Mode, c.Client, s.Evidence(c))
		}
		if err != nil {
			return err
		}
		errs = append(errs, s.Err())
	}
	fmt.Print(chaos.FormatEffects(ss))
	return errors.Join(errs...)
}
