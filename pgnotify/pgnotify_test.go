package pgnotify_test

// The tests that need no database; those that listen on PostgreSQL are in
// internal/tests/pgnotify.

import (
	"slices"
	"strings"
	"testing"

	"github.com/gorm-outbox/outbox/pgnotify"
)

func TestEncodeDecode(t *testing.T) {
	cases := []struct {
		in   []int
		want string
	}{
		{[]int{3}, "3"},
		{[]int{3, 5, 3}, "3,5,3"},
		{nil, "-1"},
		{[]int{2, -1}, "-1"},
	}
	for _, c := range cases {
		if got := pgnotify.Encode(c.in); got != c.want {
			t.Errorf("Encode(%v) = %q; want %q", c.in, got, c.want)
		}
	}
	big := make([]int, 5000)
	for i := range big {
		big[i] = 60000 + i
	}
	if got := pgnotify.Encode(big); got != "-1" {
		t.Errorf("Encode(5000 buckets) = %d bytes; want the unknown hint -1", len(got))
	}
	if got := pgnotify.Decode("1, 7,x,-5"); !slices.Equal(got, []int{1, 7, -1, -1}) {
		t.Errorf("Decode = %v; want [1 7 -1 -1] (malformed parts become unknown)", got)
	}
}

func TestNewValidatesConfig(t *testing.T) {
	for _, c := range []struct {
		cfg  pgnotify.Config
		want string
	}{
		{pgnotify.Config{}, "ConnString"},
		{pgnotify.Config{ConnString: "host=x", Channel: "Bad-Name"}, "Channel"},
		{pgnotify.Config{ConnString: "host=x", Channel: "x; drop"}, "Channel"},
	} {
		if _, err := pgnotify.New(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v) = %v; want an error naming %s", c.cfg, err, c.want)
		}
	}
}
