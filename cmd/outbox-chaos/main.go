// Command outbox-chaos is the reliability harness of gorm-outbox (see
// CHAOS.md). Build it with the failpoints compiled in:
//
//	go build -tags outbox_failpoints -o /tmp/outbox-chaos ./cmd/outbox-chaos
//
// Subcommands:
//
//	outbox-chaos matrix [-db postgres|mysql|sqlite] [-messages N] [-txn]
//	    the crash matrix: SIGKILL a relay child at each step, print the table
//	outbox-chaos run [-db ...] [-messages N] [-relays N] [-faults N] [-write-for D] [-txn]
//	    a chaos run; prints one summary line, exits 1 on a failed check
//	outbox-chaos effects [-db postgres|mysql] [-mode default|fenced|both] [-messages N] [-write-for D] [-rounds N] [-logs DIR]
//	    the effects run: business rows, relays, inbox consumers of both
//	    clients in their own databases, every fault injected -rounds
//	    times; prints a table and one line per cell, exits 1 on a failed
//	    check (needs the real broker and scripts/services.sh's pid file)
//	outbox-chaos relay -dialect ... -dsn ... -brokers ... -id ...
//	    one relay process (the child the harness starts)
//	outbox-chaos consumer -client kafka-go|franz -dialect ... -dsn ... -brokers ... -group ... -topic ... -id ...
//	    one consumer process of the effects run (the child it starts)
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
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: outbox-chaos matrix|run|effects|relay|consumer [flags]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	var err error
	switch os.Args[1] {
	case "relay":
		var c chaos.RelayConfig
		if c, err = chaos.ParseRelayFlags(os.Args[2:]); err == nil {
			err = chaos.RunRelay(ctx, c, log)
		}
	case "consumer":
		var c chaos.ConsumerConfig
		if c, err = chaos.ParseConsumerFlags(os.Args[2:]); err == nil {
			err = chaos.RunConsumer(ctx, c, slog.New(chaos.ConsumerLogHandler(slog.NewTextHandler(os.Stderr, nil))))
		}
	case "effects":
		err = effects(ctx, os.Args[2:], log)
	case "matrix":
		err = matrix(ctx, os.Args[2:], log)
	case "run":
		err = run(ctx, os.Args[2:], log)
	default:
		err = fmt.Errorf("unknown subcommand %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "outbox-chaos:", err)
		os.Exit(1)
	}
}

// env returns the dialect's base DSN and the brokers (nil: in-process).
func env(dialect string) (string, []string, error) {
	var dsn string
	switch dialect {
	case chaos.Postgres:
		dsn = os.Getenv("OUTBOX_TEST_POSTGRES_DSN")
	case chaos.MySQL:
		dsn = os.Getenv("OUTBOX_TEST_MYSQL_DSN")
	case chaos.SQLite:
		dsn = "-"
	}
	if dsn == "" {
		return "", nil, fmt.Errorf("no DSN for %s in the environment", dialect)
	}
	var brokers []string
	if v := os.Getenv("OUTBOX_TEST_KAFKA_BROKERS"); v != "" {
		brokers = strings.Split(v, ",")
	}
	return dsn, brokers, nil
}

func self() (bin, dir string, err error) {
	if bin, err = os.Executable(); err != nil {
		return "", "", err
	}
	dir, err = os.MkdirTemp("", "outbox-chaos-")
	return bin, dir, err
}

