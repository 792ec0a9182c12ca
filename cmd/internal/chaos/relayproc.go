package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay"
)

// RelayConfig configures one relay child process.
type RelayConfig struct {
	Dialect string
	// DSN opens the database (with the relays' application name on
	// PostgreSQL, so that connection kills can target them).
	DSN     string
	Brokers []string
	RelayID string
	// Passed to relay.Options.
	LeaseDuration, RenewInterval, PollInterval time.Duration
	BatchSize                                  int
	// PublishTimeout is kafkapub.Config.PublishTimeout (0: the default).
	PublishTimeout time.Duration
	// TxnOutbox, when set, makes the publisher transactional with this
	// outbox name (kafkapub.Transactions.Outbox).
	TxnOutbox string
}

// Args returns the command line of the relay subcommand for c.
func (c RelayConfig) Args() []string { return childArgs("relay", c) }

// ParseRelayArgs parses what Args produced (without "relay").
func ParseRelayArgs(args []string) (c RelayConfig, err error) {
	return c, parseChildArgs(args, &c)
}

// childArgs is a child's command line: the subcommand and its
// configuration as JSON (the harness's, never typed by hand).
func childArgs(sub string, c any) []string {
	b, _ := json.Marshal(c)
	return []string{sub, string(b)}
}

func parseChildArgs(args []string, c any) error {
	if len(args) != 1 {
		return errors.New("chaos: a child takes its configuration as one JSON argument")
	}
	if err := json.Unmarshal([]byte(args[0]), c); err != nil {
		return fmt.Errorf("chaos: child configuration: %w", err)
	}
	return nil
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
// error (which names the refused call: "EndTxn (commit)" for a zombie's):
// the relay logs a fenced bucket only while it still holds its lease.
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
