// Package outbox is a transactional outbox for services built on GORM and
// Kafka.
//
// A service writes its business rows and the Kafka records it must send in
// one database transaction; a relay (package relay) publishes the committed
// records to Kafka with acks=all and deletes them only after the broker
// acknowledged them. Nothing is lost, nothing is sent for a rolled-back
// transaction, and every record carries a stable message-id header
// (x-outbox-message-id) so consumers can deduplicate.
//
// Register the Plugin right after gorm.Open, create the tables, and give
// the same notifier to the plugin and to the relay (package relay):
//
//	cfg := outbox.Config{}          // 8 buckets, tables outbox_messages / outbox_leases / outbox_relays
//	notifier := relay.NewNotifier() // wakes the relay after each commit; it can exist before the relay
//	if err := db.Use(outbox.Plugin{Config: cfg, Notifier: notifier}); err != nil {
//		return err
//	}
//	if err := outbox.AutoMigrate(db, cfg); err != nil { // or apply migrations/<dialect>.sql
//		return err
//	}
//	// later, the relay: relay.New(store, pub, relay.Options{Notifier: notifier})
//
// Then create messages in the same transaction as the business change:
//
//	err := db.Transaction(func(tx *gorm.DB) error {
//		if err := tx.Create(&order).Error; err != nil {
//			return err
//		}
//		return tx.Create(&outbox.Message{Topic: "orders", Key: []byte(order.ID), Value: payload}).Error
//	})
//
// Create fills the message id, the bucket and the creation time, routes the
// row to the configured table and rejects invalid messages before anything
// is written. The Plugin wraps the connection pool beneath GORM: reach the
// pool with db.DB(), not a type assertion (see docs/writing.md).
package outbox

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

const (
	// PluginName is the name the Plugin registers under (gorm.Plugin.Name).
	PluginName = "outbox"
	// DefaultBucketCount is the number of ordering buckets when
	// Config.BucketCount is zero.
	DefaultBucketCount = 8
	// MaxBucketCount bounds Config.BucketCount.
	MaxBucketCount = 1 << 16
)

// Config names one logical outbox: its bucket count and its tables, shared
// by the Plugin (writers) and the store (relays). A zero Config means the
// defaults; the names are used as they are (GORM's NamingStrategy does not
// apply).
type Config struct {
	// BucketCount is the number of ordering buckets, an upper bound on relay
	// parallelism; it must be the lease table's (see CheckBucketCount). Zero
	// means DefaultBucketCount.
	BucketCount int
	// Schema optionally qualifies the three table names.
	Schema string
	// MessagesTable is the pending-messages table; empty means DefaultMessagesTable.
	MessagesTable string
	// LeasesTable is the bucket-lease table; empty means DefaultLeasesTable.
	LeasesTable string
	// RelaysTable is the relay-heartbeat table; empty means DefaultRelaysTable.
	RelaysTable string
}

// identifier is what a table or schema name may be (63 characters: the
// PostgreSQL limit); it keeps incident-time SQL simple and injection out.
var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// WithDefaults returns c with every zero field replaced by its default.
func (c Config) WithDefaults() Config {
	c.BucketCount = cmp.Or(c.BucketCount, DefaultBucketCount)
	c.MessagesTable = cmp.Or(c.MessagesTable, DefaultMessagesTable)
	c.LeasesTable = cmp.Or(c.LeasesTable, DefaultLeasesTable)
	c.RelaysTable = cmp.Or(c.RelaysTable, DefaultRelaysTable)
	return c
}

// Validate reports the first invalid field of c (after defaults), naming it.
func (c Config) Validate() error {
	if err := c.validate(); err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	return nil
}

