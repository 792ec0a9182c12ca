package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"gorm.io/gorm"
)

// notifyState is what a registered Plugin shares with its pool wrapper and
// callbacks.
type notifyState struct {
	notifier Notifier
	inline   bool // the notifier promises not to block
	logger   *slog.Logger
}

// NonBlocking is implemented by notifiers that never block (the relay's
// does). The Plugin calls those on the committing goroutine; any other
// Notifier is called on a goroutine of its own, so that a slow notifier can
// never delay a commit.
type NonBlocking interface {
	NonBlockingNotifier()
}

// notify tells the notifier about committed buckets; it never panics and,
// for notifiers not known to be non-blocking, never waits for them.
func (s *notifyState) notify(buckets []int) {
	if s.notifier == nil || len(buckets) == 0 {
		return
	}
	if s.inline {
		s.call(buckets)
		return
	}
	go s.call(slices.Clone(buckets))
}

func (s *notifyState) call(buckets []int) {
	defer func() {
		if r := recover(); r != nil {
			s.logger.Error("outbox: notifier panicked", "panic", fmt.Sprint(r), "buckets", buckets)
		}
	}()
	bn, ok := s.notifier.(BucketNotifier)
	switch {
	case !ok:
		s.notifier.NotifyCommitted()
	case len(buckets) == 1:
		bn.NotifyBucket(buckets[0])
	default:
		bn.NotifyBuckets(buckets)
	}
}

// pool wraps the connection pool beneath gorm (and beneath its
// PreparedStmtDB) so that every transaction gorm begins is a notifyingTx.
type pool struct {
	gorm.ConnPool
	state *notifyState
}

var (
	_ gorm.ConnPoolBeginner = (*pool)(nil)
	_ gorm.GetDBConnector   = (*pool)(nil)
	_ gorm.Tx               = (*notifyingTx)(nil)
	_ gorm.GetDBConnector   = (*notifyingTx)(nil)
)

// BeginTx begins a transaction on the wrapped pool. It returns
// gorm.ErrInvalidTransaction when that pool cannot begin one.
func (p *pool) BeginTx(ctx context.Context, opts *sql.TxOptions) (gorm.ConnPool, error) {
	var inner gorm.Tx
	switch b := p.ConnPool.(type) {
	case gorm.TxBeginner:
		tx, err := b.BeginTx(ctx, opts)
		if err != nil {
			return nil, err
		}
		inner = tx
	case gorm.ConnPoolBeginner:
		cp, err := b.BeginTx(ctx, opts)
		if err != nil {
			return nil, err
		}
		tx, ok := cp.(gorm.Tx)
		if !ok {
			return nil, gorm.ErrInvalidTransaction
		}
		inner = tx
	default:
		return nil, gorm.ErrInvalidTransaction
	}
	return &notifyingTx{Tx: inner, pool: p}, nil
}

// GetDBConn returns the *sql.DB beneath, so that db.DB() keeps working.
func (p *pool) GetDBConn() (*sql.DB, error) { return getDBConn(p.ConnPool) }

// Ping pings the wrapped pool when it can.
func (p *pool) Ping() error {
	if pinger, ok := p.ConnPool.(interface{ Ping() error }); ok {
		return pinger.Ping()
	}
	return nil
}

func getDBConn(cp gorm.ConnPool) (*sql.DB, error) {
	switch c := cp.(type) {
	case *sql.DB:
		return c, nil
	case gorm.GetDBConnector:
		return c.GetDBConn()
	}
	return nil, gorm.ErrInvalidDB
}

// notifyingTx is a transaction whose successful Commit reports the buckets
// of the outbox rows written in it. Rollback forgets them; a rolled-back
// savepoint forgets those written since it.
type notifyingTx struct {
	gorm.Tx
	pool *pool

	mu      sync.Mutex
	written []written      // in write order, repeats allowed
	marks   map[string]int // savepoint name → len(written) when it was set
}

// written is a bucket written in a transaction and whom to tell after commit.
type written struct {
	to     *notifyState
	bucket int
}

// Commit commits and, only if that succeeded, notifies.
func (t *notifyingTx) Commit() error {
	err := t.Tx.Commit()
	t.mu.Lock()
	w := t.written
	t.written, t.marks = nil, nil
	t.mu.Unlock()
	if err != nil || len(w) == 0 {
		return err
	}
	// Usually one notifier; a WithOutbox scope adds another.
	for len(w) > 0 {
		to := w[0].to
		var buckets, rest = []int{}, w[:0:0]
		for _, x := range w {
			if x.to == to {
				buckets = append(buckets, x.bucket)
			} else {
				rest = append(rest, x)
			}
		}
		to.notify(distinct(buckets))
		w = rest
	}
	return nil
}

// Rollback rolls back and forgets the collected buckets.
func (t *notifyingTx) Rollback() error {
	t.mu.Lock()
	t.written, t.marks = nil, nil
	t.mu.Unlock()
	return t.Tx.Rollback()
}

