package testenv

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
)

// Logs collects the lines of a text slog.Logger, for tests that check what
// was logged. It is safe for concurrent use.
type Logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Logger returns a logger, at debug level and above, writing into l.
func (l *Logs) Logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// Write implements io.Writer.
func (l *Logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// Matching returns the lines that contain substr.
func (l *Logs) Matching(substr string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for line := range strings.Lines(l.buf.String()) {
		if strings.Contains(line, substr) {
			out = append(out, strings.TrimSuffix(line, "\n"))
		}
	}
	return out
}
