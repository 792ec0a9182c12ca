// Package logrepeat bounds the log lines of failures that repeat.
//
// A Limiter lets the first occurrence of each failure through at WARN, then
// the same failure (the same operation failing with the same kind of error)
// at most once per interval, with the number of occurrences in between; the
// others go to DEBUG, so that an outage's retries do not bury its first line.
//
// An error's kind is its text with every run of hexadecimal digits and
// dashes that holds a decimal digit read as "#", so that an outage's
// attempts from many connections, buckets and ids count as one failure.
package logrepeat

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"
	"unicode"
)

// Interval is the default spacing of a repeated failure's WARN lines.
const Interval = time.Minute

// maxCauses bounds the failures a Limiter remembers; past it, the one
// logged longest ago is forgotten (its next occurrence logs at WARN).
const maxCauses = 256

type key struct{ op, kind string }

type entry struct {
	logged   time.Time // last WARN line
	repeated int       // occurrences since, logged at DEBUG
}

type streak struct {
	first    time.Time
	failures int
}

// A Limiter decides the level of each failure's log line. Its zero value
// is not usable; call New. It is safe for concurrent use.
type Limiter struct {
	every time.Duration

	mu      sync.Mutex
	seen    map[key]*entry
	streaks map[string]*streak
}

// New returns a Limiter that logs a repeated failure at WARN at most once
// per every (Interval when every is not positive).
func New(every time.Duration) *Limiter {
	if every <= 0 {
		every = Interval
	}
	return &Limiter{every: every, seen: map[key]*entry{}, streaks: map[string]*streak{}}
}

// Failure records that op failed with err at now and returns the level of
// its line: WARN for the first occurrence of this op and kind of error
// and once per interval after it, DEBUG otherwise. repeated is the number of
// occurrences logged at DEBUG since the previous WARN line (0 on a first
// occurrence); log it with a WARN line.
func (l *Limiter) Failure(op string, err error, now time.Time) (level slog.Level, repeated int) {
	k := key{op: op}
	if err != nil {
		k.kind = kind(err.Error())
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.streaks[op]
	if s == nil {
		s = &streak{first: now}
		l.streaks[op] = s
	}
	s.failures++
	e := l.seen[k]
	if e == nil {
		if len(l.seen) >= maxCauses {
			l.forgetOldest()
		}
		l.seen[k] = &entry{logged: now}
		return slog.LevelWarn, 0
	}
	if now.Sub(e.logged) >= l.every {
		repeated = e.repeated
		e.logged, e.repeated = now, 0
		return slog.LevelWarn, repeated
	}
	e.repeated++
	return slog.LevelDebug, 0
}

// Recovered records that op succeeded: its failures are forgotten, so the
// next one logs at WARN at once. It returns how many failures the streak
// that ended had and when it began; failures is 0 when op was not failing.
func (l *Limiter) Recovered(op string) (failures int, since time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.streaks[op]
	if s == nil {
		return 0, time.Time{}
	}
	delete(l.streaks, op)
	for k := range l.seen {
		if k.op == op {
			delete(l.seen, k)
		}
	}
	return s.failures, s.first
}

// Log logs a failure of op that is retried, at the level Failure gives
// it, with the repeats in between ("repeated") and the error last.
func (l *Limiter) Log(ctx context.Context, log *slog.Logger, now time.Time, op, msg string, err error, args ...any) {
	level, repeated := l.Failure(op, err, now)
	if repeated > 0 {
		args = append(args, "repeated", repeated)
	}
	log.Log(ctx, level, msg, append(args, "error", err)...)
}

// LogRecovered ends op's failures, if it was failing, with one INFO line:
// msg, args, the failures counted and how long op failed.
func (l *Limiter) LogRecovered(ctx context.Context, log *slog.Logger, now time.Time, op, msg string, args ...any) {
	if n, since := l.Recovered(op); n > 0 {
		log.InfoContext(ctx, msg, append(args, "failures", n, "failing_for", now.Sub(since))...)
	}
}

// kind returns text with each run of hexadecimal digits and dashes that
// holds a decimal digit (a port, an address's parts, a count, an id)
// replaced by "#".
func kind(text string) string {
	var b strings.Builder
	for i := 0; i < len(text); {
		j, digit := i, false
		for ; j < len(text) && (unicode.Is(unicode.ASCII_Hex_Digit, rune(text[j])) || text[j] == '-'); j++ {
			digit = digit || '0' <= text[j] && text[j] <= '9'
		}
		if j == i {
			j++ // not in a run: kept
		}
		if digit {
			b.WriteByte('#')
		} else {
			b.WriteString(text[i:j])
		}
		i = j
	}
	return b.String()
}

func (l *Limiter) forgetOldest() {
	var oldest key
	var at time.Time
	for k, e := range l.seen {
		if at.IsZero() || e.logged.Before(at) {
			oldest, at = k, e.logged
		}
	}
	delete(l.seen, oldest)
}