// validate is Validate without the package prefix.
func (c Config) validate() error {
	c = c.WithDefaults()
	if c.BucketCount < 1 || c.BucketCount > MaxBucketCount {
		return fmt.Errorf("Config.BucketCount %d: must be between 1 and %d", c.BucketCount, MaxBucketCount)
	}
	if c.Schema != "" && !identifier.MatchString(c.Schema) {
		return fmt.Errorf("Config.Schema %q: must match %s", c.Schema, identifier)
	}
	for _, f := range []struct{ name, v string }{
		{"MessagesTable", c.MessagesTable}, {"LeasesTable", c.LeasesTable}, {"RelaysTable", c.RelaysTable},
	} {
		if !identifier.MatchString(f.v) {
			return fmt.Errorf("Config.%s %q: must match %s", f.name, f.v, identifier)
		}
	}
	if c.MessagesTable == c.LeasesTable || c.MessagesTable == c.RelaysTable || c.LeasesTable == c.RelaysTable {
		return fmt.Errorf("Config tables %q, %q, %q: must be distinct", c.MessagesTable, c.LeasesTable, c.RelaysTable)
	}
	return nil
}

func (c Config) qualify(table string) string {
	if c.Schema == "" {
		return table
	}
	return c.Schema + "." + table
}

// MessagesTableName returns the schema-qualified messages table name (after
// defaults), in the form GORM's Table accepts.
func (c Config) MessagesTableName() string { c = c.WithDefaults(); return c.qualify(c.MessagesTable) }

// LeasesTableName returns the schema-qualified leases table name.
func (c Config) LeasesTableName() string { c = c.WithDefaults(); return c.qualify(c.LeasesTable) }

// RelaysTableName returns the schema-qualified relays table name.
func (c Config) RelaysTableName() string { c = c.WithDefaults(); return c.qualify(c.RelaysTable) }

// ErrMisconfigured is wrapped by the error of a writer or relay whose bucket
// count differs from the lease table's (relay.ErrMisconfigured too).
var ErrMisconfigured = errors.New("misconfigured")

// FleetBucketCount returns the lease table's largest bucket plus one, or 0
// while the table has no rows.
func FleetBucketCount(ctx context.Context, db *gorm.DB, cfg Config) (int, error) {
	var top sql.NullInt64
	table := cfg.LeasesTableName()
	if err := db.WithContext(ctx).Table(table).Select("MAX(bucket)").Scan(&top).Error; err != nil {
		return 0, fmt.Errorf("outbox: read the bucket count of %s: %w", table, err)
	}
	if !top.Valid {
		return 0, nil
	}
	return int(top.Int64) + 1, nil
}

// CheckBucketCount returns an error wrapping ErrMisconfigured when cfg's
// bucket count differs from FleetBucketCount's (nil while the lease table
// is empty). It is one indexed read: call it when a writer starts.
func CheckBucketCount(ctx context.Context, db *gorm.DB, cfg Config) error {
	n, err := FleetBucketCount(ctx, db, cfg)
	if err != nil || n == 0 {
		return err
	}
	if want := cfg.WithDefaults().BucketCount; n != want {
		return fmt.Errorf("outbox: the lease table %s holds %d buckets and Config.BucketCount is %d: every writer and relay must use the table's count (change it with outbox-relay rebucket): %w",
			cfg.LeasesTableName(), n, want, ErrMisconfigured)
	}
	return nil
}

// seedLeases creates the free lease rows 0…N−1 of an empty lease table.
func seedLeases(db *gorm.DB, cfg Config) error {
	n, err := FleetBucketCount(db.Statement.Context, db, cfg)
	if err != nil || n > 0 {
		return err
	}
	rows := make([]BucketLease, cfg.WithDefaults().BucketCount)
	for i := range rows {
		rows[i].Bucket = int32(i)
	}
	err = db.Session(&gorm.Session{SkipDefaultTransaction: true}).Table(cfg.LeasesTableName()).
		Clauses(clause.OnConflict{DoNothing: true}).CreateInBatches(&rows, 1000).Error
	if err != nil {
		return fmt.Errorf("outbox: seed %d lease rows in %s: %w", len(rows), cfg.LeasesTableName(), err)
	}
	return nil
}

