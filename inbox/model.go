package inbox

import (
	"cmp"
	"fmt"
	"regexp"
	"strconv"

	"gorm.io/gorm"
	"gorm.io/gorm/schema"
)

// DefaultTable is the processed-messages table when Config.Table is empty.
const DefaultTable = "inbox_processed_messages"

// MaxHandlerLength is the longest handler name, in bytes: the width of the
// handler_name column.
const MaxHandlerLength = 128

// MaxMessageIDLength is the longest message id, in bytes: the width of the
// message_id column, room for an id Options.IDFromOffset derives.
const MaxMessageIDLength = 300

// ProcessedMessage is one row of the processed-messages table: a message
// whose effect a handler committed, recorded once per handler.
type ProcessedMessage struct {
	// HandlerName names the handler that processed the message.
	HandlerName ExactString `gorm:"column:handler_name;primaryKey;size:128;not null"`
	// MessageID is the message's id (the outbox's message-id header, or the
	// id Options.IDFromOffset derives), 1 to MaxMessageIDLength bytes.
	MessageID ExactString `gorm:"column:message_id;primaryKey;size:300;not null"`
	// ProcessedAtMs is when the message was recorded, in Unix milliseconds
	// on Options.Clock.
	ProcessedAtMs int64 `gorm:"column:processed_at_ms;not null;index"`
}

// ExactString is text the database compares byte for byte, as a message id
// must be: on MySQL and MariaDB varbinary, as their default collations
// ignore case and trailing spaces.
type ExactString string

// GormDBDataType gives the column type per database: varchar(size) on
// PostgreSQL, varbinary(size) on MySQL/MariaDB, text on SQLite.
func (ExactString) GormDBDataType(db *gorm.DB, f *schema.Field) string {
	size := strconv.Itoa(f.Size)
	switch db.Dialector.Name() {
	case "postgres":
		return "varchar(" + size + ")"
	case "mysql":
		return "varbinary(" + size + ")"
	case "sqlite":
		return "text"
	default:
		return ""
	}
}

// TableName returns the default table name; Config.Table overrides it in
// AutoMigrate, Handle and Purge.
func (ProcessedMessage) TableName() string { return DefaultTable }

// Config names the processed-messages table, used as it is (GORM's
// NamingStrategy does not apply). A zero Config means DefaultTable.
type Config struct {
	// Schema optionally qualifies the table name.
	Schema string
	// Table is the processed-messages table; empty means DefaultTable.
	Table string
}

// identifier is what a table or schema name may be, as in package outbox.
var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// WithDefaults returns c with every zero field replaced by its default.
func (c Config) WithDefaults() Config {
	c.Table = cmp.Or(c.Table, DefaultTable)
	return c
}

// Validate reports the first invalid field of c (after defaults), naming it.
func (c Config) Validate() error {
	c = c.WithDefaults()
	if c.Schema != "" && !identifier.MatchString(c.Schema) {
		return fmt.Errorf("inbox: Config.Schema %q: must match %s", c.Schema, identifier)
	}
	if !identifier.MatchString(c.Table) {
		return fmt.Errorf("inbox: Config.Table %q: must match %s", c.Table, identifier)
	}
	return nil
}

// TableName returns the schema-qualified table name (after defaults), in
// the form GORM's Table accepts.
func (c Config) TableName() string {
	c = c.WithDefaults()
	if c.Schema == "" {
		return c.Table
	}
	return c.Schema + "." + c.Table
}

// AutoMigrate creates or updates the processed-messages table of cfg with
// GORM's migrator, to the DDL of migrations/inbox/<dialect>.sql
// (migrations.InboxSQL), in the outbox's database or the consumer's own.
func AutoMigrate(db *gorm.DB, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if cfg.Schema != "" && db.Dialector.Name() == "sqlite" { // as outbox.AutoMigrate
		return fmt.Errorf("inbox: AutoMigrate with Config.Schema %q is not supported on SQLite; apply migrations/inbox/sqlite.sql inside the attached database instead", cfg.Schema)
	}
	table := cfg.TableName()
	if err := db.Table(table).AutoMigrate(&ProcessedMessage{}); err != nil {
		return fmt.Errorf("inbox: migrate %s: %w", table, err)
	}
	return nil
}
