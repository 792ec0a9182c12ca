package main

// Grouping and printing of parked rows (parked and discard).

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/gorm-outbox/outbox/relay"
)

// Display limits of the tables (-json prints everything in full).
const (
	maxKeyDisplay    = 64  // characters of a key's text or hex digits
	maxReasonDisplay = 160 // characters of a reason
)

// parkedGroup is the parked rows of one key in one bucket, or one row
// parked alone (keyless or corrupt).
type parkedGroup struct {
	Bucket int
	Alone  bool              // a keyless or corrupt row, which holds no other row
	Rows   []relay.ParkedRow // in id order
	// Head is the row whose reason and parked-at the group shows: the first
	// row not held behind another, else Rows[0] (the head went meanwhile).
	Head relay.ParkedRow
}

// isCorrupt reports whether r was parked because it cannot be decoded.
func isCorrupt(r relay.ParkedRow) bool { return strings.HasPrefix(r.Reason, relay.CorruptReasonPrefix) }

// groupParked groups rows (in ListParked's (bucket, id) order) per bucket
// and key, each row parked alone in a group of its own, in the order of the
// groups' first rows.
func groupParked(rows []relay.ParkedRow) []*parkedGroup {
	type groupKey struct {
		bucket int
		key    string
	}
	var groups []*parkedGroup
	index := map[groupKey]*parkedGroup{}
	for _, r := range rows {
		if r.Key == nil || isCorrupt(r) {
			groups = append(groups, &parkedGroup{Bucket: r.Bucket, Alone: true, Rows: []relay.ParkedRow{r}})
			continue
		}
		k := groupKey{r.Bucket, string(r.Key)}
		g := index[k]
		if g == nil {
			g = &parkedGroup{Bucket: r.Bucket}
			index[k] = g
			groups = append(groups, g)
		}
		g.Rows = append(g.Rows, r)
	}
	for _, g := range groups {
		i := slices.IndexFunc(g.Rows, func(r relay.ParkedRow) bool { return !strings.HasPrefix(r.Reason, relay.HeldReasonPrefix) })
		g.Head = g.Rows[max(i, 0)]
	}
	return groups
}

// oldest returns the earliest created-at of g's rows.
func (g *parkedGroup) oldest() time.Time {
	return slices.MinFunc(g.Rows, func(a, b relay.ParkedRow) int { return a.CreatedAt.Compare(b.CreatedAt) }).CreatedAt
}

// kind is "key", "keyless" or "corrupt".
func (g *parkedGroup) kind() string {
	switch {
	case isCorrupt(g.Rows[0]):
		return "corrupt"
	case g.Rows[0].Key == nil:
		return "keyless"
	}
	return "key"
}

// keyText returns key for display: (keyless) for nil, printable text
// Go-quoted ("order-17"), anything else as 0x followed by hex. With max > 0
// the text or the hex digits are cut to max characters ("aaaa"…, 0x00ff…).
func keyText(key []byte, max int) string {
	if key == nil {
		return "(keyless)"
	}
	if utf8.Valid(key) && !strings.ContainsFunc(string(key), func(r rune) bool { return !unicode.IsPrint(r) }) {
		s := string(key)
		if max > 0 && utf8.RuneCountInString(s) > max {
			return strconv.Quote(string([]rune(s)[:max])) + "…"
		}
		return strconv.Quote(s)
	}
	if max > 0 && 2*len(key) > max {
		return "0x" + hex.EncodeToString(key[:max/2]) + "…"
	}
	return "0x" + hex.EncodeToString(key)
}

// reasonText returns a reason on one line, cut to maxReasonDisplay
// characters.
func reasonText(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	if utf8.RuneCountInString(s) > maxReasonDisplay {
		s = string([]rune(s)[:maxReasonDisplay]) + "…"
	}
	return s
}

// age returns now-t, compactly: 45s, 12m30s, 5h07m, 3d04h. A time in the
// future (clocks apart) is 0s.
func age(now, t time.Time) string {
	d := max(now.Sub(t), 0)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d/time.Minute), int(d%time.Minute/time.Second))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
	}
	return fmt.Sprintf("%dd%02dh", int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour))
}

// seconds returns now-t in whole seconds, at least 0.
func seconds(now, t time.Time) int64 { return int64(max(now.Sub(t), 0) / time.Second) }

