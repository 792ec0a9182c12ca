package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/gorm-outbox/outbox/inbox"
	"github.com/gorm-outbox/outbox/inbox/franz"
)

// Consumer clients of the effects run.
const (
	ClientKafkaGo = "kafka-go" // inbox.Consumer over a kafka-go Reader
	ClientFranz   = "franz"    // the franz-go Consumer of module inbox/franz (read_committed)
)

// Clients returns the consumer clients of the effects run.
func Clients() []string { return []string{ClientKafkaGo, ClientFranz} }

// effectsHandler is the inbox handler name of the effects consumers.
const effectsHandler = "effects"

// Group timing of the consumer children: a killed member's partitions move
// after sessionTimeout (the broker's group.min.session.timeout.ms is 6 s by
// default), not after the clients' 30 s or 45 s defaults.
const (
	consumerSessionTimeout = 6 * time.Second
	consumerHeartbeat      = time.Second
)

// Log messages of the consumer children that the effects run reads back.
const (
	logAssigned       = "partitions assigned"
	logDuplicate      = "duplicate skipped" // inbox's, at DEBUG: passed through by consumerLogHandler
	logHandlingFailed = "handling failed; retrying the message"
)

// effect is one applied effect, in the consumer's database: the effects
// audit reads it back.
type effect struct {
	ID        int64  `gorm:"primaryKey"`
	Key       string `gorm:"column:effect_key;size:64;not null"`
	Seq       int    `gorm:"not null"`
	MessageID string `gorm:"column:message_id;size:36;not null"`
	Consumer  string `gorm:"size:64;not null"`
	Part      int    `gorm:"not null"`
	At        int64  `gorm:"column:kafka_offset;not null"`
	AppliedMs int64  `gorm:"column:applied_at_ms;not null"`
}

func (effect) TableName() string { return "chaos_effects" }

// effectCounter counts a key's applied effects.
type effectCounter struct {
	Key string `gorm:"column:effect_key;primaryKey;size:64"`
	N   int    `gorm:"not null"`
}

func (effectCounter) TableName() string { return "chaos_effect_counters" }

// ConsumerConfig configures one consumer child process (the "consumer"
// subcommand of cmd/outbox-chaos).
type ConsumerConfig struct {
	Client string // ClientKafkaGo or ClientFranz
	// Dialect and DSN open the consumer's database (with the consumers'
	// application name on PostgreSQL, so that a kill can target them).
	Dialect, DSN string
	Brokers      []string
	Group, Topic string
	ID           string // names the consumer in its effects and logs
}

// Args returns the command line of the consumer subcommand for c.
func (c ConsumerConfig) Args() []string { return childArgs("consumer", c) }

// ParseConsumerArgs parses what Args produced (without "consumer").
func ParseConsumerArgs(args []string) (c ConsumerConfig, err error) {
	return c, parseChildArgs(args, &c)
}

// ConsumerLogHandler wraps h, the consumer child's handler: it passes
// records at INFO and above, and the inbox's DEBUG "duplicate skipped"
// lines (with their message id), which the effects run reads back to prove
// that a message whose offset commit a kill prevented was redelivered and
// skipped.
func ConsumerLogHandler(h slog.Handler) slog.Handler { return consumerLogHandler{h} }

type consumerLogHandler struct{ slog.Handler }

