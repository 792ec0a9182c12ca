package outbox_test

// The hardening test that needs no shared test environment (an SQLite file
// of its own); the rest of the hardening tests are in
// internal/tests/outbox/hardening_test.go.

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/gorm-outbox/outbox"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// nonTxPool begins "transactions" that are not gorm.Tx (no Commit), as a
// misbehaving pool wrapper might, and counts their rollbacks.
type nonTxPool struct {
	*sql.DB
	rolledBack int
}

type halfTx struct {
	tx   *sql.Tx
	pool *nonTxPool
}

func (h *halfTx) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	return h.tx.ExecContext(ctx, q, args...)
}
func (h *halfTx) PrepareContext(ctx context.Context, q string) (*sql.Stmt, error) {
	return h.tx.PrepareContext(ctx, q)
}
func (h *halfTx) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	return h.tx.QueryContext(ctx, q, args...)
}
func (h *halfTx) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	return h.tx.QueryRowContext(ctx, q, args...)
}
func (h *halfTx) Rollback() error { h.pool.rolledBack++; return h.tx.Rollback() }

func (p *nonTxPool) BeginTx(ctx context.Context, opts *sql.TxOptions) (gorm.ConnPool, error) {
	tx, err := p.DB.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &halfTx{tx: tx, pool: p}, nil
}

func TestBeginOnAPoolThatReturnsNoTxRollsBackWhatItBegan(t *testing.T) {
	sqlDB, err := sql.Open("sqlite3", "file:"+t.TempDir()+"/x.db")
	if err != nil {
		t.Fatal(err)
	}
	defer sqlDB.Close()
	p := &nonTxPool{DB: sqlDB}
	db, err := gorm.Open(sqlite.Dialector{Conn: p}, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Use(outbox.Plugin{}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := db.Begin().Error; !errors.Is(err, gorm.ErrInvalidTransaction) {
			t.Fatalf("Begin on a pool whose transactions are not gorm.Tx = %v; want ErrInvalidTransaction", err)
		}
	}
	if p.rolledBack != 3 || sqlDB.Stats().InUse != 0 {
		t.Fatalf("after 3 failed Begins: %d rolled back, %d connections in use; want 3 and 0", p.rolledBack, sqlDB.Stats().InUse)
	}
}
