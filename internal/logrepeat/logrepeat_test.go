package logrepeat

import (
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// TestAnHourOfOneFailureLogsOncePerMinute: a failure repeated every second
// for an hour gives 60 WARN lines, each after the first carrying the 59
// occurrences logged at DEBUG since the previous one.
func TestAnHourOfOneFailureLogsOncePerMinute(t *testing.T) {
	l := New(time.Minute)
	err := errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")
	warns := 0
	for i := range 3600 {
		level, repeated := l.Failure("renew", err, t0.Add(time.Duration(i)*time.Second))
		if level != slog.LevelWarn {
			if repeated != 0 {
				t.Fatalf("DEBUG occurrence %d reports repeated=%d", i, repeated)
			}
			continue
		}
		warns++
		want := 59
		if i == 0 {
			want = 0
		}
		if repeated != want {
			t.Fatalf("WARN at second %d: repeated=%d, want %d", i, repeated, want)
		}
	}
	if warns != 60 {
		t.Fatalf("%d WARN lines in an hour; want 60", warns)
	}
}

// TestANewKindOfErrorIsLoggedAtOnce: another kind of error of the same
// operation, or the same error of another operation, is a new failure.
func TestANewKindOfErrorIsLoggedAtOnce(t *testing.T) {
	l := New(time.Minute)
	refused, reset := errors.New("connection refused"), errors.New("connection reset")
	for i, c := range []struct {
		op   string
		err  error
		want slog.Level
	}{
		{"renew", refused, slog.LevelWarn},
		{"renew", refused, slog.LevelDebug},
		{"renew", reset, slog.LevelWarn},
		{"acquire", refused, slog.LevelWarn},
		{"renew", reset, slog.LevelDebug},
	} {
		if got, _ := l.Failure(c.op, c.err, t0.Add(time.Duration(i)*time.Second)); got != c.want {
			t.Errorf("occurrence %d (%s, %v): level %v, want %v", i, c.op, c.err, got, c.want)
		}
	}
}

// TestErrorsDifferingInNumbersAreOneKind: a broker's errors that differ
// only in the local port of each connection, a bucket number or a message
// id are one failure, logged at WARN once within the interval; another
// kind of error of the same outage still logs at once.
func TestErrorsDifferingInNumbersAreOneKind(t *testing.T) {
	l := New(time.Minute)
	for i, c := range []struct {
		err  string
		want slog.Level
	}{
		{"relay: bucket 3: write tcp 127.0.0.1:54012->127.0.0.1:9092: i/o timeout", slog.LevelWarn},
		{"relay: bucket 3: write tcp 127.0.0.1:54013->127.0.0.1:9092: i/o timeout", slog.LevelDebug},
		{"relay: bucket 12: write tcp 127.0.0.1:60001->127.0.0.1:9092: i/o timeout", slog.LevelDebug},
		{"relay: bucket 12: write tcp [::1]:40122->[::1]:9092: i/o timeout", slog.LevelWarn},
		{"relay: bucket 5: write tcp [::1]:40123->[::1]:9092: i/o timeout", slog.LevelDebug},
		{"dial tcp 127.0.0.1:9092: connect: connection refused", slog.LevelWarn},
		{"dial tcp 10.0.3.17:9092: connect: connection refused", slog.LevelDebug},
		{"kafkapub: publish message 0c6f2d1e-9a4b-4c8d-bead-fade00c0ffee to t[0]: [7] Request Timed Out", slog.LevelWarn},
		{"kafkapub: publish message dead2d1e-face-4c8d-9e1f-3b5a7c9d1e2f to t[2]: [7] Request Timed Out", slog.LevelDebug},
		{"kafkapub: publish message 0c6f2d1e-9a4b-4c8d-bead-fade00c0ffee to t[0]: [6] Not Leader For Partition", slog.LevelWarn},
		{"context deadline exceeded", slog.LevelWarn},
	} {
		if got, _ := l.Failure("publish", errors.New(c.err), t0.Add(time.Duration(i)*time.Second)); got != c.want {
			t.Errorf("occurrence %d (%s): level %v, want %v", i, c.err, got, c.want)
		}
	}
}

// TestRecoveryEndsTheStreak: Recovered reports the streak's failures and
// start, and the operation's next failure logs at WARN again (a new
// outage is a new story); another operation's streak is untouched.
func TestRecoveryEndsTheStreak(t *testing.T) {
	l := New(time.Minute)
	err := errors.New("down")
	for i := range 5 {
		l.Failure("renew", err, t0.Add(time.Duration(i)*time.Second))
	}
	l.Failure("acquire", err, t0)
	n, since := l.Recovered("renew")
	if n != 5 || !since.Equal(t0) {
		t.Fatalf("Recovered = %d, %v; want 5, %v", n, since, t0)
	}
	if n, _ := l.Recovered("renew"); n != 0 {
		t.Fatalf("second Recovered = %d; want 0", n)
	}
	if level, _ := l.Failure("renew", err, t0.Add(6*time.Second)); level != slog.LevelWarn {
		t.Fatalf("first failure after recovery logged at %v; want WARN", level)
	}
	if level, _ := l.Failure("acquire", err, t0.Add(6*time.Second)); level != slog.LevelDebug {
		t.Fatalf("acquire's streak was reset by renew's recovery (level %v)", level)
	}
}

// TestDistinctCausesAreBounded: errors whose text varies without end do
// not grow the Limiter past its bound.
func TestDistinctCausesAreBounded(t *testing.T) {
	l := New(time.Minute)
	for i := range 10 * maxCauses {
		noDigits := strings.Map(func(r rune) rune { return 'g' + r - '0' }, strconv.Itoa(i)) // one kind each
		l.Failure("publish", fmt.Errorf("topic %s", noDigits), t0.Add(time.Duration(i)*time.Millisecond))
	}
	if len(l.seen) > maxCauses {
		t.Fatalf("%d causes remembered; bound is %d", len(l.seen), maxCauses)
	}
}
