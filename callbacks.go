package outbox

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"time"

	"gorm.io/gorm"
)

// Keys under which the plugin keeps per-statement state in gorm settings.
const (
	configKey   = "outbox:config"
	preparedKey = "outbox:prepared"
)

// ErrInvalidMessage is wrapped by the error Create returns for a message the
// outbox cannot accept (empty, over-long or illegal topic, negative
// partition, bucket disagreement). Nothing is written.
var ErrInvalidMessage = errors.New("outbox: invalid message")

// topicChars are the characters Kafka allows in a topic name.
var topicChars = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)

var messageType = reflect.TypeOf(Message{})

func register(db *gorm.DB, p *Plugin) error {
	state := &notifyState{notifier: p.Notifier, logger: p.Logger}
	if _, ok := p.Notifier.(NonBlocking); ok {
		state.inline = true
	}
	if err := installPool(db, state); err != nil {
		return err
	}
	create := db.Callback().Create()
	if err := create.Before("gorm:before_create").Register("outbox:prepare", p.prepareStatement); err != nil {
		return fmt.Errorf("outbox: register outbox:prepare: %w", err)
	}
	if err := create.After("gorm:create").Register("outbox:collect_buckets", p.collectBuckets); err != nil {
		return fmt.Errorf("outbox: register outbox:collect_buckets: %w", err)
	}
	if err := db.Callback().Raw().After("gorm:raw").Register("outbox:track_savepoints", trackSavepoints); err != nil {
		return fmt.Errorf("outbox: register outbox:track_savepoints: %w", err)
	}
	return nil
}

// configFrom returns the effective configuration of a statement: a
// WithConfig scope, else the registered Plugin's, else the defaults.
func configFrom(db *gorm.DB) (Config, error) {
	if sc, ok := scopeOf(db); ok {
		if err := sc.cfg.Validate(); err != nil {
			return Config{}, err
		}
		return sc.cfg.WithDefaults(), nil
	}
	if p, ok := db.Config.Plugins[PluginName]; ok {
		switch p := p.(type) {
		case Plugin:
			return p.Config.WithDefaults(), nil
		case *Plugin:
			return p.Config.WithDefaults(), nil
		}
	}
	return Config{}.WithDefaults(), nil
}

// scope is what WithConfig and WithOutbox put on a statement.
type scope struct {
	cfg    Config
	notify *notifyState // nil: rows of this scope notify nobody
}

func scopeOf(db *gorm.DB) (scope, bool) {
	v, ok := db.Get(configKey)
	if !ok {
		return scope{}, false
	}
	sc, ok := v.(scope)
	return sc, ok
}

// isMessageStatement reports whether the statement creates outbox messages.
func isMessageStatement(db *gorm.DB) bool {
	return db.Statement.Schema != nil && db.Statement.Schema.ModelType == messageType
}

// prepareStatement fills, validates and routes the outbox messages of a
// create statement. Other models pass through untouched.
func (p *Plugin) prepareStatement(db *gorm.DB) {
	if db.Error != nil || !isMessageStatement(db) {
		return
	}
	cfg := p.Config
	if _, scoped := scopeOf(db); scoped {
		var err error
		if cfg, err = configFrom(db); err != nil {
			db.AddError(err)
			return
		}
	}
	stmt := db.Statement
	if stmt.TableExpr == nil && (stmt.Table == "" || stmt.Table == DefaultMessagesTable) {
		stmt.Table = cfg.MessagesTableName()
	}
	now := time.Now()
	if err := eachMessage(stmt.ReflectValue, func(i int, m *Message) error {
		if err := cfg.prepare(m, now); err != nil {
			if i >= 0 {
				return fmt.Errorf("message %d: %w", i, err)
			}
			return err
		}
		return nil
	}); err != nil {
		db.AddError(err)
		return
	}
	db.Statement.Settings.Store(preparedKey, true)
}

// eachMessage calls fn with every *Message of a create statement's value and
// its index (-1 for a single struct).
func eachMessage(rv reflect.Value, fn func(int, *Message) error) error {
	switch rv.Kind() {
	case reflect.Struct:
		if !rv.CanAddr() {
			return fmt.Errorf("%w: create messages through a pointer (&msg)", ErrInvalidMessage)
		}
		return fn(-1, rv.Addr().Interface().(*Message))
	case reflect.Slice, reflect.Array:
		for i := 0; i < rv.Len(); i++ {
			e := rv.Index(i)
			if e.Kind() == reflect.Pointer {
				if e.IsNil() {
					return fmt.Errorf("%w: message %d is nil", ErrInvalidMessage, i)
				}
				e = e.Elem()
			}
			if !e.CanAddr() {
				return fmt.Errorf("%w: create messages through a pointer (&msgs)", ErrInvalidMessage)
			}
			if err := fn(i, e.Addr().Interface().(*Message)); err != nil {
				return err
			}
		}
		return nil
	default:
		return fmt.Errorf("%w: create messages from Message structs, not %s", ErrInvalidMessage, rv.Kind())
	}
}

// ValidateTopic reports whether topic is a legal Kafka topic name: 1 to 249
// characters from [A-Za-z0-9._-], and neither "." nor "..".
func ValidateTopic(topic string) error {
	switch {
	case topic == "":
		return fmt.Errorf("%w: topic is empty", ErrInvalidMessage)
	case len(topic) > MaxTopicLength:
		return fmt.Errorf("%w: topic is %d characters long; the limit is %d", ErrInvalidMessage, len(topic), MaxTopicLength)
	case topic == "." || topic == "..":
		return fmt.Errorf("%w: topic %q is not allowed", ErrInvalidMessage, topic)
	case !topicChars.MatchString(topic):
		return fmt.Errorf("%w: topic %q has characters outside [A-Za-z0-9._-]", ErrInvalidMessage, topic)
	}
	return nil
}

// prepare validates m and fills its generated fields. cfg has its defaults
// applied. The database always assigns ID: a caller's value (left over from
// a rolled-back attempt, say) is cleared so that ids stay in commit order.
func (c Config) prepare(m *Message, now time.Time) error {
	if err := ValidateTopic(m.Topic); err != nil {
		return err
	}
	if m.Partition != nil && *m.Partition < 0 {
		return fmt.Errorf("%w: partition %d is negative", ErrInvalidMessage, *m.Partition)
	}
	if m.MessageID.IsZero() {
		m.MessageID = NewUUID()
	}
	if m.CreatedAt.IsZero() {
		m.CreatedAt = now
	}
	m.CreatedAt = m.CreatedAt.UTC()
	b := BucketOf(m.Key, m.Partition, m.MessageID, c.BucketCount)
	if m.Bucket != 0 && m.Bucket != b {
		return fmt.Errorf("%w: bucket %d set by the caller disagrees with bucket %d for BucketCount %d", ErrInvalidMessage, m.Bucket, b, c.BucketCount)
	}
	m.Bucket = b
	m.ID = 0
	return nil
}
