package chaos

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay"
)

// RelayConfig configures one relay child process.
type RelayConfig struct {
	// Dialect is sqlite, postgres or mysql.
	Dialect string
	// DSN opens the database (the relay's own application name is added on
	// PostgreSQL, so that connection kills can target relays).
	DSN string
	// Brokers are the Kafka bootstrap addresses.
	Brokers []string
	// RelayID is the relay's id in the lease table.
	RelayID string
	// LeaseDuration, RenewInterval, PollInterval and BatchSize are passed to
	// relay.Options.
	LeaseDuration time.Duration
	RenewInterval time.Duration
	PollInterval  time.Duration
	BatchSize     int
	// PublishTimeout is kafkapub.Config.PublishTimeout; zero means the
	// library's default.
	PublishTimeout time.Duration
	// TxnOutbox, when set, makes the publisher transactional with this
	// outbox name (kafkapub.Transactions.Outbox).
	TxnOutbox string
}

// Args returns the command-line arguments of the relay subcommand for c.
func (c RelayConfig) Args() []string {
	return []string{"relay",
		"-dialect", c.Dialect, "-dsn", c.DSN, "-brokers", strings.Join(c.Brokers, ","), "-id", c.RelayID,
		"-lease", c.LeaseDuration.String(), "-renew", c.RenewInterval.String(), "-poll", c.PollInterval.String(),
		"-batch", fmt.Sprint(c.BatchSize), "-publish-timeout", c.PublishTimeout.String(),
		"-txn-outbox", c.TxnOutbox,
	}
}

// ParseRelayFlags parses the arguments Args produced (without "relay").
func ParseRelayFlags(args []string) (RelayConfig, error) {
	fs := flag.NewFlagSet("relay", flag.ContinueOnError)
	var c RelayConfig
	var brokers string
	fs.StringVar(&c.Dialect, "dialect", "sqlite", "database dialect: sqlite, postgres or mysql")
	fs.StringVar(&c.DSN, "dsn", "", "database DSN")
	fs.StringVar(&brokers, "brokers", "", "Kafka bootstrap addresses, comma separated")
	fs.StringVar(&c.RelayID, "id", "", "relay id")
	fs.DurationVar(&c.LeaseDuration, "lease", 3*time.Second, "lease duration")
	fs.DurationVar(&c.RenewInterval, "renew", time.Second, "lease renew interval")
	fs.DurationVar(&c.PollInterval, "poll", 200*time.Millisecond, "poll interval")
	fs.IntVar(&c.BatchSize, "batch", 100, "batch size")
	fs.DurationVar(&c.PublishTimeout, "publish-timeout", 0, "the publisher's PublishTimeout (0: the library's default)")
	fs.StringVar(&c.TxnOutbox, "txn-outbox", "", "publish transactionally, with this outbox name (empty: the default mode)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if c.DSN == "" || brokers == "" {
		return c, errors.New("chaos: relay: -dsn and -brokers are required")
	}
	c.Brokers = strings.Split(brokers, ",")
	return c, nil
}

// RunRelay runs one relay until ctx is done (a graceful stop), then closes
// the publisher.
func RunRelay(ctx context.Context, c RelayConfig, log *slog.Logger) error {
	db, err := Open(c.Dialect, c.DSN, relayAppName, 4)
	if err != nil {
		return err
	}
	defer closeGorm(db)
	store, err := gormstore.New(db, gormstore.Options{Config: outbox.Config{}})
	if err != nil {
		return err
	}
	kc := kafkapub.Config{
		Brokers:        c.Brokers,
		PublishTimeout: c.PublishTimeout,
		Configure: func(w *kafka.Writer) {
			w.MaxAttempts = 3
			w.WriteBackoffMin = 50 * time.Millisecond
			w.WriteBackoffMax = 500 * time.Millisecond
			w.ReadTimeout = 5 * time.Second
			w.WriteTimeout = 5 * time.Second
		},
	}
	if c.TxnOutbox != "" {
		kc.Transactions = &kafkapub.Transactions{Outbox: c.TxnOutbox}
	}
	kp, err := kafkapub.New(kc)
	if err != nil {
		return err
	}
	defer kp.Close()
	pub := &fenceLogger{Publisher: kp, log: log}
	r, err := relay.New(store, pub, relay.Options{
		RelayID:            c.RelayID,
		LeaseDuration:      c.LeaseDuration,
		LeaseRenewInterval: c.RenewInterval,
		PollInterval:       c.PollInterval,
		ErrorBackoff:       250 * time.Millisecond,
		BatchSize:          c.BatchSize,
		StopTimeout:        5 * time.Second,
		Logger:             log,
		SingleWriter:       c.Dialect == "sqlite",
	})
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

// logFenced is the WARN line of a relay child whose publish the broker
// fenced: the effects run reads it back to prove that a zombie's commit was
// refused.
const logFenced = "publish fenced"

// fenceLogger logs every publish that failed with relay.ErrFenced, with its
// error (which names the refused call: "EndTxn (commit)" for a zombie's
// commit). The relay logs a fenced bucket only while it still holds the
// bucket's lease; this line does not depend on what the relay knows. Every
// other method of the publisher (the ownership calls of fenced publishing)
// is the embedded one.
type fenceLogger struct {
	*kafkapub.Publisher
	log *slog.Logger
}

func (p *fenceLogger) Publish(ctx context.Context, batches [][]*outbox.Message) []relay.Result {
	results := p.Publisher.Publish(ctx, batches)
	for i, res := range results {
		if errors.Is(res.Err, relay.ErrFenced) {
			p.log.Warn(logFenced, "rows", len(batches[i]), "acknowledged", res.Acknowledged, "error", res.Err)
		}
	}
	return results
}