// writeGroupsTable writes one line per parked key and bucket, then the rows
// parked alone, then a summary; with hint, the commands that act on them.
func writeGroupsTable(w io.Writer, groups []*parkedGroup, now time.Time, hint bool) error {
	var keyed, alone []*parkedGroup
	rows := 0
	for _, g := range groups {
		rows += len(g.Rows)
		if g.Alone {
			alone = append(alone, g)
		} else {
			keyed = append(keyed, g)
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if len(keyed) > 0 {
		fmt.Fprintf(tw, "KEY\tBUCKET\tROWS\tFIRST ID\tOLDEST\tPARKED FOR\tREASON\n")
		for _, g := range keyed {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\t%s\n", keyText(g.Rows[0].Key, maxKeyDisplay), g.Bucket, len(g.Rows),
				g.Rows[0].ID, age(now, g.oldest()), age(now, g.Head.ParkedAt), reasonText(g.Head.Reason))
		}
	}
	if len(alone) > 0 {
		if len(keyed) > 0 {
			fmt.Fprintf(tw, "\n")
		}
		fmt.Fprintf(tw, "PARKED ALONE (keyless or corrupt)\n")
		fmt.Fprintf(tw, "ID\tBUCKET\tKEY\tAGE\tPARKED FOR\tREASON\n")
		for _, g := range alone {
			r := g.Rows[0]
			fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s\n", r.ID, r.Bucket, keyText(r.Key, maxKeyDisplay),
				age(now, r.CreatedAt), age(now, r.ParkedAt), reasonText(r.Reason))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\n%s parked: %s, %s alone.", plural(int64(rows), "row"), plural(int64(len(keyed)), "key"), plural(int64(len(alone)), "row"))
	if hint {
		fmt.Fprintf(w, " Requeue with outbox-relay requeue -id FIRST_ID (that key in that bucket) or -key/-key-hex KEY (every bucket); delete with outbox-relay discard … -confirm.")
	}
	_, err := fmt.Fprintln(w)
	return err
}

func writeRowsTable(w io.Writer, rows []relay.ParkedRow, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "ID\tMESSAGE ID\tBUCKET\tTOPIC\tKEY\tSIZE\tAGE\tPARKED FOR\tREASON\n")
	for _, r := range rows {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%d\t%s\t%s\t%s\n", r.ID, reasonText(r.MessageID), r.Bucket, r.Topic,
			keyText(r.Key, maxKeyDisplay), r.Size, age(now, r.CreatedAt), age(now, r.ParkedAt), reasonText(r.Reason))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\n%s parked.\n", plural(int64(len(rows)), "row"))
	return err
}

// groupJSON is a parked key of a bucket, or a row parked alone, in -json.
type groupJSON struct {
	Kind   string `json:"kind"` // key, keyless or corrupt (the last two are one row)
	Bucket int    `json:"bucket"`
	// KeyBase64 is the key (null when keyless); Key the same as text when it
	// is valid UTF-8, else null.
	KeyBase64        []byte    `json:"key_base64"`
	Key              *string   `json:"key"`
	Rows             int       `json:"rows"`
	FirstID          int64     `json:"first_id"`
	IDs              []int64   `json:"ids"`
	OldestCreatedAt  time.Time `json:"oldest_created_at"`
	OldestAgeSeconds int64     `json:"oldest_age_seconds"`
	// HeadID, ParkedAt, ParkedSeconds and Reason are the head row's.
	HeadID        int64     `json:"head_id"`
	ParkedAt      time.Time `json:"parked_at"`
	ParkedSeconds int64     `json:"parked_seconds"`
	Reason        string    `json:"reason"`
}

// rowJSON is a parked row in -json -rows.
type rowJSON struct {
	ID            int64     `json:"id"`
	MessageID     string    `json:"message_id"`
	Bucket        int       `json:"bucket"`
	Topic         string    `json:"topic"`
	KeyBase64     []byte    `json:"key_base64"`
	Key           *string   `json:"key"`
	Size          int       `json:"size"`
	CreatedAt     time.Time `json:"created_at"`
	AgeSeconds    int64     `json:"age_seconds"`
	ParkedAt      time.Time `json:"parked_at"`
	ParkedSeconds int64     `json:"parked_seconds"`
	Reason        string    `json:"reason"`
}

// jsonKey returns key as text for -json, as it is, unquoted; nil when
// keyless or not valid UTF-8 (key_base64 has every key).
func jsonKey(key []byte) *string {
	if key == nil || !utf8.Valid(key) {
		return nil
	}
	s := string(key)
	return &s
}

func writeGroupsJSON(w io.Writer, groups []*parkedGroup, now time.Time) error {
	enc := json.NewEncoder(w)
	for _, g := range groups {
		o := groupJSON{
			Kind: g.kind(), Bucket: g.Bucket, KeyBase64: g.Rows[0].Key, Key: jsonKey(g.Rows[0].Key),
			Rows: len(g.Rows), FirstID: g.Rows[0].ID,
			OldestCreatedAt: g.oldest().UTC(), OldestAgeSeconds: seconds(now, g.oldest()),
			HeadID: g.Head.ID, ParkedAt: g.Head.ParkedAt.UTC(), ParkedSeconds: seconds(now, g.Head.ParkedAt), Reason: g.Head.Reason,
		}
		for _, r := range g.Rows {
			o.IDs = append(o.IDs, r.ID)
		}
		if err := enc.Encode(o); err != nil {
			return err
		}
	}
	return nil
}

func writeRowsJSON(w io.Writer, rows []relay.ParkedRow, now time.Time) error {
	enc := json.NewEncoder(w)
	for _, r := range rows {
		if err := enc.Encode(rowJSON{
			ID: r.ID, MessageID: r.MessageID, Bucket: r.Bucket, Topic: r.Topic,
			KeyBase64: r.Key, Key: jsonKey(r.Key), Size: r.Size,
			CreatedAt: r.CreatedAt.UTC(), AgeSeconds: seconds(now, r.CreatedAt),
			ParkedAt: r.ParkedAt.UTC(), ParkedSeconds: seconds(now, r.ParkedAt), Reason: r.Reason,
		}); err != nil {
			return err
		}
	}
	return nil
}
