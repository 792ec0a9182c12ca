package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"
)

// TestGormLoggerLeavesStoreErrorsToTheRelay: a failed statement is not
// logged by gorm (the relay reports store errors once, with context), and a
// slow statement is logged without its bound values.
func TestGormLoggerLeavesStoreErrorsToTheRelay(t *testing.T) {
	var buf bytes.Buffer
	l := newGormLogger(slog.New(slog.NewTextHandler(&buf, nil)))
	sql := func() (string, int64) { return "SELECT * FROM outbox_messages WHERE bucket = 'payload-secret'", 0 }

	l.Trace(context.Background(), time.Now(), sql, errors.New("no such table: outbox_messages"))
	if buf.Len() != 0 {
		t.Errorf("failed statement logged: %s", buf.String())
	}

	l.Trace(context.Background(), time.Now().Add(-time.Minute), func() (string, int64) {
		return "SELECT * FROM outbox_messages WHERE bucket = ?", 0
	}, nil)
	if !strings.Contains(buf.String(), "level=WARN") || !strings.Contains(buf.String(), "trace.duration=60000") {
		t.Errorf("slow statement not logged: %q", buf.String())
	}
	pf, ok := l.(gorm.ParamsFilter)
	if !ok {
		t.Fatalf("%T does not filter parameters; slow statements would show their values", l)
	}
	if _, vars := pf.ParamsFilter(context.Background(), "SELECT ?", "payload-secret"); vars != nil {
		t.Errorf("ParamsFilter kept the values %v", vars)
	}
}
