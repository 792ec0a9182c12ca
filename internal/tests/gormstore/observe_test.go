package gormstore_test

import (
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"gorm.io/gorm"
)

// The plan tests explain the statements the store runs. From this module
// they cannot ask the store for them: they watch them run instead. GORM
// shows each statement to the *gorm.DB's logger as a function that renders
// it with its values through the dialector (Dialector.Explain), the store's
// own statements included (gormstore's hotpath.go, trace); observe wraps
// the dialector so that every such rendering also records the statement as
// it went to the driver: its text, with its bind variables, and its
// arguments.

// statement is a statement observed: the text sent to the driver and its
// arguments.
type statement struct {
	SQL  string
	Args []any
}

// observed records the statements of a *gorm.DB (see observe).
type observed struct {
	gorm.Dialector
	mu    sync.Mutex
	stmts []statement
}

// observe wraps db's dialector, before the store is made on db, so that
// the statements db runs are recorded. db's logger must render each
// statement it is shown (testenv.SQLRecorder does).
func observe(db *gorm.DB) *observed {
	o := &observed{Dialector: db.Dialector}
	db.Config.Dialector = o
	return o
}

// Explain implements gorm.Dialector: it records the statement.
func (o *observed) Explain(sql string, vars ...any) string {
	o.mu.Lock()
	o.stmts = append(o.stmts, statement{SQL: sql, Args: slices.Clone(vars)})
	o.mu.Unlock()
	return o.Dialector.Explain(sql, vars...)
}

// Translate forwards to the wrapped dialector's error translation.
func (o *observed) Translate(err error) error {
	if tr, ok := o.Dialector.(gorm.ErrorTranslator); ok {
		return tr.Translate(err)
	}
	return err
}

// SavePoint forwards to the wrapped dialector.
func (o *observed) SavePoint(tx *gorm.DB, name string) error {
	return o.Dialector.(gorm.SavePointerDialectorInterface).SavePoint(tx, name)
}

// RollbackTo forwards to the wrapped dialector.
func (o *observed) RollbackTo(tx *gorm.DB, name string) error {
	return o.Dialector.(gorm.SavePointerDialectorInterface).RollbackTo(tx, name)
}

// Reset forgets the recorded statements.
func (o *observed) Reset() {
	o.mu.Lock()
	o.stmts = nil
	o.mu.Unlock()
}

// Statements returns the recorded statements, oldest first.
func (o *observed) Statements() []statement {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.stmts)
}

// find returns the last recorded statement whose text contains want.
func (o *observed) find(want string) (statement, bool) {
	stmts := o.Statements()
	for i := len(stmts) - 1; i >= 0; i-- {
		if strings.Contains(stmts[i].SQL, want) {
			return stmts[i], true
		}
	}
	return statement{}, false
}

// last is find, failing t when no statement contains want.
func (o *observed) last(t *testing.T, what, want string) statement {
	t.Helper()
	st, ok := o.find(want)
	if !ok {
		t.Fatalf("%s: no statement with %q among the %d observed", what, want, len(o.Statements()))
	}
	return st
}

// withoutTimeoutPrefix returns stmt without MariaDB's statement timeout
// prefix (SET STATEMENT … FOR), which EXPLAIN does not take.
func withoutTimeoutPrefix(stmt string) string {
	if _, rest, ok := strings.Cut(stmt, " FOR "); ok && strings.HasPrefix(stmt, "SET STATEMENT") {
		return rest
	}
	return stmt
}

// deleteStatement returns the statement MarkPublished runs by id for ids
// of bucket (buckets true: of bucket and the next, in turn), and
// its arguments, without running it where the rows are: it watches a store
// of the same configuration delete them from a fresh, empty database of
// o's kind, where each statement deletes nothing. A store deletes by id
// the rows it did not read (by location, on PostgreSQL, the rows it read).
func deleteStatement(t *testing.T, o testenv.Opener, cfg outbox.Config, buckets bool, bucket int, ids []int64) statement {
	t.Helper()
	db := o.Open(t, &gorm.Config{Logger: &testenv.SQLRecorder{}})
	if err := outbox.AutoMigrate(db, cfg); err != nil {
		t.Fatal(err)
	}
	obs := observe(db)
	s, err := gormstore.New(db, gormstore.Options{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	msgs := make([]*outbox.Message, len(ids))
	for i, id := range ids {
		msgs[i] = &outbox.Message{ID: id, Bucket: int32(bucket)}
		if buckets && i%2 == 1 {
			msgs[i].Bucket++ // rows of two buckets
		}
	}
	obs.Reset()
	if err := s.MarkPublished(t.Context(), msgs); err != nil {
		t.Fatal(err)
	}
	var dels []statement
	for _, st := range obs.Statements() {
		if strings.HasPrefix(withoutTimeoutPrefix(st.SQL), "DELETE") {
			st.SQL = withoutTimeoutPrefix(st.SQL)
			dels = append(dels, st)
		}
	}
	if len(dels) != 1 {
		t.Fatalf("deleting %d ids ran %d DELETE statements; want 1", len(ids), len(dels))
	}
	return dels[0]
}
