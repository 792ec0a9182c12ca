package gormstore

import (
	"cmp"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/gorm-outbox/outbox"
	"github.com/jackc/pgx/v5/pgtype"
)

// Deleting by location (PostgreSQL)
//
// nextBatch and NextBatches also read each row's ctid, which the store
// remembers (rowLocations) until MarkPublished deletes the row by a TID
// lookup (deleteByLocation), whose plan does not depend on statistics: on
// those of a drained table, a delete by id's generic plan scanned the
// whole bucket index once per id. A row no longer at its location, or not
// read by this Store, is deleted by id.

// rowLocationsPerGeneration bounds the locations remembered: a generation
// holds at most this many and the store keeps two, so rows read but never
// deleted are forgotten.
const rowLocationsPerGeneration = 1 << 16

// rowLocations maps the ids of rows read to their ctid (block << 16 |
// offset).
type rowLocations struct {
	mu        sync.Mutex
	cur, prev map[int64]int64
}

// put remembers the location of each of msgs (tids[i] for msgs[i]).
func (l *rowLocations) put(msgs []*outbox.Message, tids []int64) {
	if len(msgs) == 0 || len(tids) != len(msgs) {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cur == nil || len(l.cur) >= rowLocationsPerGeneration {
		l.prev, l.cur = l.cur, make(map[int64]int64, len(msgs))
	}
	for i, m := range msgs {
		l.cur[m.ID] = tids[i]
	}
}

// take returns the location of each of ids (in their order) and forgets
// them; nil when one of them is not known.
func (l *rowLocations) take(ids []int64) []int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	tids := make([]int64, len(ids))
	all := true
	for i, id := range ids {
		t, ok := l.cur[id]
		if ok {
			delete(l.cur, id)
		} else if t, ok = l.prev[id]; ok {
			delete(l.prev, id)
		}
		tids[i], all = t, all && ok
	}
	if !all {
		return nil
	}
	return tids
}

// tidCol scans "ctid::text", "(block,offset)", into block << 16 | offset.
type tidCol struct{ v int64 }

func (c *tidCol) Scan(src any) error {
	if b, ok := src.([]byte); ok { // lib/pq; pgx gives a string
		src = string(b)
	}
	var t pgtype.TID
	if err := t.Scan(src); err != nil || !t.Valid {
		return fmt.Errorf("ctid %v: %w", src, cmp.Or(err, errors.New("NULL")))
	}
	c.v = int64(t.BlockNumber)<<16 | int64(t.OffsetNumber)
	return nil
}

// tidsArray is tids as a PostgreSQL tid[] literal: {"(1,2)","(3,4)"}.
func tidsArray(tids []int64) string {
	b := make([]byte, 0, 2+len(tids)*12)
	b = append(b, '{')
	for i, t := range tids {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"', '(')
		b = strconv.AppendInt(b, t>>16, 10)
		b = append(b, ',')
		b = strconv.AppendInt(b, t&0xffff, 10)
		b = append(b, ')', '"')
	}
	b = append(b, '}')
	return string(b)
}
