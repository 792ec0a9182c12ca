package pgnotify

import (
	"slices"
	"testing"
)

func TestSenderCoalesces(t *testing.T) {
	tr, err := New(Config{ConnString: "host=127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	s := tr.NewSender(SenderOptions{})
	s.NotifyBuckets([]int{5, 3, 5})
	s.NotifyBucket(3)
	if got := s.take(nil); !slices.Equal(got, []int{3, 5}) {
		t.Fatalf("take = %v; want [3 5] (duplicates coalesced, sorted)", got)
	}
	if got := s.take(nil); len(got) != 0 {
		t.Fatalf("second take = %v; want nothing", got)
	}
	for b := range maxPendingBuckets + 10 {
		s.NotifyBucket(b)
	}
	if got := s.take(nil); !slices.Equal(got, []int{-1}) {
		t.Fatalf("take after %d buckets = %d ids; want the single unknown hint -1", maxPendingBuckets+10, len(got))
	}
	s.NotifyBucket(2)
	s.NotifyCommitted()
	s.NotifyBucket(4)
	if got := s.take(nil); !slices.Equal(got, []int{-1}) {
		t.Fatalf("take after an unknown commit = %v; want [-1]", got)
	}
}