// AutoMigrate creates or updates the three tables of cfg to the DDL of
// migrations/<dialect>.sql and its later steps, and seeds the lease rows of
// an empty lease table. It changes nothing, with an error wrapping
// ErrMisconfigured, when the lease table holds another bucket count.
func AutoMigrate(db *gorm.DB, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if cfg.Schema != "" && db.Dialector.Name() == "sqlite" {
		// gorm's sqlite migrator qualifies the indexed table, not the index
		// name, which SQLite rejects for attached databases.
		return fmt.Errorf("outbox: AutoMigrate with Config.Schema %q is not supported on SQLite; apply migrations/sqlite.sql inside the attached database instead", cfg.Schema)
	}
	if db.Migrator().HasTable(cfg.LeasesTableName()) {
		if err := CheckBucketCount(db.Statement.Context, db, cfg); err != nil {
			return err
		}
	}
	for _, m := range []struct {
		table string
		model any
	}{
		{cfg.MessagesTableName(), &Message{}},
		{cfg.LeasesTableName(), &BucketLease{}},
		{cfg.RelaysTableName(), &RelayHeartbeat{}},
	} {
		if err := db.Table(m.table).AutoMigrate(m.model); err != nil {
			return fmt.Errorf("outbox: migrate %s: %w", m.table, err)
		}
	}
	// Version 1's index (bucket, id) is replaced by (bucket, parked_at_ms,
	// id); GORM never drops an index by itself.
	table := cfg.MessagesTableName()
	old := db.NamingStrategy.IndexName(table, "bucket_id")
	if mig := db.Table(table).Migrator(); mig.HasIndex(&Message{}, old) {
		if err := db.Table(table).Migrator().DropIndex(&Message{}, old); err != nil {
			return fmt.Errorf("outbox: migrate %s: drop the replaced index %s: %w", table, old, err)
		}
	}
	if db.Dialector.Name() == "postgres" {
		if err := leaseFillfactor(db, cfg.LeasesTableName()); err != nil {
			return err
		}
	}
	return seedLeases(db, cfg)
}

// leaseFillfactor leaves room in each page of PostgreSQL's leases table so
// that a renewal is a heap-only update in place.
func leaseFillfactor(db *gorm.DB, table string) error {
	name := (&gorm.Statement{DB: db}).Quote(clause.Table{Name: table})
	var opts string
	if err := db.Raw("SELECT COALESCE(array_to_string(reloptions, ','), '') FROM pg_class WHERE oid = to_regclass(?)", name).Scan(&opts).Error; err != nil {
		return fmt.Errorf("outbox: migrate %s: read its storage parameters: %w", table, err)
	}
	if slices.Contains(strings.Split(opts, ","), "fillfactor=40") {
		return nil
	}
	if err := db.Exec("ALTER TABLE " + name + " SET (fillfactor = 40)").Error; err != nil {
		return fmt.Errorf("outbox: migrate %s: set fillfactor 40: %w", table, err)
	}
	return nil
}

// CommitNotifier is told, after a successful commit, that outbox rows were
// written; the relay's notifier implements it. It must be safe for
// concurrent use; a panic in it is recovered and logged.
type CommitNotifier interface {
	// NotifyCommitted reports committed rows in unknown buckets.
	NotifyCommitted()
}

// BucketNotifier is a CommitNotifier that accepts exact bucket hints: one
// bucket, or several in a slice it must not retain.
type BucketNotifier interface {
	CommitNotifier
	NotifyBucket(bucket int)
	NotifyBuckets(buckets []int)
}

// Plugin registers the outbox callbacks on a *gorm.DB (db.Use): a
// tx.Create of messages fills, validates and writes them to the configured
// table, and after a successful commit the Notifier learns which buckets
// were written. GORM statements on the outbox models go to the configured
// tables unless they name their own (db.Table). A plain create of messages
// is written by the plugin's own INSERT in place of gorm:create.
//
// Register the plugin before deriving sessions from db: a transaction begun
// on an earlier session cannot be followed (logged once at WARN), so the
// relay finds its rows by polling. See docs/writing.md.
type Plugin struct {
	// Config names the outbox tables and bucket count.
	Config Config
	// Notifier, when non-nil, is told about committed outbox rows. It never
	// delays or fails a commit: a panic in it is recovered and logged.
	Notifier CommitNotifier
	// SkipIDReadBack leaves Message.ID at 0 after the plugin's INSERTs
	// instead of reading the database-assigned id back; nothing in the
	// outbox needs it, and on PostgreSQL it saves a result row per create.
	SkipIDReadBack bool
	// Logger receives the plugin's rare logs (a recovered notifier panic, a
	// commit it could not follow). Nil means slog.Default().
	Logger *slog.Logger
	// Propagator injects a create's trace context into the headers of each
	// new message, never replacing the caller's (see docs/writing.md,
	// Tracing). Nil means otel.GetTextMapPropagator(), read at each create.
	Propagator propagation.TextMapPropagator

	state *notifyState // set by Initialize
}

