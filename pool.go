package outbox

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"

	"gorm.io/gorm"
)

// notifyState is what a registered Plugin shares with its pool wrapper and
// callbacks.
type notifyState struct {
	notifier CommitNotifier
	inline   bool // the notifier promises not to block
	logger   *slog.Logger

	// wrappers maps a pool (the one the Plugin wrapped, a resolver's) to
	// its wrapper.
	wrappers     sync.Map
	unnotifiable atomic.Bool // cannotNotify has logged
}

func newNotifyState(n CommitNotifier, logger *slog.Logger) *notifyState {
	_, inline := n.(NonBlocking)
	return &notifyState{notifier: n, inline: inline, logger: cmp.Or(logger, slog.Default())}
}

// NonBlocking is implemented by notifiers that never block (the relay's),
// which the Plugin calls on the committing goroutine; any other Notifier
// gets a goroutine of its own, so that it can never delay a commit.
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
			s.logger.Error("commit notifier panicked", "panic", fmt.Sprint(r), "buckets", buckets)
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

// cannotNotify logs, once, that outbox rows were written in a transaction
// the plugin cannot follow to its commit.
func (s *notifyState) cannotNotify(cp gorm.ConnPool) {
	if s.notifier == nil || !s.unnotifiable.CompareAndSwap(false, true) {
		return
	}
	s.logger.Warn("outbox rows were written in a transaction the plugin cannot follow to its commit, so their relay is not woken and finds them by polling; "+
		"begin transactions on a *gorm.DB (or a session) derived after db.Use(outbox.Plugin{...}), not on one derived before it, nor on a pool another plugin opened",
		"conn_pool", fmt.Sprintf("%T", cp))
}

// usePool runs before gorm begins a create's implicit transaction. A session
// derived before db.Use, or a resolver (dbresolver with Sources), would
// begin it on a pool the plugin cannot follow: the statement is moved to a
// wrapper of that same pool.
func (s *notifyState) usePool(db *gorm.DB) {
	if db.Error != nil || !isMessageStatement(db) {
		return
	}
	if w := s.wrapperOf(db.Statement.ConnPool); w != nil {
		db.Statement.ConnPool = w
	}
}

// wrapperOf returns the wrapper of a pool that is neither a transaction nor
// already wrapped, or nil.
func (s *notifyState) wrapperOf(cp gorm.ConnPool) *pool {
	switch cp.(type) {
	case nil, gorm.Tx:
		return nil // in a transaction already: it began elsewhere
	case gorm.TxBeginner, gorm.ConnPoolBeginner:
	default:
		return nil
	}
	if tx, auto := connTarget(cp); tx != nil || auto != nil {
		return nil // ours, perhaps beneath a PreparedStmtDB
	}
	if reflect.TypeOf(cp).Kind() != reflect.Pointer {
		return nil // not usable as a map key; never seen in practice
	}
	if w, ok := s.wrappers.Load(cp); ok {
		return w.(*pool)
	}
	w, _ := s.wrappers.LoadOrStore(cp, &pool{ConnPool: cp, state: s})
	return w.(*pool)
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
			// Roll back what was begun, or its connection stays taken.
			if rb, ok := cp.(interface{ Rollback() error }); ok {
				_ = rb.Rollback()
			}
			return nil, fmt.Errorf("outbox: the wrapped pool began a %T, which is not a gorm.Tx: %w", cp, gorm.ErrInvalidTransaction)
		}
		inner = tx
	default:
		return nil, gorm.ErrInvalidTransaction
	}
	return &notifyingTx{Tx: inner, pool: p}, nil
}

// GetDBConn returns the *sql.DB beneath, so that db.DB() keeps working.
func (p *pool) GetDBConn() (*sql.DB, error) {
	switch c := p.ConnPool.(type) {
	case *sql.DB:
		return c, nil
	case gorm.GetDBConnector:
		return c.GetDBConn()
	}
	return nil, gorm.ErrInvalidDB
}

// Ping pings the wrapped pool when it can.
func (p *pool) Ping() error {
	if pinger, ok := p.ConnPool.(interface{ Ping() error }); ok {
		return pinger.Ping()
	}
	return nil
}

// notifyingTx is a transaction whose successful Commit reports the buckets
// of the outbox rows written in it. Rollback, a failed Commit and a
// rolled-back savepoint take back the creates since (see Message.generated).
type notifyingTx struct {
	gorm.Tx
	pool *pool

	mu      sync.Mutex
	written []written   // in write order
	marks   []savepoint // open savepoints, oldest first
}

// written is one outbox row written in a transaction and whom to tell after
// commit (nil: nobody).
type written struct {
	to     *notifyState
	bucket int
	msg    *Message
}

// savepoint is an open savepoint: its name (normalised) and len(written)
// when it was set.
type savepoint struct {
	name string
	at   int
}

// Commit commits and, only if that succeeded, notifies.
func (t *notifyingTx) Commit() error {
	err := t.Tx.Commit()
	w := t.end(err != nil)
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
		if to != nil {
			to.notify(distinct(buckets))
		}
		w = rest
	}
	return nil
}

// Rollback rolls back and forgets the written rows.
func (t *notifyingTx) Rollback() error {
	t.end(true)
	return t.Tx.Rollback()
}

