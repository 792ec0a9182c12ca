package testenv

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm/logger"
)

// SQLRecorder is a gorm logger that records every statement it is shown,
// and its warnings. Install it with gorm.Config{Logger: rec} or
// db.Session(&gorm.Session{Logger: rec}).
type SQLRecorder struct {
	mu   sync.Mutex
	stmt []string
	warn []string
}

var _ logger.Interface = (*SQLRecorder)(nil)

// LogMode implements logger.Interface.
func (r *SQLRecorder) LogMode(logger.LogLevel) logger.Interface { return r }

// Info implements logger.Interface.
func (r *SQLRecorder) Info(context.Context, string, ...any) {}

// Warn implements logger.Interface: it records the warning.
func (r *SQLRecorder) Warn(_ context.Context, msg string, args ...any) {
	r.mu.Lock()
	r.warn = append(r.warn, fmt.Sprintf(msg, args...))
	r.mu.Unlock()
}

// Warnings returns the recorded warnings, oldest first.
func (r *SQLRecorder) Warnings() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.warn)
}

// Error implements logger.Interface.
func (r *SQLRecorder) Error(context.Context, string, ...any) {}

// Trace implements logger.Interface: it records the statement.
func (r *SQLRecorder) Trace(_ context.Context, _ time.Time, fc func() (string, int64), _ error) {
	s, _ := fc()
	r.mu.Lock()
	r.stmt = append(r.stmt, s)
	r.mu.Unlock()
}

// Statements returns the recorded statements, oldest first.
func (r *SQLRecorder) Statements() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.stmt)
}

// Reset forgets the recorded statements.
func (r *SQLRecorder) Reset() {
	r.mu.Lock()
	r.stmt = nil
	r.mu.Unlock()
}

// DDL returns the recorded statements that change a schema.
func (r *SQLRecorder) DDL() []string {
	return slices.DeleteFunc(r.Statements(), func(s string) bool {
		u := strings.ToUpper(strings.TrimSpace(s))
		return !slices.ContainsFunc([]string{"CREATE ", "ALTER ", "DROP ", "RENAME "}, func(p string) bool { return strings.HasPrefix(u, p) })
	})
}