// Name implements gorm.Plugin.
func (Plugin) Name() string { return PluginName }

// Initialize implements gorm.Plugin: it validates the Config and registers
// the callbacks. One *gorm.DB takes one Plugin.
func (p Plugin) Initialize(db *gorm.DB) error {
	if err := p.Config.Validate(); err != nil {
		return err
	}
	p.Config = p.Config.WithDefaults()
	p.state = newNotifyState(p.Notifier, p.Logger)
	return register(db, &p, p.state)
}

// WithConfig returns a scope that routes the messages created in it to the
// outbox cfg names, for a second logical outbox in the same database
// (tx.Scopes(outbox.WithConfig(billing)).Create(&msg)). Their commit
// notifies nobody: use WithOutbox to wake that outbox's relay.
func WithConfig(cfg Config) func(*gorm.DB) *gorm.DB {
	return WithOutbox(cfg, nil)
}

// WithOutbox is WithConfig whose rows, after a successful commit, are
// reported to n (the relay.Notifier of the relay draining cfg's tables) as
// to a Plugin's Notifier; a nil n notifies nobody.
func WithOutbox(cfg Config, n CommitNotifier) func(*gorm.DB) *gorm.DB {
	sc := scope{cfg: cfg}
	if n != nil {
		sc.notify = newNotifyState(n, nil)
	}
	return func(db *gorm.DB) *gorm.DB {
		return db.Set(configKey, sc)
	}
}

// NewMessage returns a message for topic with the given key and value, used
// as they are (no copy): a nil key is keyless, a nil value a tombstone.
func NewMessage(topic string, key, value []byte, headers ...Header) *Message {
	return &Message{Topic: topic, Key: key, Value: value, Headers: headers}
}

// NewStringMessage returns a message whose key and value are the UTF-8 bytes
// of the given strings; an empty key is a real key (NewMessage makes keyless).
func NewStringMessage(topic, key, value string, headers ...Header) *Message {
	return &Message{Topic: topic, Key: []byte(key), Value: []byte(value), Headers: headers}
}

// NewJSONMessage returns a message whose value is v encoded as JSON and
// whose key is the UTF-8 bytes of key.
func NewJSONMessage(topic, key string, v any, headers ...Header) (*Message, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("outbox: encode %s message: %w", topic, err)
	}
	return &Message{Topic: topic, Key: []byte(key), Value: b, Headers: headers}, nil
}

// Enqueue writes msgs in tx with one multi-row INSERT, filling their
// generated fields. Unlike Create, which validates per statement, it
// validates every message first, so an invalid one writes nothing.
func Enqueue(tx *gorm.DB, msgs ...*Message) error {
	if len(msgs) == 0 {
		return nil
	}
	cfg, err := configFrom(tx)
	if err != nil {
		return fmt.Errorf("outbox: enqueue %d messages: %w", len(msgs), err)
	}
	now := time.Now()
	for i, m := range msgs {
		if m == nil {
			return fmt.Errorf("outbox: enqueue %d messages: %w: message %d is nil", len(msgs), ErrInvalidMessage, i)
		}
		c := *m // validated on a copy: Create fills the messages
		if err := cfg.prepare(&c, now, false); err != nil {
			return fmt.Errorf("outbox: enqueue %d messages: message %d: %w", len(msgs), i, err)
		}
	}
	if err := tx.Create(&msgs).Error; err != nil {
		if oe := (outboxError{}); errors.As(err, &oe) {
			err = oe.err // the plugin's: this context replaces its prefix
		}
		return fmt.Errorf("outbox: enqueue %d messages: %w", len(msgs), err)
	}
	return nil
}
