package gormstore_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

// TestNextBatchKeepsEveryValueApart: the hand-scanned batch keeps nil and
// empty keys and values apart (a nil Value is a tombstone), copies each
// row's bytes (no row aliases another's or the driver's buffer, also past
// the arena's block size), and decodes headers and partitions.
func TestNextBatchKeepsEveryValueApart(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db := o.Open(t, nil)
			cfg := outbox.Config{BucketCount: 8}
			if err := outbox.AutoMigrate(db, cfg); err != nil {
				t.Fatal(err)
			}
			p := int32(3)
			var want []*outbox.Message
			add := func(key, value []byte, h outbox.Headers, part *int32) {
				m := pendingMessage(0)
				m.Key, m.Value, m.Headers, m.Partition = key, value, h, part
				want = append(want, m)
			}
			add(nil, nil, nil, nil)
			add([]byte{}, []byte{}, nil, nil)
			add([]byte("k"), []byte("v"), outbox.Headers{{Key: "a", Value: []byte("1")}, {Key: "b"}}, &p)
			for i := range 300 {
				add(fmt.Appendf(nil, "key-%d", i), bytes.Repeat([]byte{byte(i)}, 100+i*7), nil, nil)
			}
			add([]byte("big"), bytes.Repeat([]byte("x"), 100_000), nil, nil)
			if err := raw(db).Table(cfg.MessagesTableName()).CreateInBatches(want, 100).Error; err != nil {
				t.Fatal(err)
			}
			store, err := gormstore.New(db, gormstore.Options{Config: cfg})
			if err != nil {
				t.Fatal(err)
			}
			got, err := nextBatch(context.Background(), store, 0, 1000, 0)
			if err != nil || len(got) != len(want) {
				t.Fatalf("NextBatch = %d rows, %v; want %d", len(got), err, len(want))
			}
			for i, g := range got {
				w := want[i]
				if g.ID != w.ID || g.MessageID != w.MessageID || g.Topic != w.Topic || g.Bucket != 0 ||
					!bytes.Equal(g.Key, w.Key) || (g.Key == nil) != (w.Key == nil) ||
					!bytes.Equal(g.Value, w.Value) || (g.Value == nil) != (w.Value == nil) ||
					len(g.Headers) != len(w.Headers) || g.CreatedAt.Sub(w.CreatedAt).Abs() > time.Second {
					t.Fatalf("row %d = %+v; want %+v", i, g, w)
				}
				for j := range w.Headers {
					if g.Headers[j].Key != w.Headers[j].Key || !bytes.Equal(g.Headers[j].Value, w.Headers[j].Value) {
						t.Fatalf("row %d header %d = %+v; want %+v", i, j, g.Headers[j], w.Headers[j])
					}
				}
				if (g.Partition == nil) != (w.Partition == nil) || g.Partition != nil && *g.Partition != *w.Partition {
					t.Fatalf("row %d partition = %v; want %v", i, g.Partition, w.Partition)
				}
				if len(g.Value) > 0 && cap(g.Value) != len(g.Value) {
					t.Fatalf("row %d: value has spare capacity %d: an append would overwrite the next row", i, cap(g.Value)-len(g.Value))
				}
			}
		})
	}
}

// TestNextBatchBoundedInBytes: the batch stops after the row that takes it past
// maxBytes (by relay.MessageSize; that row included, as
// relay.Store.NextBatch asks, so the relay can tell a batch cut by size
// from a drained bucket), holds at least one row however large, and
// maxBytes <= 0 means rows only.
func TestNextBatchBoundedInBytes(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db := o.Open(t, nil)
			cfg := outbox.Config{BucketCount: 8}
			if err := outbox.AutoMigrate(db, cfg); err != nil {
				t.Fatal(err)
			}
			rows := make([]*outbox.Message, 10)
			for i := range rows {
				rows[i] = pendingMessage(0)
				rows[i].Key = []byte("kk")       // 2
				rows[i].Value = make([]byte, 98) // 98: 100 a row
			}
			rows[5].Value = make([]byte, 998) // 1000
			if err := raw(db).Table(cfg.MessagesTableName()).Create(rows).Error; err != nil {
				t.Fatal(err)
			}
			store, err := gormstore.New(db, gormstore.Options{Config: cfg})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			for _, c := range []struct {
				limit    int
				maxBytes int64
				want     int
			}{
				{10, 0, 10}, {10, -1, 10}, {3, 1 << 20, 3},
				{10, 250, 3}, {10, 300, 4}, {10, 99, 1}, {10, 1, 1},
				{10, 1400, 6}, {10, 1499, 6}, {10, 1500, 7}, {10, 1599, 7}, {10, 1600, 8},
			} {
				got, err := nextBatch(ctx, store, 0, c.limit, c.maxBytes)
				if err != nil || len(got) != c.want {
					t.Errorf("NextBatch(limit %d, maxBytes %d) = %d rows, %v; want %d", c.limit, c.maxBytes, len(got), err, c.want)
				}
			}
			// At least one row, however large.
			if err := store.MarkPublished(ctx, rows[:5]); err != nil {
				t.Fatal(err)
			}
			if got, err := nextBatch(ctx, store, 0, 10, 10); err != nil || len(got) != 1 || got[0].ID != rows[5].ID {
				t.Errorf("NextBatch(maxBytes 10) at a 1000-byte head = %d rows, %v; want that row alone", len(got), err)
			}
		})
	}
}