// GetDBConn returns the pool's *sql.DB.
func (t *notifyingTx) GetDBConn() (*sql.DB, error) { return t.pool.GetDBConn() }

func (t *notifyingTx) add(to *notifyState, buckets []int) {
	t.mu.Lock()
	for _, b := range buckets {
		t.written = append(t.written, written{to, b})
	}
	t.mu.Unlock()
}

func (t *notifyingTx) savepoint(name string) {
	t.mu.Lock()
	if t.marks == nil {
		t.marks = map[string]int{}
	}
	t.marks[name] = len(t.written)
	t.mu.Unlock()
}

func (t *notifyingTx) rollbackTo(name string) {
	t.mu.Lock()
	if n, ok := t.marks[name]; ok && n <= len(t.written) {
		t.written = t.written[:n]
	}
	t.mu.Unlock()
}

func distinct(b []int) []int {
	if len(b) == 0 {
		return nil
	}
	out := slices.Clone(b)
	slices.Sort(out)
	return slices.Compact(out)
}

// installPool puts the wrapper beneath gorm's PreparedStmtDB (or directly
// under gorm when prepared statements are off).
func installPool(db *gorm.DB, state *notifyState) error {
	wrap := func(cp gorm.ConnPool) (gorm.ConnPool, error) {
		if _, ok := cp.(*pool); ok {
			return nil, fmt.Errorf("outbox: connection pool already wrapped")
		}
		switch cp.(type) {
		case gorm.TxBeginner, gorm.ConnPoolBeginner:
		default:
			return nil, fmt.Errorf("outbox: connection pool %T cannot begin transactions; register the plugin on a *gorm.DB opened on a pool, not inside a transaction", cp)
		}
		return &pool{ConnPool: cp, state: state}, nil
	}
	if ps, ok := db.Config.ConnPool.(*gorm.PreparedStmtDB); ok {
		w, err := wrap(ps.ConnPool)
		if err != nil {
			return err
		}
		ps.ConnPool = w
		return nil
	}
	w, err := wrap(db.Config.ConnPool)
	if err != nil {
		return err
	}
	db.Config.ConnPool = w
	if db.Statement != nil {
		db.Statement.ConnPool = w
	}
	return nil
}

// connTarget finds what a statement runs on: an outbox transaction, the
// outbox pool (autocommit), or something else.
func connTarget(cp gorm.ConnPool) (tx *notifyingTx, autocommit *pool) {
	for i := 0; i < 8 && cp != nil; i++ {
		switch c := cp.(type) {
		case *notifyingTx:
			return c, nil
		case *pool:
			return nil, c
		case *gorm.PreparedStmtTX:
			cp = c.Tx
		case *gorm.PreparedStmtDB:
			cp = c.ConnPool
		default:
			return nil, nil
		}
	}
	return nil, nil
}

// collectBuckets runs after gorm:create: it records the buckets of the
// outbox rows just inserted on the transaction, or notifies at once when the
// statement ran in autocommit mode (SkipDefaultTransaction).
func (p *Plugin) collectBuckets(db *gorm.DB) {
	if db.Error != nil || db.RowsAffected == 0 || !isMessageStatement(db) {
		return
	}
	tx, auto := connTarget(db.Statement.ConnPool)
	if tx == nil && auto == nil {
		return // not ours (another plugin's pool): polling covers it
	}
	var to *notifyState
	if sc, ok := scopeOf(db); ok {
		to = sc.notify // a WithConfig scope without a notifier: nobody
	} else if tx != nil {
		to = tx.pool.state
	} else {
		to = auto.state
	}
	if to == nil || to.notifier == nil {
		return
	}
	var buckets []int
	_ = eachMessage(db.Statement.ReflectValue, func(_ int, m *Message) error {
		buckets = append(buckets, int(m.Bucket))
		return nil
	})
	if tx != nil {
		tx.add(to, buckets)
		return
	}
	to.notify(distinct(buckets))
}

// trackSavepoints runs after gorm:raw: it follows SAVEPOINT and ROLLBACK TO
// SAVEPOINT so that rows of a rolled-back nested transaction are forgotten.
func trackSavepoints(db *gorm.DB) {
	if db.Error != nil {
		return
	}
	sql := strings.TrimSpace(db.Statement.SQL.String())
	var name string
	rollback := false
	switch {
	case strings.HasPrefix(sql, "ROLLBACK TO SAVEPOINT "):
		name, rollback = strings.TrimPrefix(sql, "ROLLBACK TO SAVEPOINT "), true
	case strings.HasPrefix(sql, "SAVEPOINT "):
		name = strings.TrimPrefix(sql, "SAVEPOINT ")
	default:
		return
	}
	tx, _ := connTarget(db.Statement.ConnPool)
	if tx == nil {
		return
	}
	if rollback {
		tx.rollbackTo(name)
	} else {
		tx.savepoint(name)
	}
}