func matrix(ctx context.Context, args []string, log *slog.Logger) error {
	fs := flag.NewFlagSet("matrix", flag.ContinueOnError)
	dialect := fs.String("db", chaos.Postgres, "database: postgres, mysql or sqlite")
	messages := fs.Int("messages", 3000, "messages per cell")
	txn := fs.Bool("txn", false, "the transactional variant: relays publish in Kafka transactions, the checker reads read_committed")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dsn, brokers, err := env(*dialect)
	if err != nil {
		return err
	}
	bin, dir, err := self()
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	rows, err := chaos.CrashMatrix(ctx, chaos.MatrixConfig{Bin: bin, Dialect: *dialect, BaseDSN: dsn, Brokers: brokers, Dir: dir, Messages: *messages, Logger: log, Transactional: *txn})
	if *txn {
		fmt.Print(chaos.FormatTxnMatrix(rows))
	} else {
		fmt.Print(chaos.FormatMatrix(rows))
	}
	if err != nil {
		return err
	}
	for _, r := range rows {
		if r.Lost != 0 {
			return fmt.Errorf("%s, %s: %d messages lost", r.Step, r.Mode, r.Lost)
		}
	}
	return nil
}

func run(ctx context.Context, args []string, log *slog.Logger) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	dialect := fs.String("db", chaos.Postgres, "database: postgres, mysql or sqlite")
	cfg := chaos.RunConfig{}
	fs.IntVar(&cfg.Messages, "messages", 20000, "messages to write")
	fs.IntVar(&cfg.Relays, "relays", 3, "relay processes")
	fs.IntVar(&cfg.Faults, "faults", 24, "faults to inject")
	fs.DurationVar(&cfg.WriteFor, "write-for", 75*time.Second, "how long the writers take to write the messages")
	fs.Int64Var(&cfg.Seed, "seed", time.Now().UnixNano(), "random seed")
	fs.BoolVar(&cfg.Transactional, "txn", false, "the transactional variant: relays publish in Kafka transactions, the checker reads read_committed")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dsn, brokers, err := env(*dialect)
	if err != nil {
		return err
	}
	bin, dir, err := self()
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfg.Bin, cfg.Dialect, cfg.BaseDSN, cfg.Brokers, cfg.Dir, cfg.Logger = bin, *dialect, dsn, brokers, dir, log
	s, err := chaos.Run(ctx, cfg)
	fmt.Println(s)
	if err != nil {
		return err
	}
	return s.Err()
}

func effects(ctx context.Context, args []string, log *slog.Logger) error {
	fs := flag.NewFlagSet("effects", flag.ContinueOnError)
	dialect := fs.String("db", chaos.Postgres, "database: postgres or mysql")
	mode := fs.String("mode", "both", "relay mode: default, fenced or both (one run each)")
	cfg := chaos.EffectsConfig{}
	fs.IntVar(&cfg.Messages, "messages", 20000, "business rows to write")
	fs.DurationVar(&cfg.WriteFor, "write-for", 5*time.Minute, "how long the writers take to write them")
	fs.IntVar(&cfg.Rounds, "rounds", 5, "how many times each fault kind is injected")
	fs.IntVar(&cfg.Keys, "keys", 32, "keys")
	fs.IntVar(&cfg.Relays, "relays", 3, "relay processes")
	fs.IntVar(&cfg.Consumers, "consumers", 2, "consumer processes per client")
	fs.Int64Var(&cfg.Seed, "seed", time.Now().UnixNano(), "random seed")
	logs := fs.String("logs", "", "keep the children's logs in this directory (default: a temporary one, removed)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var modes []bool
	switch *mode {
	case "default":
		modes = []bool{false}
	case "fenced":
		modes = []bool{true}
	case "both":
		modes = []bool{false, true}
	default:
		return fmt.Errorf("unknown -mode %q", *mode)
	}
	dsn, brokers, err := env(*dialect)
	if err != nil {
		return err
	}
	if len(brokers) == 0 {
		return fmt.Errorf("the effects run needs the real broker: set OUTBOX_TEST_KAFKA_BROKERS")
	}
	pid, err := chaos.ServicesBrokerPID()
	if err != nil {
		return err
	}
	bin, dir, err := self()
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if *logs != "" {
		dir = *logs
	}
	cfg.Bin, cfg.Dialect, cfg.BaseDSN, cfg.Brokers, cfg.BrokerPID, cfg.Dir, cfg.Logger = bin, *dialect, dsn, brokers, pid, dir, log
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
