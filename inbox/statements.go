package inbox

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// statements are the inbox's SQL texts, rendered once by the dialector.
type statements struct {
	dialect string
	// insert records (handler_name, message_id, processed_at_ms); a conflict
	// affects no row, or on MySQL/MariaDB fails with a duplicate-key error
	// (ON DUPLICATE KEY UPDATE would count a row "found" under clientFoundRows).
	insert string
	// purge deletes at most one batch of rows with processed_at_ms below ?.
	purge string
}

// buildStatements renders the statements of table (schema-qualified) with
// db's dialector.
func buildStatements(db *gorm.DB, table string, purgeBatch int) (statements, error) {
	name := db.Dialector.Name()
	stmt := &gorm.Statement{DB: db, Clauses: map[string]clause.Clause{}}
	quoted := stmt.Quote(clause.Table{Name: table})
	binds := make([]string, 3)
	for i := range binds {
		var w strings.Builder
		stmt.Vars = make([]any, i+1)
		db.Dialector.BindVarTo(&w, stmt, nil)
		binds[i] = w.String()
	}
	insert := "INSERT INTO " + quoted + " (handler_name, message_id, processed_at_ms) VALUES (" + strings.Join(binds, ", ") + ")"
	limit := strconv.Itoa(purgeBatch)
	switch name {
	case "postgres", "sqlite":
		return statements{dialect: name, insert: insert + " ON CONFLICT DO NOTHING",
			purge: "DELETE FROM " + quoted + " WHERE (handler_name, message_id) IN (SELECT handler_name, message_id FROM " + quoted +
				" WHERE processed_at_ms < ? ORDER BY processed_at_ms LIMIT " + limit + ")"}, nil
	case "mysql":
		return statements{dialect: name, insert: insert,
			purge: "DELETE FROM " + quoted + " WHERE processed_at_ms < ? ORDER BY processed_at_ms LIMIT " + limit}, nil
	}
	return statements{}, fmt.Errorf("inbox: New: dialect %q is not supported (postgres, mysql and sqlite are)", name)
}

// record inserts (handler, id) in tx and reports whether it did: false
// means the id is already recorded for handler (a duplicate).
func (ib *Inbox) record(tx *gorm.DB, handler, id string) (bool, error) {
	args := []any{handler, id, ib.clock.Now().UnixMilli()}
	begin := time.Now()
	res, err := tx.Statement.ConnPool.ExecContext(tx.Statement.Context, ib.sql.insert, args...)
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	ib.trace(tx, begin, ib.sql.insert, args, n, err)
	switch {
	case err == nil:
		return n > 0, nil
	case ib.sql.dialect == "mysql" && ib.duplicateKey(err):
		return false, nil
	default:
		return false, err
	}
}

// duplicateKey reports whether err is MySQL's duplicate-key error (1062),
// translated or not, or worded so by a driver whose type a wrapper hid.
func (ib *Inbox) duplicateKey(err error) bool {
	if errors.Is(err, gorm.ErrDuplicatedKey) {
		return true
	}
	if t, ok := ib.db.Dialector.(gorm.ErrorTranslator); ok && errors.Is(t.Translate(err), gorm.ErrDuplicatedKey) {
		return true
	}
	return strings.HasPrefix(err.Error(), "Error 1062 ")
}

// trace shows a statement the inbox ran outside GORM to q's logger, as
// GORM shows its own.
func (ib *Inbox) trace(q *gorm.DB, begin time.Time, query string, args []any, rows int64, err error) {
	if q.Logger == nil {
		return
	}
	q.Logger.Trace(q.Statement.Context, begin, func() (string, int64) {
		return q.Dialector.Explain(query, args...), rows
	}, err)
}