func (consumerLogHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h consumerLogHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelInfo && r.Message != logDuplicate {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h consumerLogHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return consumerLogHandler{h.Handler.WithAttrs(as)}
}

func (h consumerLogHandler) WithGroup(name string) slog.Handler {
	return consumerLogHandler{h.Handler.WithGroup(name)}
}

// RunConsumer runs one consumer of the effects run until ctx is done: each
// record's effect, in the transaction inbox.Inbox.Handle opens, is a row of
// the effects log and one more on its key's counter. Build log with
// ConsumerLogHandler.
func RunConsumer(ctx context.Context, c ConsumerConfig, log *slog.Logger) error {
	db, err := Open(c.Dialect, c.DSN, consumerAppName, 4)
	if err != nil {
		return err
	}
	defer closeGorm(db)
	log = log.With("consumer", c.ID, "client", c.Client)
	ib, err := inbox.New(db, inbox.Options{Logger: log})
	if err != nil {
		return err
	}
	copts := inbox.ConsumerOptions{RetryBackoff: 50 * time.Millisecond, MaxRetryBackoff: time.Second}
	apply := func(tx *gorm.DB, key, value []byte, id string, partition int, offset int64) error {
		seq, err := strconv.Atoi(string(value))
		if err != nil {
			return fmt.Errorf("chaos: value %q: %w", value, err)
		}
		if err := tx.Create(&effect{Key: string(key), Seq: seq, MessageID: id, Consumer: c.ID, Part: partition, At: offset, AppliedMs: time.Now().UnixMilli()}).Error; err != nil {
			return err
		}
		return tx.Clauses(clause.OnConflict{
			Columns:   []clause.Column{{Name: "effect_key"}},
			DoUpdates: clause.Assignments(map[string]any{"n": gorm.Expr(effectCounter{}.TableName() + ".n + 1")}),
		}).Create(&effectCounter{Key: string(key), N: 1}).Error
	}
	switch c.Client {
	case ClientKafkaGo:
		r := kafka.NewReader(kafka.ReaderConfig{
			Brokers:           c.Brokers,
			GroupID:           c.Group,
			GroupTopics:       []string{c.Topic},
			MinBytes:          1,
			MaxBytes:          10 << 20,
			MaxWait:           200 * time.Millisecond,
			StartOffset:       kafka.FirstOffset,
			SessionTimeout:    consumerSessionTimeout,
			HeartbeatInterval: consumerHeartbeat,
			RebalanceTimeout:  15 * time.Second,
			JoinGroupBackoff:  500 * time.Millisecond,
			ReadBackoffMax:    500 * time.Millisecond,
			Logger: kafka.LoggerFunc(func(msg string, args ...any) {
				if strings.HasPrefix(msg, "subscribed to topics and partitions") {
					log.Info(logAssigned, "assignment", strings.TrimPrefix(fmt.Sprintf(msg, args...), "subscribed to topics and partitions: "))
				}
			}),
			ErrorLogger: kafka.LoggerFunc(func(msg string, args ...any) {
				log.Warn("kafka-go reader error", "error", fmt.Sprintf(msg, args...))
			}),
		})
		defer r.Close()
		cons, err := inbox.NewConsumer(ib, r, effectsHandler, func(tx *gorm.DB, m kafka.Message) error {
			id, err := ib.MessageID(m)
			if err != nil {
				return err
			}
			return apply(tx, m.Key, m.Value, id, m.Partition, m.Offset)
		}, copts)
		if err != nil {
			return err
		}
		return cons.Run(ctx)
	default:
		assigned := func(what string) func(context.Context, *kgo.Client, map[string][]int32) {
			return func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
				ps := m[c.Topic]
				sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
				log.Info(what, "partitions", fmt.Sprint(ps))
			}
		}
		cons, err := franz.NewConsumer(ib, effectsHandler, func(tx *gorm.DB, r *kgo.Record) error {
			return apply(tx, r.Key, r.Value, kgoMessageID(r), int(r.Partition), r.Offset)
		}, copts,
			kgo.SeedBrokers(c.Brokers...),
			kgo.ConsumerGroup(c.Group),
			kgo.ConsumeTopics(c.Topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.FetchMaxWait(200*time.Millisecond),
			kgo.SessionTimeout(consumerSessionTimeout),
			kgo.HeartbeatInterval(consumerHeartbeat),
			kgo.RebalanceTimeout(15*time.Second),
			kgo.OnPartitionsAssigned(assigned(logAssigned)),
			kgo.OnPartitionsRevoked(assigned("partitions revoked")),
			kgo.OnPartitionsLost(assigned("partitions lost")),
			kgo.WithLogger(kgoLogger{log}),
		)
		if err != nil {
			return err
		}
		defer cons.Close()
		return cons.Run(ctx)
	}
}

// kgoLogger passes franz-go's warnings and errors to log.
type kgoLogger struct{ log *slog.Logger }

func (kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelWarn }

func (l kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	lv := slog.LevelWarn
	if level == kgo.LogLevelError {
		lv = slog.LevelError
	}
	l.log.Log(context.Background(), lv, "franz-go: "+msg, keyvals...)
}
