package outbox

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// Keys under which the plugin keeps per-statement state in gorm settings.
const (
	configKey   = "outbox:config"
	preparedKey = "outbox:prepared"
)

// ErrInvalidMessage is wrapped by the error Create returns, writing nothing,
// for a message the outbox cannot accept or a value not made of Messages.
var ErrInvalidMessage = errors.New("invalid message")

// topicChars reports whether topic is made only of [A-Za-z0-9._-], the
// characters Kafka allows; a byte loop, as every create checks it.
func topicChars(topic string) bool {
	for i := 0; i < len(topic); i++ {
		switch c := topic[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

var (
	messageType = reflect.TypeOf(Message{})
	leaseType   = reflect.TypeOf(BucketLease{})
	relayType   = reflect.TypeOf(RelayHeartbeat{})
)

func register(db *gorm.DB, p *Plugin, state *notifyState) error {
	if err := installPool(db, state); err != nil {
		return err
	}
	cb := db.Callback()
	steps := []struct {
		name string
		err  error
	}{
		// Before a create's implicit transaction begins: a session derived
		// before db.Use still holds the unwrapped pool, and its transaction
		// must begin on the wrapper to notify after commit.
		{"outbox:use_pool", cb.Create().Before("gorm:begin_transaction").Register("outbox:use_pool", state.usePool)},
		{"outbox:prepare", cb.Create().Before("gorm:before_create").Register("outbox:prepare", p.prepareStatement)},
		{"outbox:insert (gorm:create)", p.wrapCreate(db)},
		// GORM steps that do nothing for a prepared message statement.
		{"gorm:begin_transaction (in a transaction)", skipFor(cb.Create(), "gorm:begin_transaction", inTransaction)},
		{"gorm:before_create (prepared)", skipFor(cb.Create(), "gorm:before_create", prepared)},
		{"gorm:after_create (prepared, written)", skipFor(cb.Create(), "gorm:after_create", preparedAndWritten)},
		// After the INSERT, before gorm commits an implicit transaction.
		{"outbox:collect_buckets", cb.Create().After("gorm:create").Before("gorm:commit_or_rollback_transaction").Register("outbox:collect_buckets", p.collectBuckets)},
		{"outbox:route_table (query)", cb.Query().Before("gorm:query").Register("outbox:route_table", p.routeTable)},
		{"outbox:route_table (row)", cb.Row().Before("gorm:row").Register("outbox:route_table", p.routeTable)},
		{"outbox:route_table (update)", cb.Update().Before("gorm:before_update").Register("outbox:route_table", p.routeTable)},
		{"outbox:route_table (delete)", cb.Delete().Before("gorm:before_delete").Register("outbox:route_table", p.routeTable)},
		{"outbox:track_savepoints", cb.Raw().After("gorm:raw").Register("outbox:track_savepoints", trackSavepoints)},
	}
	for _, s := range steps {
		if s.err != nil {
			return fmt.Errorf("outbox: register %s: %w", s.name, s.err)
		}
	}
	return nil
}

// configFrom returns the effective configuration of a statement: a
// WithConfig scope, else the registered Plugin's, else the defaults.
func configFrom(db *gorm.DB) (Config, error) {
	if sc, ok := scopeOf(db); ok {
		if err := sc.cfg.validate(); err != nil {
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

// isMessageStatement reports whether the statement's model is Message.
func isMessageStatement(db *gorm.DB) bool {
	return db.Statement.Schema != nil && db.Statement.Schema.ModelType == messageType
}

// route sets the statement's table to cfg's name for its outbox model
// (Message, Lease or Relay) unless the caller chose a table (db.Table).
func route(stmt *gorm.Statement, cfg Config) {
	if stmt.Schema == nil || stmt.TableExpr != nil {
		return
	}
	var def, name string
	switch stmt.Schema.ModelType {
	case messageType:
		def, name = DefaultMessagesTable, cfg.MessagesTableName()
	case leaseType:
		def, name = DefaultLeasesTable, cfg.LeasesTableName()
	case relayType:
		def, name = DefaultRelaysTable, cfg.RelaysTableName()
	default:
		return
	}
	if stmt.Table == "" || stmt.Table == def {
		stmt.Table = name
	}
}

// config returns the configuration of a statement: a WithConfig scope's,
// else the plugin's. An invalid scope is added to the statement's errors.
func (p *Plugin) config(db *gorm.DB) (Config, bool) {
	if _, scoped := scopeOf(db); !scoped {
		return p.Config, true
	}
	cfg, err := configFrom(db)
	if err != nil {
		db.AddError(outboxError{err})
		return Config{}, false
	}
	return cfg, true
}

// routeTable sends queries, updates and deletes of the outbox models to the
// configured tables, as prepareStatement does for creates.
func (p *Plugin) routeTable(db *gorm.DB) {
	if db.Error != nil || db.Statement.Schema == nil {
		return
	}
	switch db.Statement.Schema.ModelType {
	case messageType, leaseType, relayType:
		if cfg, ok := p.config(db); ok {
			route(db.Statement, cfg)
		}
	}
}

// prepareStatement fills, validates and routes the outbox messages of a
// create statement. Other models pass through untouched.
func (p *Plugin) prepareStatement(db *gorm.DB) {
	if db.Error != nil || !isMessageStatement(db) {
		return
	}
	cfg, ok := p.config(db)
	if !ok {
		return
	}
	route(db.Statement, cfg)
	// An upsert (OnConflict, or Save's fallback) of a row that has an id
	// writes that row again: it keeps its id and message id.
	_, upsert := db.Statement.Clauses["ON CONFLICT"]
	tr := newTraceInjector(db.Statement.Context, p.Propagator)
	if err := prepareAll(db.Statement.Context, db.Statement.ReflectValue, cfg, time.Now(), upsert, tr); err != nil {
		db.AddError(outboxError{err})
		return
	}
	db.Statement.Settings.Store(preparedKey, true)
}

// prepareAll prepares every message of a create statement's value and
// injects ctx's trace context into each one not upserted.
func prepareAll(ctx context.Context, rv reflect.Value, cfg Config, now time.Time, upsert bool, tr traceInjector) error {
	var seen map[UUID]int
	if rv.Kind() == reflect.Slice || rv.Kind() == reflect.Array {
		seen = make(map[UUID]int, rv.Len())
	}
	return eachMessage(rv, func(i int, m *Message) error {
		again := upsert && m.ID != 0
		if err := cfg.prepare(m, now, again); err != nil {
			if i >= 0 {
				return fmt.Errorf("message %d: %w", i, err)
			}
			return err
		}
		if !again {
			tr.inject(ctx, m)
		}
		if seen != nil {
			if j, dup := seen[m.MessageID]; dup {
				return fmt.Errorf("message %d: %w: message id %s is also message %d's (the same *Message twice, or a MessageID set twice)", i, ErrInvalidMessage, m.MessageID, j)
			}
			seen[m.MessageID] = i
		}
		return nil
	})
}

// eachMessage calls fn with every *Message of a create statement's value and
// its index (-1 for a single struct); any other shape is ErrInvalidMessage.
func eachMessage(rv reflect.Value, fn func(int, *Message) error) error {
	if rv.Kind() == reflect.Struct && rv.Type() == messageType && rv.CanAddr() {
		return fn(-1, rv.Addr().Interface().(*Message)) // the common tx.Create(&msg)
	}
	for rv.Kind() == reflect.Pointer || rv.Kind() == reflect.Interface {
		if rv.IsNil() {
			return fmt.Errorf("%w: nil value", ErrInvalidMessage)
		}
		rv = rv.Elem()
	}
	switch rv.Kind() {
	case reflect.Struct:
		m, err := messageAt(rv, -1)
		if err != nil {
			return err
		}
		return fn(-1, m)
	case reflect.Slice, reflect.Array:
		if et := rv.Type().Elem(); et != messageType && (et.Kind() != reflect.Pointer || et.Elem() != messageType) {
			// GORM itself cannot insert a []any: say so before it panics.
			return fmt.Errorf("%w: create a []outbox.Message or []*outbox.Message, not a %s", ErrInvalidMessage, rv.Type())
		}
		for i := 0; i < rv.Len(); i++ {
			m, err := messageAt(rv.Index(i), i)
			if err != nil {
				return err
			}
			if err := fn(i, m); err != nil {
				return err
			}
		}
		return nil
	default:
		return fmt.Errorf("%w: create messages from outbox.Message structs, not a %s", ErrInvalidMessage, rv.Type())
	}
}

// messageAt returns the *Message that e (an element at index i, -1 for a
// single value) is or points to.
func messageAt(e reflect.Value, i int) (*Message, error) {
	what := "the value"
	if i >= 0 {
		what = fmt.Sprintf("message %d", i)
	}
	if e.Kind() == reflect.Pointer {
		if e.IsNil() {
			return nil, fmt.Errorf("%w: %s is nil", ErrInvalidMessage, what)
		}
		e = e.Elem()
	}
	if e.Type() != messageType {
		return nil, fmt.Errorf("%w: %s is a %s, not an outbox.Message", ErrInvalidMessage, what, e.Type())
	}
	if !e.CanAddr() {
		return nil, fmt.Errorf("%w: create messages through a pointer (&msg or &msgs)", ErrInvalidMessage)
	}
	return e.Addr().Interface().(*Message), nil
}

// outboxError is an error of the plugin's callbacks: it reads as its cause
// with the package prefix, which Enqueue replaces with its own context.
type outboxError struct{ err error }

func (e outboxError) Error() string { return "outbox: " + e.err.Error() }
func (e outboxError) Unwrap() error { return e.err }

// ValidateTopic reports whether topic is a legal Kafka topic name; its error
// wraps ErrInvalidMessage.
func ValidateTopic(topic string) error {
	if err := validateTopic(topic); err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	return nil
}

// validateTopic is ValidateTopic without the package prefix.
func validateTopic(topic string) error {
	switch {
	case topic == "":
		return fmt.Errorf("%w: topic is empty", ErrInvalidMessage)
	case len(topic) > MaxTopicLength:
		return fmt.Errorf("%w: topic is %d characters long; the limit is %d", ErrInvalidMessage, len(topic), MaxTopicLength)
	case topic == "." || topic == "..":
		return fmt.Errorf("%w: topic %q is not allowed", ErrInvalidMessage, topic)
	case !topicChars(topic):
		return fmt.Errorf("%w: topic %q has characters outside [A-Za-z0-9._-]", ErrInvalidMessage, topic)
	}
	return nil
}

// prepare validates m and fills its generated fields (c has its defaults).
// ID is cleared, so that the database assigns it in commit order, unless
// again (an upsert of an existing row) keeps ID and MessageID.
func (c Config) prepare(m *Message, now time.Time, again bool) error {
	if err := validateTopic(m.Topic); err != nil {
		return err
	}
	if m.Partition != nil && *m.Partition < 0 {
		return fmt.Errorf("%w: partition %d is negative", ErrInvalidMessage, *m.Partition)
	}
	k := int(max(m.kept, 0)) // this create's position in the struct's run
	id := m.MessageID
	if id.IsZero() || (id == m.generated && !again) {
		if id = m.idAt(k); id.IsZero() {
			id = NewUUID()
		}
	}
	b := BucketOf(m.Key, m.Partition, id, c.BucketCount)
	ours := m.kept != 0 || !m.generated.IsZero() // a reused struct's bucket is ours
	if m.Bucket != 0 && m.Bucket != b && !ours {
		return fmt.Errorf("%w: bucket %d set by the caller disagrees with bucket %d for BucketCount %d", ErrInvalidMessage, m.Bucket, b, c.BucketCount)
	}
	m.setAt(k, id)
	m.kept = int32(k)
	if id != m.MessageID {
		m.MessageID, m.generated = id, id
	}
	if m.CreatedAt.IsZero() {
		m.CreatedAt = now
	}
	m.CreatedAt = m.CreatedAt.UTC()
	m.Bucket = b
	if !again {
		m.ID = 0
	}
	return nil
}

// wrapCreate puts the plugin's INSERT of outbox messages in place of
// gorm:create for the statements insertable accepts.
func (p *Plugin) wrapCreate(db *gorm.DB) error {
	cp := db.Callback().Create()
	orig := cp.Get("gorm:create")
	if orig == nil {
		return nil // removed by someone else: nothing to stand in for
	}
	ins := inserter{
		returning: slices.Contains(cp.Clauses, "RETURNING"),
		lastID:    db.Dialector.Name() == "sqlite" || db.Dialector.Name() == "mysql",
		skipIDs:   p.SkipIDReadBack,
		sql:       new(sync.Map),
	}
	switch db.Dialector.Name() {
	case "sqlite", "mysql", "postgres":
	default:
		return nil // untested dialects keep GORM's create
	}
	return cp.Replace("gorm:create", func(db *gorm.DB) {
		if msgs, ok := ins.insertable(db); ok {
			ins.insert(db, msgs)
			return
		}
		orig(db)
	})
}

// inserter writes prepared outbox messages with one INSERT built from the
// struct fields, without GORM's per-field reflection, and fills Message.ID
// as GORM does (LastInsertId or RETURNING "id").
type inserter struct {
	returning bool      // the dialector supports RETURNING
	lastID    bool      // LastInsertId is the id of a one-row INSERT
	skipIDs   bool      // Plugin.SkipIDReadBack: ids are not read back
	sql       *sync.Map // sqlKey → the one-row INSERT's text
}

// sqlKey names a cached one-row INSERT.
type sqlKey struct {
	dialect, table string
	returning      bool
}

// createColumns are the columns GORM's Create writes for a Message with a
// zero ID: all but id and the relay-only parked_at_ms and parked_reason.
var createColumns = []clause.Column{
	{Name: "message_id"}, {Name: "bucket"}, {Name: "topic"}, {Name: "record_key"},
	{Name: "record_value"}, {Name: "headers"}, {Name: "record_partition"}, {Name: "created_at"},
}

var returningID = clause.Returning{Columns: []clause.Column{{Name: "id"}}}

// insertable returns the messages of a plain create statement the inserter
// can write: prepared, no clause, Select, Omit, dry run nor upsert.
func (ins inserter) insertable(db *gorm.DB) ([]*Message, bool) {
	stmt := db.Statement
	if db.Error != nil || db.DryRun || !isMessageStatement(db) || stmt.SQL.Len() != 0 ||
		len(stmt.Clauses) != 0 || len(stmt.Vars) != 0 || len(stmt.Selects) != 0 || len(stmt.Omits) != 0 ||
		len(stmt.Schema.CreateClauses) != 0 {
		return nil, false
	}
	if _, prepared := stmt.Settings.Load(preparedKey); !prepared {
		return nil, false
	}
	var msgs []*Message
	switch v := stmt.Dest.(type) {
	case *Message:
		msgs = []*Message{v} // nil: refused below
	case *[]*Message:
		if v != nil {
			msgs = *v
		}
	case []*Message:
		msgs = v
	case *[]Message:
		if v != nil {
			msgs = addrs(*v)
		}
	case []Message:
		msgs = addrs(v)
	}
	if len(msgs) == 0 {
		return nil, false
	}
	for _, m := range msgs {
		if m == nil || m.ID != 0 {
			return nil, false
		}
	}
	if !ins.skipIDs && !ins.returning && (len(msgs) > 1 || !ins.lastID) {
		return nil, false // GORM's LastInsertId arithmetic
	}
	return msgs, true
}

func addrs(v []Message) []*Message {
	out := make([]*Message, len(v))
	for i := range v {
		out[i] = &v[i]
	}
	return out
}

// insert writes msgs (see insertable) and fills their IDs.
func (ins inserter) insert(db *gorm.DB, msgs []*Message) {
	stmt := db.Statement
	values := clause.Values{Columns: createColumns, Values: make([][]any, len(msgs))}
	for i, m := range msgs {
		values.Values[i] = []any{m.MessageID, m.Bucket, m.Topic, m.Key, m.Value, m.Headers, m.Partition, m.CreatedAt}
	}
	returning := !ins.skipIDs && (len(msgs) > 1 || !ins.lastID)
	useLastID := !ins.skipIDs && !returning
	// A one-row INSERT's text depends only on the dialect, the table and
	// RETURNING: built by GORM once, then reused.
	var key sqlKey
	cacheable := len(msgs) == 1 && stmt.TableExpr == nil && len(stmt.Vars) == 0
	if cacheable {
		key = sqlKey{dialect: db.Dialector.Name(), table: stmt.Table, returning: returning}
		if q, ok := ins.sql.Load(key); ok {
			stmt.SQL.WriteString(q.(string))
			stmt.Vars = values.Values[0]
			cacheable = false
		}
	}
	if stmt.SQL.Len() == 0 {
		stmt.SQL.Grow(180)
		stmt.AddClause(clause.Insert{})
		stmt.AddClause(values)
		if returning {
			stmt.AddClause(returningID)
		}
		stmt.Build(stmt.BuildClauses...)
		if cacheable && db.Error == nil && len(stmt.Vars) == len(createColumns) {
			ins.sql.Store(key, stmt.SQL.String())
		}
	}

	if !returning {
		res, err := stmt.ConnPool.ExecContext(stmt.Context, stmt.SQL.String(), stmt.Vars...)
		if db.AddError(err) != nil {
			return
		}
		db.RowsAffected, _ = res.RowsAffected()
		if stmt.Result != nil {
			stmt.Result.Result = res
			stmt.Result.RowsAffected = db.RowsAffected
		}
		if db.RowsAffected == 0 || !useLastID {
			return
		}
		id, err := res.LastInsertId()
		if err != nil {
			db.AddError(fmt.Errorf("outbox: read the inserted message's id: %w", err))
			return
		}
		msgs[0].ID = id
		return
	}
	rows, err := stmt.ConnPool.QueryContext(stmt.Context, stmt.SQL.String(), stmt.Vars...)
	if db.AddError(err) != nil {
		return
	}
	var n int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			db.AddError(err)
			break
		}
		if n < int64(len(msgs)) {
			msgs[n].ID = id
		}
		n++
	}
	db.AddError(rows.Err())
	db.AddError(rows.Close())
	db.RowsAffected = n
	if stmt.Result != nil {
		stmt.Result.RowsAffected = n
	}
}

// skipFor makes the GORM create step name skip the statements skip reports.
func skipFor(cp interface {
	Get(string) func(*gorm.DB)
	Replace(string, func(*gorm.DB)) error
}, name string, skip func(*gorm.DB) bool) error {
	orig := cp.Get(name)
	if orig == nil {
		return nil
	}
	return cp.Replace(name, func(db *gorm.DB) {
		if !skip(db) {
			orig(db)
		}
	})
}

// inTransaction: a message statement already in a transaction, where
// gorm:begin_transaction's Begin fails, ignored.
func inTransaction(db *gorm.DB) bool {
	if db.Error != nil || !isMessageStatement(db) {
		return false
	}
	switch db.Statement.ConnPool.(type) {
	case gorm.TxBeginner, gorm.ConnPoolBeginner:
		return false
	case gorm.Tx:
		return true
	}
	return false
}

// prepared: a message statement the plugin prepared, whose BeforeCreate
// hook returns at once.
func prepared(db *gorm.DB) bool {
	if db.Error != nil || !isMessageStatement(db) {
		return false
	}
	_, ok := db.Statement.Settings.Load(preparedKey)
	return ok
}

// preparedAndWritten: a prepared message statement that wrote rows, which
// collectBuckets has marked written as the AfterCreate hook would.
func preparedAndWritten(db *gorm.DB) bool {
	return db.RowsAffected > 0 && prepared(db)
}