// end takes the written rows: their messages' creates are taken back
// when the transaction did not commit, settled when it did.
func (t *notifyingTx) end(undone bool) []written {
	t.mu.Lock()
	w := t.written
	t.written, t.marks = nil, nil
	t.mu.Unlock()
	if undone {
		unwrite(w)
	} else {
		for _, x := range w {
			x.msg.settle()
		}
	}
	return w
}

// unwrite takes back the creates of w, rolled back.
func unwrite(w []written) {
	for _, x := range w {
		if x.msg.kept > 0 {
			x.msg.kept--
		}
	}
}

// GetDBConn returns the pool's *sql.DB.
func (t *notifyingTx) GetDBConn() (*sql.DB, error) { return t.pool.GetDBConn() }

func (t *notifyingTx) add(w []written) {
	t.mu.Lock()
	t.written = append(t.written, w...)
	t.mu.Unlock()
}

// setSavepoint opens a savepoint; a name in use is set again, as ROLLBACK TO
// reaches the newest on every database.
func (t *notifyingTx) setSavepoint(name string) {
	t.mu.Lock()
	t.marks = append(t.marks, savepoint{name, len(t.written)})
	t.mu.Unlock()
}

// find returns the index of the newest open savepoint called name, or -1.
func (t *notifyingTx) find(name string) int {
	for i := len(t.marks) - 1; i >= 0; i-- {
		if t.marks[i].name == name {
			return i
		}
	}
	return -1
}

// rollbackTo undoes the rows written since the savepoint; the savepoint
// stays open and the ones set after it are gone.
func (t *notifyingTx) rollbackTo(name string) {
	t.mu.Lock()
	var undone []written
	if i := t.find(name); i >= 0 {
		at := t.marks[i].at
		undone = slices.Clone(t.written[at:])
		t.written = t.written[:at]
		t.marks = t.marks[:i+1]
	}
	t.mu.Unlock()
	unwrite(undone)
}

// release closes the savepoint and those set after it; their rows stay.
func (t *notifyingTx) release(name string) {
	t.mu.Lock()
	if i := t.find(name); i >= 0 {
		t.marks = t.marks[:i]
	}
	t.mu.Unlock()
}

func distinct(b []int) []int {
	out := slices.Clone(b)
	slices.Sort(out)
	return slices.Compact(out)
}

// installPool puts the wrapper beneath gorm's PreparedStmtDB (or directly
// under gorm when prepared statements are off).
func installPool(db *gorm.DB, state *notifyState) error {
	target := &db.Config.ConnPool
	ps, prepared := db.Config.ConnPool.(*gorm.PreparedStmtDB)
	if prepared {
		target = &ps.ConnPool
	}
	cp := *target
	switch cp.(type) {
	case *pool:
		return fmt.Errorf("outbox: Plugin already registered on this *gorm.DB: its connection pool is the plugin's already (a second registration, or a *gorm.DB opened on the pool of one with the plugin): %w", gorm.ErrRegistered)
	case gorm.TxBeginner, gorm.ConnPoolBeginner:
	default:
		return fmt.Errorf("outbox: connection pool %T cannot begin transactions; register the plugin on a *gorm.DB opened on a pool, not inside a transaction", cp)
	}
	w := &pool{ConnPool: cp, state: state}
	if reflect.TypeOf(cp).Kind() == reflect.Pointer {
		state.wrappers.Store(cp, w)
	}
	*target = w
	if !prepared && db.Statement != nil {
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

// collectBuckets runs after gorm:create, before an implicit commit: it
// records the written buckets on the transaction, or notifies at once in
// autocommit mode.
func (p *Plugin) collectBuckets(db *gorm.DB) {
	if db.Error != nil || db.RowsAffected == 0 || !isMessageStatement(db) {
		return
	}
	tx, auto := connTarget(db.Statement.ConnPool)
	to := p.state
	if sc, ok := scopeOf(db); ok {
		to = sc.notify // nil for a WithConfig scope: nobody
	}
	var w []written
	_ = eachMessage(db.Statement.ReflectValue, func(_ int, m *Message) error {
		if tx != nil {
			m.kept = max(m.kept, 0) + 1 // until the transaction ends
		} else {
			m.settle() // autocommit, or a transaction the plugin cannot follow
		}
		w = append(w, written{to: to, bucket: int(m.Bucket), msg: m})
		return nil
	})
	switch {
	case tx != nil:
		tx.add(w)
	case to == nil || to.notifier == nil:
	case auto != nil:
		buckets := make([]int, len(w))
		for i, x := range w {
			buckets[i] = x.bucket
		}
		to.notify(distinct(buckets))
	default:
		to.cannotNotify(db.Statement.ConnPool)
	}
}

// trackSavepoints runs after gorm:raw: it follows the savepoint statements
// of GORM or the caller so that rows of a rolled-back savepoint are forgotten.
func trackSavepoints(db *gorm.DB) {
	if db.Error != nil {
		return
	}
	op, name, ok := parseSavepoint(db.Statement.SQL.String(), db.Dialector.Name() == "postgres")
	if !ok {
		return
	}
	tx, _ := connTarget(db.Statement.ConnPool)
	if tx == nil {
		return
	}
	switch op {
	case opSavepoint:
		tx.setSavepoint(name)
	case opRollbackTo:
		tx.rollbackTo(name)
	case opRelease:
		tx.release(name)
	}
}
