package chaos

import (
	"testing"
	"time"
)

// TestLongestGapSpansTheWindowEdges checks the stall measure: gaps between
// consecutive acknowledgements inside the window count, and so do the time
// from the window's start to the first acknowledgement and from the last
// one to the window's end; times outside the window do not.
func TestLongestGapSpansTheWindowEdges(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	cases := []struct {
		name     string
		ts       []time.Time
		from, to time.Time
		want     time.Duration
	}{
		{"gap between acknowledgements", []time.Time{at(0), at(100), at(900), at(1000)}, at(0), at(1000), 800 * time.Millisecond},
		{"from the fault to the first acknowledgement", []time.Time{at(-50), at(700), at(800)}, at(0), at(800), 700 * time.Millisecond},
		{"from the last acknowledgement to the end", []time.Time{at(100), at(200)}, at(0), at(1000), 800 * time.Millisecond},
		{"none in the window", []time.Time{at(-10), at(2000)}, at(0), at(500), 500 * time.Millisecond},
	}
	for _, c := range cases {
		if got := longestGap(c.ts, c.from, c.to); got != c.want {
			t.Errorf("%s: longestGap = %v; want %v", c.name, got, c.want)
		}
	}
}

// TestRelayArgsCarryThePublishTimeout checks that a relay child gets the
// publish timeout its RelayConfig names (and the default when zero).
func TestRelayArgsCarryThePublishTimeout(t *testing.T) {
	for _, want := range []time.Duration{0, 5 * time.Second} {
		c := RelayConfig{Dialect: Postgres, DSN: "dsn", Brokers: []string{"a:1", "b:2"}, RelayID: "r", PublishTimeout: want}
		args := c.Args()
		got, err := ParseRelayArgs(args[1:])
		if err != nil {
			t.Fatalf("ParseRelayArgs(%q): %v", args, err)
		}
		if got.PublishTimeout != want || len(got.Brokers) != 2 {
			t.Errorf("ParseRelayArgs(Args()) = publish timeout %v, brokers %q; want %v and 2 brokers", got.PublishTimeout, got.Brokers, want)
		}
	}
}
