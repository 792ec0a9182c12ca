package chaos

import "testing"

// TestUnexplainedOrderViolationsAllowOnlyABatchPublishedAgain checks the
// transactional checker's rule: a copy may restart a key's sequence at an
// earlier row (a batch committed to Kafka but not deleted, published again
// by the bucket's next owner) if the copies run on consecutively up to the
// newest row delivered before any newer row; a late copy of an older row
// after newer ones (what fencing prevents), a restarted run that skips a
// row, or one that never completes, is a violation.
func TestUnexplainedOrderViolationsAllowOnlyABatchPublishedAgain(t *testing.T) {
	perKey := map[string][]string{"a": {"a1", "a2", "a3", "a4", "a5", "a6"}, "b": {"b1", "b2"}}
	stream := func(ids ...string) [][]Record {
		var p []Record
		for _, id := range ids {
			p = append(p, Record{ID: id, Key: id[:1]})
		}
		return [][]Record{p}
	}
	cases := []struct {
		name string
		ids  []string
		want int
	}{
		{"in order", []string{"a1", "a2", "b1", "a3", "b2", "a4", "a5", "a6"}, 0},
		{"a batch published again, then newer rows", []string{"a1", "a2", "a3", "a1", "a2", "a3", "a4", "a5", "a6"}, 0},
		{"the undeleted suffix published again", []string{"a1", "a2", "a3", "a4", "a3", "a4", "a5", "a6"}, 0},
		{"published again twice (a second crash mid-replay)", []string{"a1", "a2", "a3", "a2", "a2", "a3", "a4", "a5", "a6"}, 0},
		{"only the newest row again", []string{"a1", "a2", "a2", "a3", "a4", "a5", "a6"}, 0},
		{"other keys interleave with the replay", []string{"a1", "a2", "a1", "b1", "a2", "b2", "a3", "a4", "a5", "a6"}, 0},
		{"rows outside the ledger are ignored", []string{"a1", "x9", "a2", "a3", "a4", "a5", "a6"}, 0},
		{"a zombie's late copy after newer rows", []string{"a1", "a2", "a3", "a4", "a2", "a3", "a5", "a6"}, 1},
		{"a zombie's late copy at the end", []string{"a1", "a2", "a3", "a4", "a5", "a6", "a2", "a3"}, 1},
		{"a restarted run that skips a row", []string{"a1", "a2", "a3", "a4", "a1", "a3", "a4", "a5", "a6"}, 1},
		{"late copies on two keys", []string{"a1", "a2", "b1", "b2", "a1", "b1", "a3", "a4", "a5", "a6"}, 2},
	}
	for _, c := range cases {
		if got := unexplainedOrderViolations(stream(c.ids...), perKey); got != c.want {
			t.Errorf("%s %v: %d; want %d", c.name, c.ids, got, c.want)
		}
	}
}
